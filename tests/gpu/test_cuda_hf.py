"""On a CUDA machine: a Hugging Face Transformers model (a tiny Llama) through ``spotray train`` on every visible
GPU in bf16, with DDP and FSDP2, from a fresh init (``model.hf.config``) and from ``save_pretrained`` weights
(``model.hf.pretrained``). Skipped without CUDA."""

from __future__ import annotations

import json
from typing import TypedDict

import pytest
import torch

from spotray.data.dataset import TokenDataset
from spotray.driver import launch
from tests.gpu.configs import assert_learns, gpu_config, losses

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


class LlamaShape(TypedDict):
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int


LLAMA_SHAPE: LlamaShape = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 320,
                           "max_position_embeddings": 64}
LLAMA = {"model_type": "llama", **LLAMA_SHAPE}
INLINE = f"model.hf.config={json.dumps(LLAMA)}"


@pytest.fixture(scope="module")
def fresh(dataset_url, tmp_path_factory) -> dict:
    """40 bf16 steps of the Llama from its inline config, for each parallelism."""
    root = str(tmp_path_factory.mktemp("hf"))
    return {parallel: launch.run(gpu_config(dataset_url, root, f"llama-{parallel}", INLINE, f"parallel={parallel}"),
                                 worker_logs=False) for parallel in ("ddp", "fsdp")}


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_transformers_llama_learns_in_bf16_on_every_gpu(parallel, fresh):
    summary = fresh[parallel]
    assert_learns(summary)
    assert summary["samples_consumed"] == 40 * 12 * torch.cuda.device_count() and summary["tokens_per_s"] > 0


def test_ddp_and_fsdp_train_the_llama_alike(fresh):
    ddp, fsdp = losses(fresh["ddp"]), losses(fresh["fsdp"])
    assert sum(ddp[s] for s in range(36, 41)) / 5 == pytest.approx(sum(fsdp[s] for s in range(36, 41)) / 5, rel=0.05)


def save_trained_llama(dataset_url: str, directory) -> float:
    """A ``LlamaForCausalLM`` trained briefly on the corpus by plain PyTorch, saved with ``save_pretrained``;
    returns its last training loss."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA_SHAPE)).cuda()  # type: ignore[call-arg]  # typeshed @wraps: no self
    data = TokenDataset.open(dataset_url, 32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(60):
        batch = data.batch(range(16 * step, 16 * step + 16)).cuda()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(directory)
    return loss.item()


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_training_starts_from_save_pretrained_weights(parallel, fresh, dataset_url, tmp_path):
    pretrained_loss = save_trained_llama(dataset_url, tmp_path / "llama")
    assert pretrained_loss < 2.0  # about 1.2 on CPU, against about 5.8 for a fresh init
    summary = launch.run(gpu_config(dataset_url, str(tmp_path / "ckpt"), "from-pretrained", f"parallel={parallel}",
                                    f"model.hf.pretrained={tmp_path / 'llama'}", "train.max_steps=10"),
                         worker_logs=False)
    curve, fresh_start = losses(summary), losses(fresh[parallel])[1]
    assert summary["final_step"] == 10
    assert curve[1] < fresh_start - 2.0, f"step 1 at {curve[1]:.3f}: the pretrained weights were not loaded"
    assert curve[1] == pytest.approx(pretrained_loss, abs=0.5)

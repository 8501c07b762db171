"""Hugging Face Transformers models keep spotray's guarantees: tiny Llama and GPT-2 on 2 gloo workers. (Without
dropout: 1 and 2 workers draw different dropout masks, so only dropout-free losses can agree across world sizes.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spotray.drills.process_group import run_on_process_group
from spotray.driver import launch
from spotray.errors import ConfigError
from tests.repo import REPO
from tests.training.configs import make_config
from tests.training.runs import train_locally as train
from tests.training.worker.test_resume import SAME_TRAINING_TOL, assert_losses_close, losses

TINY = {
    "llama": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 320, "max_position_embeddings": 64},
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 320, "n_positions": 64,
             "bos_token_id": 0, "eos_token_id": 0, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
}


def hf_config(dataset_url: str, root, name: str, arch: str, *overrides: str):
    return make_config(dataset_url, str(root), name, "train.max_steps=20", *overrides,
                       model={"hf": {"config": TINY[arch]}})


# GPT-2's runs are slow: Llama's check the same guarantees in make test, and so does the pretrained test's GPT-2 case
# (FSDP on GPT-2's blocks).
@pytest.fixture(scope="module", params=["llama", "gpt2"])
def runs(request, dataset_url, tmp_path_factory):
    """Per architecture: straight 20-step runs (DDP, FSDP) and runs stopped at step 10 (audited for FSDP)."""
    arch, root = request.param, tmp_path_factory.mktemp(request.param)
    out = {"arch": arch, "root": root}
    for parallel in ("ddp", "fsdp"):
        out[parallel] = train(hf_config(dataset_url, root, parallel, arch, f"parallel={parallel}"))
        stopped = hf_config(dataset_url, root / "stopped", parallel, arch, f"parallel={parallel}",
                            "train.stop_at_step=10", f"audit_dir={root / 'audit' / parallel}")
        assert train(stopped)["final_step"] == 10
    shutil.copytree(root / "stopped", root / "elastic" / "ckpt")  # resumed by two tests in two ways
    shutil.copytree(root / "audit" / "fsdp", root / "elastic" / "audit")
    return out


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
@pytest.mark.e2e
def test_stop_and_resume_is_bitwise_identical(runs, parallel, dataset_url):
    cfg = hf_config(dataset_url, runs["root"] / "stopped", parallel, runs["arch"], f"parallel={parallel}")
    resumed = train(cfg)
    assert resumed["final_step"] == 20
    assert resumed["param_sha256"] == runs[parallel]["param_sha256"]
    assert losses(resumed) == losses(runs[parallel])


def test_ddp_and_fsdp_losses_match(runs):
    assert_losses_close(losses(runs["ddp"]), losses(runs["fsdp"]), SAME_TRAINING_TOL)


def test_elastic_resume_2_to_1_worker_reshards_and_consumes_every_sample_once(runs, dataset_url):
    elastic = runs["root"] / "elastic"
    cfg = hf_config(dataset_url, elastic / "ckpt", "fsdp", runs["arch"], "parallel=fsdp", "scaling.num_workers=1",
                    f"audit_dir={elastic / 'audit'}")
    summary = train(cfg)
    assert summary["audit"] == {"exactly_once": True, "samples": 20 * 12, "duplicates": 0, "missing_steps": []}
    assert_losses_close(losses(summary), losses(runs["fsdp"]), SAME_TRAINING_TOL)


def test_a_model_vocabulary_smaller_than_the_datasets_stops_with_both_sizes(dataset_url, tmp_path):
    small = {**TINY["llama"], "vocab_size": 100}
    with pytest.raises(ConfigError, match=r"model.hf.*vocabulary has 100 tokens.*tokenizer 257"):
        launch.preflight(make_config(dataset_url, str(tmp_path), "v", model={"hf": {"config": small}}))
    assert not (tmp_path / "v").exists()


def test_a_tokenizer_without_an_end_of_text_token_says_to_name_the_models_eos_token(tmp_path):
    """Its dataset holds one more token than the tokenizer: prepare had to add an end-of-text; the model lacks it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from spotray.data.prepare import prepare
    from tests.corpus import write_corpus

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(320)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    corpus = write_corpus(tmp_path / "corpus", documents=4)
    prepare(corpus, str(tmp_path / "tokens"), tokenizer=str(tmp_path / "tokenizer.json"))
    cfg = make_config(str(tmp_path / "tokens"), str(tmp_path), "v", model={"hf": {"config": TINY["llama"]}})
    with pytest.raises(ConfigError, match=r"^config 'data.path': .*names no end-of-text token, so prepare added one "
                                          r"\(id 320\) .*name the model's eos_token in the tokenizer_config.json"):
        launch.preflight(cfg)


def test_data_prepared_with_another_tokenizer_than_the_pretrained_models_is_refused(dataset_url, tmp_path):
    """The byte dataset (prepare's default) against a model with its own tokenizer.json: refused in one line. The
    same tokenizer saved again (other bytes, the same ids) is accepted."""
    from tokenizers import Tokenizer

    from spotray.data.prepare import prepare
    from spotray.data.tokenizer import tokenizer_id
    from tests.corpus import write_corpus
    from tests.training.data.test_data import train_bpe

    save_tiny("llama", tmp_path / "model")
    corpus = write_corpus(tmp_path / "corpus", documents=4)
    train_bpe(tmp_path / "model", [path.read_text() for path in sorted(Path(corpus).iterdir())])
    model = {"hf": {"pretrained": str(tmp_path / "model")}}
    with pytest.raises(ConfigError, match=r"^config 'data.path': .* was prepared with tokenizer bytes, not with the "
                                          r"model's \(hf:[0-9a-f]{16}, .*prepare the corpus with `spotray prepare "
                                          rf"--tokenizer {tmp_path / 'model'}`"):
        launch.preflight(make_config(dataset_url, str(tmp_path / "runs"), "b", model=model))
    (tmp_path / "resaved").mkdir()
    Tokenizer.from_file(str(tmp_path / "model" / "tokenizer.json")).save(str(tmp_path / "resaved" / "tokenizer.json"),
                                                                         pretty=False)
    index = prepare(corpus, str(tmp_path / "tokens"), tokenizer=str(tmp_path / "resaved"))
    assert index["tokenizer"] != tokenizer_id((tmp_path / "model" / "tokenizer.json").read_bytes())
    launch.preflight(make_config(str(tmp_path / "tokens"), str(tmp_path / "runs"), "b", model=model))


def pretrained_logits(rank: int, world_size: int, config: dict, inputs: list) -> tuple:
    """Rank 0's logits of the model ``build_parts`` starts from, and the bytes each rank read of the weights.
    Plain lists and arrays cross the process boundary: torch shares tensors through a socket that dies with the rank."""
    import torch.distributed as dist

    from spotray.config import from_dict
    from spotray.storage import resolve
    from spotray.tasks.hf_causal_lm import HFTask
    from spotray.tasks.pretrained import load_sharded
    from spotray.worker.attempt import WorkerEnv
    from spotray.worker.loop import build_parts

    cfg = from_dict(config)
    parts = build_parts(cfg, WorkerEnv(rank, world_size, torch.device("cpu"), lambda _: None))
    parts.model.eval()  # GPT-2's dropout is on while training; from_pretrained returns a model in eval mode
    assert isinstance(parts.task, HFTask) and cfg.model.hf is not None and cfg.model.hf.pretrained is not None
    with torch.no_grad():
        logits = parts.task.logits(parts.model, torch.tensor(inputs))
    read = torch.tensor([load_sharded(parts.model, resolve(cfg.model.hf.pretrained, cfg.storage.options()), "")])
    gathered = [torch.zeros_like(read) for _ in range(world_size)]
    dist.all_gather(gathered, read)
    return logits.numpy(), [int(t) for t in gathered]


def save_tiny(arch: str, directory, **kwargs) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = {k: v for k, v in TINY[arch].items() if k != "model_type"}
    torch.manual_seed(7)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **settings)).save_pretrained(directory, **kwargs)


def upload(directory, url: str, options) -> None:
    from spotray.storage import resolve

    for path in directory.iterdir():
        resolve(f"{url}/{path.name}", options).put_file(str(path))


@pytest.mark.parametrize(("arch", "max_shard_size"), [("llama", "100KB"), ("gpt2", None)])
@pytest.mark.e2e
def test_pretrained_start_from_s3_under_fsdp_equals_from_pretrained_and_reads_only_each_ranks_part(
        arch, max_shard_size, dataset_url, s3_bucket, tmp_path):
    from transformers import AutoModelForCausalLM

    bucket_url, options = s3_bucket
    save_tiny(arch, tmp_path / "model", **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    assert (tmp_path / "model" / "model.safetensors.index.json").exists() == bool(max_shard_size)
    upload(tmp_path / "model", f"{bucket_url}/{arch}", options)
    cfg = make_config(dataset_url, str(tmp_path / "ckpt"), "p", "parallel=fsdp",
                      f"storage.endpoint_url={options.endpoint_url}",
                      model={"hf": {"pretrained": f"{bucket_url}/{arch}"}})
    inputs = torch.randint(0, 257, (2, 16), generator=torch.Generator().manual_seed(0))

    logits, bytes_read = run_on_process_group(pretrained_logits, (cfg.to_dict(), inputs.tolist()), 2)

    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "model", attn_implementation="sdpa")
    with torch.no_grad():
        expected = reference(input_ids=inputs).logits
    torch.testing.assert_close(torch.from_numpy(logits), expected, rtol=0, atol=1e-5)
    model_bytes = sum(p.numel() * p.element_size() for p in reference.parameters())
    assert all(0 < b <= 0.6 * model_bytes for b in bytes_read), (bytes_read, model_bytes)


def no_weights(model) -> None:
    (model / "model.safetensors").unlink()


def broken_generation_config(model) -> None:
    (model / "generation_config.json").write_text('{"eos_token_id": ')


@pytest.mark.parametrize(("damage", "expected"), [
    (no_weights, "no model.safetensors"),
    (broken_generation_config, "generation_config.json is not valid JSON"),
])
def test_a_pretrained_directory_without_weights_or_with_a_broken_generation_config_is_refused_before_training(
        damage, expected, dataset_url, tmp_path):
    save_tiny("llama", tmp_path / "model")
    damage(tmp_path / "model")
    result = spotray_train(dataset_url, tmp_path, f"model.hf.pretrained={tmp_path / 'model'}", "train.seq_len=32")
    errors = [line for line in result.stderr.splitlines() if line.startswith("spotray: error")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr
    assert "model.hf.pretrained" in errors[0] and expected in errors[0]
    assert not (tmp_path / "ckpt").exists()


def spotray_train(dataset_url: str, tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    args = ["train", "--set", f"data.path={dataset_url}", "--set", f"checkpoint.path={tmp_path / 'ckpt'}"]
    for override in overrides:
        args += ["--set", override]
    return subprocess.run([sys.executable, "-m", "spotray.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize(("config", "expected"), [
    ({"hidden_size": 64}, "model_type is missing"),
    ({"model_type": "no-such-model"}, "model_type is unknown ('no-such-model')"),
])
def test_a_config_without_a_known_model_type_ends_in_one_line_naming_the_setting(config, expected, dataset_url,
                                                                                   tmp_path):
    result = spotray_train(dataset_url, tmp_path, *(f"model.hf.config.{key}={value}" for key, value in config.items()))
    errors = [line for line in result.stderr.splitlines() if line.startswith("spotray: error")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr
    assert "config 'model.hf.config'" in errors[0] and expected in errors[0]
    assert not (tmp_path / "ckpt").exists()

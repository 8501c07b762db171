"""``spotray export``: a committed checkpoint becomes a Hugging Face model directory that transformers loads as is."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spotray.checkpoints.dcp import Checkpointer
from spotray.errors import StorageError
from spotray.export import export
from spotray.worker.attempt import WorkerEnv, run_root
from spotray.worker.loop import build_parts
from tests.repo import REPO
from tests.training.configs import make_config
from tests.training.runs import train_locally
from tests.training.tasks.test_hf_causal_lm import TINY

MODELS = {"gpt": None, "llama": {"hf": {"config": TINY["llama"]}}, "gpt2": {"hf": {"config": TINY["gpt2"]}}}


@pytest.fixture(scope="module")
def fsdp_runs(dataset_url, tmp_path_factory) -> dict:
    """A 10-step run of each model on 2 FSDP ranks (checkpoints at steps 5 and 10)."""
    root = tmp_path_factory.mktemp("export-runs")
    configs = {name: make_config(dataset_url, str(root), name, "parallel=fsdp", "train.max_steps=10",
                                 "checkpoint.every_steps=5", model=model) for name, model in MODELS.items()}
    for cfg in configs.values():
        train_locally(cfg)
    return configs


def trained_model(cfg) -> tuple:
    """The run's task and model restored in this process, the way a resumed single worker restores it."""
    env = WorkerEnv(0, 1, torch.device("cpu"), lambda _: None)
    parts = build_parts(cfg, env, init_weights=False)
    Checkpointer(run_root(cfg), rank=0, world_size=1, keep_last=10).restore_latest(parts.state, per_rank_keys=("rng",))
    return parts.task, parts.model.eval()


def tree_digest(path: Path) -> dict:
    files = (p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.e2e
def test_exported_model_gives_the_trained_models_logits(fsdp_runs, name, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = fsdp_runs[name]
    before = tree_digest(_run_dir(cfg))
    result = export(run_root(cfg).url, str(tmp_path / "out"), max_shard_bytes=200_000)
    assert result["step"] == 10 and result["config"] == ["config.json"]
    assert "model.safetensors.index.json" in result["files"]  # sharded above the size limit
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="sdpa").eval()
    task, model = trained_model(cfg)
    inputs = torch.randint(0, 257, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=inputs).logits, task.logits(model, inputs), rtol=0, atol=1e-5)
    if name == "gpt":
        assert type(exported).__name__ == "GPT2LMHeadModel"
    assert tree_digest(_run_dir(cfg)) == before  # export never modifies the run


def _run_dir(cfg) -> Path:
    return Path(run_root(cfg).path)


def spotray_export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spotray.cli", "export", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.e2e
def test_uncommitted_and_corrupted_steps_are_refused_in_one_line_and_the_run_is_untouched(fsdp_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(_run_dir(fsdp_runs["gpt"]), run)
    (run / "checkpoints" / "step_000000005" / "COMMITTED.json").unlink()  # as a save cut short leaves it
    shard = run / "checkpoints" / "step_000000010" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF  # inside the first item: a model tensor
    shard.write_bytes(bytes(data))
    before = tree_digest(run)

    for step, expected in (("5", "--step 5 is not a committed checkpoint"), ("10", "corrupted"),
                           ("7", "committed steps are 10")):
        result = spotray_export(str(run), "--out", str(tmp_path / f"out{step}"), "--step", step)
        assert result.returncode == 2, result.stderr
        lines = [line for line in result.stderr.splitlines() if line.startswith("spotray: error")]
        assert len(lines) == 1 and expected in lines[0], result.stderr
    assert tree_digest(run) == before


def test_a_url_that_is_not_a_run_is_refused(tmp_path):
    result = spotray_export(str(tmp_path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "no committed checkpoint" in result.stderr


CHAT_TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"


def test_a_pretrained_models_tokenizer_files_and_generation_config_are_exported_with_it(tmp_path, monkeypatch,
                                                                                       capsys):
    """The model directory a run starts from, with its tokenizer's special tokens, chat template and generation
    settings: the data prepared with its tokenizer, 2 steps, export. AutoTokenizer and GenerationConfig read the
    export as they read the original."""
    from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast

    from spotray.cli import main
    from spotray.data.prepare import prepare
    from tests.corpus import write_corpus
    from tests.training.data.test_data import train_bpe
    from tests.training.tasks.test_hf_causal_lm import save_tiny

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    corpus = write_corpus(tmp_path / "corpus", documents=8)
    model = tmp_path / "model"
    save_tiny("llama", model)
    bpe = train_bpe(tmp_path / "bpe", [p.read_text() for p in sorted(Path(corpus).iterdir())])
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                            chat_template=CHAT_TEMPLATE).save_pretrained(model)
    GenerationConfig(eos_token_id=bpe.token_to_id("<|endoftext|>"), max_new_tokens=7).save_pretrained(model)
    prepare(corpus, str(tmp_path / "tokens"), tokenizer=str(model))
    cfg = make_config(str(tmp_path / "tokens"), str(tmp_path / "ckpt"), "t", "train.max_steps=2",
                      "scaling.num_workers=1", model={"hf": {"pretrained": str(model)}})
    train_locally(cfg)

    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["export", run_root(cfg).url, "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip().endswith(": model.safetensors + config.json + generation_config.json + "
                                                    "tokenizer.json + chat_template.jinja + tokenizer_config.json")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / name).read_bytes() == (model / name).read_bytes(), name
    exported, original = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(model)
    assert (exported.eos_token, exported.pad_token, exported.chat_template) == ("<|endoftext|>",) * 2 + (CHAT_TEMPLATE,)
    messages = [{"role": "user", "content": "hi"}]
    assert exported.apply_chat_template(messages, tokenize=False) == original.apply_chat_template(messages,
                                                                                                  tokenize=False)
    assert GenerationConfig.from_pretrained(out).to_dict() == GenerationConfig.from_pretrained(model).to_dict()


def test_a_bfloat16_pretrained_model_is_exported_in_bfloat16_and_dtype_chooses_another(dataset_url, tmp_path,
                                                                                        capsys):
    """A model that came in bfloat16 trains on float32 weights and goes back in bfloat16 (half the files), as its
    config says; ``--dtype`` writes another. Sizes in a sharded export's index are the written ones."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from spotray.cli import main
    from tests.training.tasks.test_hf_causal_lm import save_tiny

    save_tiny("llama", tmp_path / "source")
    AutoModelForCausalLM.from_pretrained(tmp_path / "source", dtype=torch.bfloat16).save_pretrained(tmp_path / "model")
    cfg = make_config(dataset_url, str(tmp_path / "ckpt"), "b", "train.max_steps=2", "scaling.num_workers=1",
                      model={"hf": {"pretrained": str(tmp_path / "model")}})
    train_locally(cfg)
    url = run_root(cfg).url

    def exported(out: str, *flags: str) -> dict:
        assert main(["export", url, "--out", str(tmp_path / out), "--max-shard-gb", "0.0001", *flags]) == 0
        files = sorted((tmp_path / out).glob("*.safetensors"))
        tensors: dict[str, torch.Tensor] = {}
        for file in files:
            with safe_open(str(file), "pt") as f:
                tensors |= {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 - safe_open is no mapping
        index = json.loads((tmp_path / out / "model.safetensors.index.json").read_text())
        assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
        assert json.loads((tmp_path / out / "config.json").read_text())["dtype"] == str(
            next(iter(tensors.values())).dtype).removeprefix("torch.")
        return tensors

    as_came, full = exported("bf16"), exported("fp32", "--dtype", "float32")
    assert "in bfloat16:" in capsys.readouterr().out.splitlines()[0]
    assert {t.dtype for t in as_came.values()} == {torch.bfloat16} and {t.dtype for t in full.values()} == {
        torch.float32}
    assert all(torch.equal(as_came[key], full[key].to(torch.bfloat16)) for key in full)
    _, model = trained_model(cfg)
    assert all(torch.equal(full[key], value) for key, value in model.state_dict().items() if key in full)
    assert main(["export", url, "--out", str(tmp_path / "x"), "--dtype", "fp8"]) == 2
    assert capsys.readouterr().err == "spotray: error: --dtype fp8: use one of float32, bfloat16, float16\n"


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_a_byte_tokenizer_run_exports_a_tokenizer_that_a_pipeline_generates_with(fsdp_runs, name, tmp_path,
                                                                                  monkeypatch, capsys):
    from transformers import pipeline

    from spotray.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # everything comes from the exported directory
    out = tmp_path / "out"
    assert main(["export", run_root(fsdp_runs[name]).url, "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip().endswith(": model.safetensors + config.json + tokenizer.json + "
                                                    "tokenizer_config.json")
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == config["pad_token_id"] == 256
    generator = pipeline("text-generation", model=str(out), device="cpu")
    assert generator.tokenizer is not None and generator.tokenizer.eos_token_id == 256
    text = generator("Once upon", max_new_tokens=8, do_sample=False)[0]["generated_text"]
    assert isinstance(text, str) and text.startswith("Once upon")


def test_the_exported_byte_tokenizer_gives_spotrays_byte_ids_and_decodes_every_model_id(tmp_path):
    from transformers import AutoTokenizer

    from spotray.data.hf_byte_tokenizer import byte_tokenizer_files
    from spotray.data.tokenizer import ByteTokenizer

    for name, data in byte_tokenizer_files().items():
        (tmp_path / name).write_bytes(data)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok.eos_token_id == tok.pad_token_id == 256 and len(tok) == 257
    rng = random.Random(0)
    code_points = [c for c in range(0x30000) if not 0xD800 <= c < 0xE000]  # planes 0-2 (1- to 4-byte UTF-8)
    randoms = ("".join(map(chr, rng.choices(code_points, k=rng.randint(1, 60)))) for _ in range(200))
    texts = ["", "hello world", "  two  spaces , and . ' s\n\t\r", "\x00\x01\x7f\x80\xff", "naïve café 日本語 🙂👍🏽",
             "a<|endoftext|>b", *randoms]
    for text in texts:
        ids = tok(text)["input_ids"]
        assert ids == ByteTokenizer().encode_documents([text])[0][:-1].tolist(), text
        assert tok.decode(ids) == text
    assert tok.decode(list(range(257, 320))) == "" and tok.decode([104, 300, 105, 319]) == "hi"
    assert tok.decode([104, 256, 105]) == "h<|endoftext|>i"
    assert tok.decode([104, 256, 105], skip_special_tokens=True) == "hi"
    assert tok.decode([0xFF, 0xC3, 0x28]) == "\ufffd\ufffd("  # bytes that are no UTF-8 decode as replacements


def test_a_ddp_run_on_s3_exports_to_s3_with_the_trained_models_logits(dataset_url, s3_bucket, tmp_path):
    from transformers import AutoModelForCausalLM

    from spotray.storage import resolve

    bucket_url, options = s3_bucket
    cfg = make_config(dataset_url, f"{bucket_url}/runs", "ddp", "parallel=ddp", "train.max_steps=4",
                      "checkpoint.every_steps=4", f"storage.endpoint_url={options.endpoint_url}",
                      model=MODELS["llama"])
    train_locally(cfg)
    result = export(run_root(cfg).url, f"{bucket_url}/exported", options=options)
    assert result["files"] == ["model.safetensors"]
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes(resolve(f"{bucket_url}/exported/{name}", options).read_bytes())
    exported = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    task, model = trained_model(cfg)
    inputs = torch.randint(0, 257, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=inputs).logits, task.logits(model, inputs), rtol=0, atol=1e-5)
    with pytest.raises(StorageError, match="^cannot write s3://missing/exported: .* has no bucket 'missing'"):
        export(run_root(cfg).url, "s3://missing/exported", options=options)  # before a shard is read for nothing

"""``spotray bench prepare``: ``spotray prepare`` of a generated JSONL and Parquet corpus, on local disk and on
loopback S3, with parallelism 1 and 2: tokens/s, the scaling ratio, and the peak RSS of any one task; against the
baseline users would otherwise run, Hugging Face ``datasets`` (``load_dataset("json")`` + ``map``, ``num_proc=2``)
with the same tokenizer. Every run is repeated ``rounds`` times, the rounds interleaved."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import statistics
import threading
import time
from contextlib import contextmanager

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from spotray.bench.common import machine, scratch_dir
from spotray.data.executors import RayExecutor
from spotray.data.prepare import prepare
from spotray.storage import StorageOptions, resolve

FILES = 4
_WORDS = np.array("spot instance node ray train shard token model loss step batch drain grace save load resume gpu "
                  "bucket commit rank world epoch sample corpus parquet ünïcode ✓ the of and to in is".split())


def run(size_mb: int = 1024, s3_endpoint: str | None = None, rounds: int = 2,
        parallelisms: tuple[int, ...] = (1, 2)) -> dict:
    with scratch_dir() as workdir:
        return _run(workdir, size_mb, s3_endpoint, rounds, parallelisms)


def _run(workdir: str, size_mb: int, s3_endpoint: str | None, rounds: int, parallelisms: tuple[int, ...]) -> dict:
    import ray

    from spotray.drills.s3local import create_bucket, moto_server
    from spotray.ray_local import join_or_start

    jsonl_files = write_corpus(f"{workdir}/jsonl", size_mb)
    parquet_files = _as_parquet(jsonl_files, f"{workdir}/parquet")
    bpe = train_bpe(jsonl_files[0], f"{workdir}/bpe")
    with contextlib.ExitStack() as stack:
        endpoint = s3_endpoint or stack.enter_context(moto_server())
        options = StorageOptions(endpoint_url=endpoint)
        bucket = create_bucket(endpoint)
        for path in jsonl_files + parquet_files:
            resolve(f"{bucket}/{os.path.relpath(path, workdir)}", options).put_file(path)
        sources = {(fmt, "local"): f"{workdir}/{fmt}" for fmt in ("jsonl", "parquet")}
        sources |= {(fmt, "s3"): f"{bucket}/{fmt}" for fmt in ("jsonl", "parquet")}
        # BPE gets through ~8x fewer bytes/s than bytes: its cases read one of the files, so a round stays short.
        cases = [(fmt, storage, "bytes", sources[fmt, storage]) for fmt, storage in sources]
        cases.append(("jsonl", "local", "hf-bpe", jsonl_files[0]))
        tokenizers = {"bytes": ("bytes", jsonl_files), "hf-bpe": (bpe, jsonl_files[:1])}
        runs: dict[tuple[str, str, str], dict[int, list[dict]]] = {
            case[:3]: {p: [] for p in parallelisms} for case in cases}
        baseline_runs: dict[str, list[dict]] = {name: [] for name in tokenizers}
        join_or_start(max(os.cpu_count() or 1, max(parallelisms)), log_to_driver=False)
        try:
            for i in range(rounds):  # interleaved, so drift on a noisy machine hits every side alike
                for fmt, storage, tokenizer, source in cases:
                    for p in parallelisms:
                        runs[fmt, storage, tokenizer][p].append(
                            _timed_prepare(source, f"{workdir}/out", options, p, tokenizers[tokenizer][0]))
                for name, (tokenizer, files) in tokenizers.items():
                    baseline_runs[name].append(_datasets_baseline(files, tokenizer, f"{workdir}/hf-cache-{i}"))
        finally:
            ray.shutdown()
    results = [_case(*key, by_p, parallelisms) for key, by_p in runs.items()]
    baseline = {name: _baseline(r) for name, r in baseline_runs.items()}
    high = str(max(parallelisms))
    local_jsonl = {r["tokenizer"]: r for r in results if (r["format"], r["storage"]) == ("jsonl", "local")}
    return {
        "machine": machine(), "rounds": rounds, "files": FILES,
        "corpus_mb": {name: round(sum(map(os.path.getsize, files)) / 1e6, 1)
                      for name, (_, files) in tokenizers.items()},
        "cases": results,
        "datasets_baseline": baseline,
        "spotray_over_datasets": {name: round(local_jsonl[name]["tokens_per_s"][high] / baseline[name]["tokens_per_s"],
                                              2) for name in baseline},
        "spotray_over_datasets_median": {
            name: round(local_jsonl[name]["tokens_per_s_median"][high] / baseline[name]["tokens_per_s_median"], 2)
            for name in baseline},
    }


def _case(fmt: str, storage: str, tokenizer: str, runs: dict[int, list[dict]], parallelisms) -> dict:
    """Rates are the best round's (``_median``: the median round's); scaling compares the highest parallelism
    with the lowest."""
    low, high = str(min(parallelisms)), str(max(parallelisms))
    rates = {str(p): [r["tokens"] / r["seconds"] for r in rs] for p, rs in runs.items()}
    best = {p: round(max(r)) for p, r in rates.items()}
    median = {p: round(statistics.median(r)) for p, r in rates.items()}
    return {"format": fmt, "storage": storage, "tokenizer": tokenizer, "tokens": runs[min(parallelisms)][0]["tokens"],
            "seconds": {str(p): [round(r["seconds"], 2) for r in rs] for p, rs in runs.items()},
            "tokens_per_s": best, "tokens_per_s_median": median,
            "scaling": round(best[high] / best[low], 3), "scaling_median": round(median[high] / median[low], 3),
            "peak_task_rss_mb": max((r["peak_task_rss_mb"] for rs in runs.values() for r in rs
                                     if r["peak_task_rss_mb"]), default=None)}


def _baseline(runs: list[dict]) -> dict:
    rates = [r["tokens"] / r["seconds"] for r in runs]
    return {"tokens": runs[0]["tokens"], "seconds": [r["seconds"] for r in runs], "tokens_per_s": round(max(rates)),
            "tokens_per_s_median": round(statistics.median(rates)), "datasets": runs[0]["datasets"]}


def _timed_prepare(source: str, out_root: str, options: StorageOptions, parallelism: int, tokenizer: str) -> dict:
    out = resolve(f"{out_root}/{time.monotonic_ns()}")
    with _task_rss_sampler() as peak:
        started = time.perf_counter()
        index = prepare(source, out.url, options, RayExecutor(parallelism), tokenizer=tokenizer,
                        progress_stream=open(os.devnull, "w"))
        seconds = time.perf_counter() - started
    out.delete_tree()
    # None where every task ended between two samples (a small corpus)
    return {"tokens": index["total_tokens"], "seconds": seconds, "peak_task_rss_mb": round(peak() / 1e6, 1) or None}


@contextmanager
def _task_rss_sampler(interval_s: float = 1.0):
    """The largest RSS seen of any process running a prepare task (Ray titles it ``ray::_run_job``)."""
    import psutil

    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.wait(interval_s):
            for proc in psutil.process_iter(["cmdline", "memory_info"]):
                cmdline = " ".join(proc.info["cmdline"] or [])
                if cmdline.startswith("ray::_run_job") and proc.info["memory_info"] is not None:
                    peak[0] = max(peak[0], proc.info["memory_info"].rss)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield lambda: peak[0]
    finally:
        stop.set()
        thread.join()


def write_corpus(directory: str, size_mb: float, files: int = FILES) -> list[str]:
    """``files`` JSONL files of unique documents (a serial number and 50 to 400 random words each)."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    per_file, paths, serial = int(size_mb * (1 << 20)) // files, [], 0
    for k in range(files):
        path = f"{directory}/part-{k:02d}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            written = 0
            while written < per_file:
                lengths = rng.integers(50, 400, size=1000)
                words = _WORDS[rng.integers(0, len(_WORDS), size=int(lengths.sum()))]
                ends = np.cumsum(lengths)
                lines = [json.dumps({"id": serial + i, "text": f"{serial + i} " + " ".join(words[e - n : e])},
                                    ensure_ascii=False) + "\n" for i, (e, n) in enumerate(zip(ends, lengths,
                                                                                              strict=True))]
                serial += len(lines)
                block = "".join(lines)
                f.write(block)
                written += len(block.encode("utf-8"))
        paths.append(path)
    return paths


def _as_parquet(jsonl_files: list[str], directory: str) -> list[str]:
    import pyarrow.json as pajson

    os.makedirs(directory, exist_ok=True)
    paths = []
    for path in jsonl_files:
        target = f"{directory}/{os.path.basename(path).replace('.jsonl', '.parquet')}"
        pq.write_table(pajson.read_json(path).select(["id", "text"]), target, row_group_size=50_000,
                       compression="zstd")
        paths.append(target)
    return paths


def train_bpe(sample_file: str, directory: str) -> str:
    """A byte-level BPE of 8k tokens trained on the first 16 MB of the corpus (nothing is downloaded)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    with open(sample_file, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f.readlines(16 << 20)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>"]))
    os.makedirs(directory, exist_ok=True)
    tok.save(f"{directory}/tokenizer.json")
    return directory


def _datasets_baseline(jsonl_files: list[str], tokenizer: str, cache_dir: str) -> dict:
    """What a team would otherwise run: ``datasets`` loads the JSONL into its Arrow cache, then maps the tokenizer
    over it in 2 processes. Timed from the start of the load to the end of the map."""
    import datasets

    datasets.disable_progress_bars()
    tokenize = _hf_tokenize if tokenizer != "bytes" else _byte_tokenize
    started = time.perf_counter()
    ds = datasets.load_dataset("json", data_files=jsonl_files, split="train", cache_dir=cache_dir)
    tokenized = ds.map(tokenize, batched=True, num_proc=2, remove_columns=ds.column_names,
                       fn_kwargs={"tokenizer": tokenizer})
    seconds = time.perf_counter() - started
    tokens = int(pa.compute.sum(pa.compute.list_value_length(tokenized.data.column("ids"))).as_py())
    shutil.rmtree(cache_dir, ignore_errors=True)
    return {"tokens": tokens, "seconds": round(seconds, 2), "datasets": datasets.__version__}


def _byte_tokenize(batch: dict, tokenizer: str) -> dict:
    return {"ids": [list(text.encode("utf-8")) + [256] for text in batch["text"]]}


@functools.cache
def _load_bpe(directory: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(f"{directory}/tokenizer.json")


def _hf_tokenize(batch: dict, tokenizer: str) -> dict:
    tok = _load_bpe(tokenizer)
    eot = tok.token_to_id("<|endoftext|>")
    return {"ids": [e.ids + [eot] for e in tok.encode_batch(batch["text"], add_special_tokens=False)]}

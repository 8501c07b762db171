"""``prepare`` at corpus scale: formats, chunking, dedup, resume, Ray, verify and bad input."""

import gzip
import hashlib
import io
import json
import random
import re
from typing import TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spotray.cli import main
from spotray.data import prepare_progress as progress_module
from spotray.data import sources
from spotray.data.executors import InlineExecutor, RayExecutor
from spotray.data.index import read_index, val_split_url
from spotray.data.prepare import prepare, verify
from spotray.errors import DataError, StorageError
from spotray.storage import Location, StorageOptions, resolve
from tests.training.data.test_prepare_progress import Terminal

EOT = 256


class PrepareFields(TypedDict, total=False):
    """The ``PrepareSettings`` fields these tests pass to ``prepare`` as keywords."""

    chunk_mb: float
    shard_tokens: int
    val_fraction: float


def documents(n: int = 60, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = "spot ray shard token ünïcode ✓ preempt drain resume".split()
    return [f"{seed}.{i} " + " ".join(rng.choice(words) for _ in range(rng.randint(1, 40))) for i in range(n)]


def write_jsonl(path, docs, field="text", opener=open):
    path.parent.mkdir(parents=True, exist_ok=True)
    with opener(path, "wt", encoding="utf-8") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({"id": i, field: doc}) + "\n")
    return path


def write_parquet(path, docs, row_group_size=7):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": list(range(len(docs))), "text": docs}), path, row_group_size=row_group_size,
                   compression="zstd")
    return path


def token_stream(url, options=None) -> list[int]:
    root = resolve(url, options)
    index = json.loads(root.child("index.json").read_bytes())
    return [t for s in index["shards"] for t in np.frombuffer(root.child(s["name"]).read_bytes(), "<u2").tolist()]


def byte_stream(docs) -> list[int]:
    return [t for d in docs for t in [*d.encode("utf-8"), EOT]]


def stream_documents(url, options=None) -> list[str]:
    """The documents of a dataset prepared with the byte tokenizer, in order."""
    docs, current = [], bytearray()
    for token in token_stream(url, options):
        if token == EOT:
            docs.append(current.decode("utf-8"))
            current = bytearray()
        else:
            current.append(token)
    return docs


def deduplicated(docs) -> list[str]:
    unique, seen = [], set()
    for doc in docs:
        if " ".join(doc.split()) not in seen:
            seen.add(" ".join(doc.split()))
            unique.append(doc)
    return unique


def in_val(doc: str, fraction: float) -> bool:
    """The rule: the first 8 bytes of the hash of the whitespace-normalised text, little-endian, below F * 2**64."""
    digest = hashlib.blake2b(" ".join(doc.split()).encode("utf-8"), digest_size=16).digest()
    return int.from_bytes(digest[:8], "little") < fraction * 2**64


def dataset_digests(url, options=None) -> dict[str, str]:
    """SHA-256 of index.json and of every shard it lists."""
    root = resolve(url, options)
    index = json.loads(root.child("index.json").read_bytes())
    names = ["index.json"] + [s["name"] for s in index["shards"]]
    return {name: hashlib.sha256(root.child(name).read_bytes()).hexdigest() for name in names}


class CountingExecutor(InlineExecutor):
    """Runs in process; counts the jobs it ran and can stop (as a kill would) after ``stop_after`` of them."""

    def __init__(self, stop_after: int | None = None):
        self.ran: list[int] = []
        self.stop_after = stop_after

    def run(self, fn, jobs, shared, on_done, on_progress):
        for job in jobs:
            if self.stop_after is not None and len(self.ran) == self.stop_after:
                raise KeyboardInterrupt
            self.ran.append(job.number)
            on_done(job, fn(job, shared, on_progress))


def test_text_jsonl_gzip_zstd_and_parquet_give_the_same_tokens(tmp_path):
    docs = documents()
    for i, doc in enumerate(docs):
        (tmp_path / "text" / f"{i:03d}.txt").parent.mkdir(exist_ok=True)
        (tmp_path / "text" / f"{i:03d}.txt").write_text(doc, encoding="utf-8")
    write_jsonl(tmp_path / "plain.jsonl", docs)
    write_jsonl(tmp_path / "gz.jsonl.gz", docs, opener=gzip.open)
    with pa.CompressedOutputStream(str(tmp_path / "zst.jsonl.zst"), "zstd") as f:
        f.write("".join(json.dumps({"text": d}) + "\n" for d in docs).encode())
    write_parquet(tmp_path / "docs.parquet", docs)

    want = byte_stream(docs)
    for name in ("text", "plain.jsonl", "gz.jsonl.gz", "zst.jsonl.zst", "docs.parquet"):
        index = prepare(str(tmp_path / name), str(tmp_path / f"out-{name}"), dedup=False)
        assert token_stream(str(tmp_path / f"out-{name}")) == want, name
        assert index["num_documents"] == len(docs)


def test_a_json_file_holding_one_array_of_records_gives_the_same_tokens_as_json_lines(tmp_path):
    """Alpaca's layout: one JSON array (indented, after a byte-order mark, gzipped), read whole whatever the chunk
    size; a .json file of JSON Lines is still read by line. A bad record is named by its item number."""
    docs = documents(30)
    records = [{"text": d, "id": i} for i, d in enumerate(docs)]
    (tmp_path / "array.json").write_text("\ufeff\n" + json.dumps(records, indent=2), encoding="utf-8")
    with gzip.open(tmp_path / "array.json.gz", "wt", encoding="utf-8") as f:
        json.dump(records, f)
    write_jsonl(tmp_path / "lines.json", docs)
    for name in ("array.json", "array.json.gz", "lines.json"):
        index = prepare(str(tmp_path / name), str(tmp_path / f"out-{name}"), chunk_mb=1e-3, dedup=False)
        assert token_stream(str(tmp_path / f"out-{name}")) == byte_stream(docs), name
        assert index["num_documents"] == len(docs)

    (tmp_path / "bad.json").write_text(json.dumps([*records[:4], {"body": "x"}]))
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'bad.json'} item 5 of its array has no field 'text' "
                                                  "(its fields: body)")):
        prepare(str(tmp_path / "bad.json"), str(tmp_path / "out-bad"))
    index = prepare(str(tmp_path / "bad.json"), str(tmp_path / "out-bad"), skip_bad_lines=True)
    assert (index["num_documents"], index["removed"]["bad_lines"]) == (4, 1)


@pytest.mark.parametrize("chunk_mb, read_block", [(1e-3, None), (3e-3, None), (3e-3, 5), (64, None), (64, 5)])
def test_chunk_size_changes_only_where_shards_end(tmp_path, monkeypatch, chunk_mb, read_block):
    """Byte ranges of one JSONL file and runs of Parquet row groups: every line once, in order, whatever the cut,
    also when lines span many reads."""
    if read_block:
        monkeypatch.setattr(sources, "READ_BLOCK", read_block)
        monkeypatch.setattr(sources, "TAIL_BLOCK", read_block - 2)
    docs = documents(200)
    write_jsonl(tmp_path / "in" / "a.jsonl", docs[:120])
    write_parquet(tmp_path / "in" / "b.parquet", docs[120:], row_group_size=9)
    index = prepare(str(tmp_path / "in"), str(tmp_path / "out"), chunk_mb=chunk_mb, dedup=False)
    assert token_stream(str(tmp_path / "out")) == byte_stream(docs)
    chunks = {s["name"].split("/")[1] for s in index["shards"]}
    assert len(chunks) > 5 if chunk_mb < 1 else len(chunks) == 1


def test_s3_prefix_and_glob_inputs(tmp_path, s3_bucket):
    bucket_url, options = s3_bucket
    docs = documents(40)
    root = resolve(bucket_url, options)
    local = write_jsonl(tmp_path / "a.jsonl", docs[:30])
    root.child("raw/a.jsonl").put_file(str(local))
    root.child("raw/deeper/b.txt").write_text(docs[30])
    root.child("raw/_SUCCESS").write_bytes(b"")
    root.child("raw/deeper/c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[31:]))

    prepare(f"{bucket_url}/raw", f"{bucket_url}/all", options, chunk_mb=5e-4, dedup=False)
    assert token_stream(f"{bucket_url}/all", options) == byte_stream(docs)
    prepare(f"{bucket_url}/raw/**/*.jsonl", f"{bucket_url}/jsonl", options, dedup=False)
    assert token_stream(f"{bucket_url}/jsonl", options) == byte_stream(docs[:30] + docs[31:])


def test_an_output_in_a_bucket_that_does_not_exist_is_refused_before_any_input_is_tokenized(tmp_path, s3_server,
                                                                                                 monkeypatch):
    write_jsonl(tmp_path / "in.jsonl", documents(5))
    monkeypatch.setattr("spotray.data.prepare.tokenize_chunk", None)  # reading the corpus would fail otherwise
    with pytest.raises(StorageError, match="^cannot write s3://missing/tokens: .* has no bucket 'missing'"):
        prepare(str(tmp_path / "in.jsonl"), "s3://missing/tokens", StorageOptions(endpoint_url=s3_server))


def test_exact_duplicates_are_dropped_first_occurrence_kept_whatever_the_chunking(tmp_path):
    docs = documents(50)
    repeated = docs + [docs[3], "  " + docs[10].replace(" ", "\n  ") + " ", docs[49]] + documents(10, seed=1)
    write_jsonl(tmp_path / "in.jsonl", repeated + [docs[0]])
    unique, seen = [], set()
    for doc in repeated + [docs[0]]:
        if " ".join(doc.split()) not in seen:
            seen.add(" ".join(doc.split()))
            unique.append(doc)

    for chunk_mb in (64, 2e-3):
        out = tmp_path / f"out-{chunk_mb}"
        index = prepare(str(tmp_path / "in.jsonl"), str(out), chunk_mb=chunk_mb)
        assert token_stream(str(out)) == byte_stream(unique)
        assert index["removed"]["duplicates"] == len(repeated) + 1 - len(unique)
        assert index["num_documents"] == len(unique)
        assert not list(out.rglob("docs.bin")), "dedup's hash lists are removed once the index is written"
        assert sorted(p.relative_to(out).as_posix() for p in out.rglob("shard-*.bin")) == sorted(
            s["name"] for s in index["shards"]), "the shards that dedup rewrote are removed"


def test_min_chars_drops_short_documents_and_counts_them(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", ["tiny", "long enough text", "", "no"])
    index = prepare(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), min_chars=5)
    assert token_stream(str(tmp_path / "out")) == byte_stream(["long enough text"])
    assert index["removed"] == {"short": 3, "duplicates": 0, "bad_lines": 0}


def test_empty_and_null_texts_in_every_format_are_dropped_and_counted_even_at_min_chars_0(tmp_path, capsys):
    """Hugging Face exports hold null texts: a JSON null or a Parquet null is an empty document, not a missing
    field (a JSONL line without the field still stops the run)."""
    write_jsonl(tmp_path / "in" / "a.jsonl", ["one", None, "", "two"])
    write_parquet(tmp_path / "in" / "b.parquet", ["three", None, ""])
    (tmp_path / "in" / "c.txt").write_text("")
    (tmp_path / "in" / "d.txt").write_text("four")
    assert main(["prepare", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                 "--min-chars", "0"]) == 0
    assert token_stream(str(tmp_path / "out")) == byte_stream(["one", "two", "three", "four"])
    assert read_index(resolve(str(tmp_path / "out")))["removed"] == {"short": 5, "duplicates": 0, "bad_lines": 0}
    assert "removed 5 documents empty or shorter than --min-chars" in capsys.readouterr().out


@pytest.mark.e2e
def test_same_bytes_whatever_the_parallelism_on_ray(tmp_path, s3_bucket, ray_cluster):
    bucket_url, options = s3_bucket
    docs = documents(400)
    write_jsonl(tmp_path / "in" / "a.jsonl", docs[:300] + docs[:20])
    write_parquet(tmp_path / "in" / "b.parquet", docs[300:] + docs[5:9], row_group_size=11)
    digests = []
    for parallelism in (1, 4):
        url = f"{bucket_url}/p{parallelism}"
        prepare(str(tmp_path / "in"), url, options, RayExecutor(parallelism), chunk_mb=6e-3, shard_tokens=512)
        digests.append(dataset_digests(url, options))
    assert len(digests[0]) > 10
    assert digests[0] == digests[1]
    assert token_stream(f"{bucket_url}/p1", options) == byte_stream(docs)


def test_a_killed_prepare_redoes_only_the_missing_chunks_and_adopts_no_partial_shard(tmp_path):
    docs = documents(300)
    write_jsonl(tmp_path / "in.jsonl", docs + docs[:30])
    settings: PrepareFields = {"chunk_mb": 2e-3, "shard_tokens": 256}
    prepare(str(tmp_path / "in.jsonl"), str(tmp_path / "reference"), **settings)
    out = tmp_path / "out"

    first = CountingExecutor(stop_after=3)
    with pytest.raises(KeyboardInterrupt):
        prepare(str(tmp_path / "in.jsonl"), str(out), executor=first, **settings)
    assert not (out / "index.json").exists()
    (out / "chunks" / "c000003").mkdir()
    (out / "chunks" / "c000003" / "shard-00000.bin").write_bytes(b"partial")  # the 4th task died while writing
    (out / "chunks" / "c000001" / "shard-00000.bin").write_bytes(b"torn")  # and a finished shard was damaged

    again, log = CountingExecutor(), io.StringIO()
    prepare(str(tmp_path / "in.jsonl"), str(out), executor=again, progress_stream=log, **settings)
    total = len(list((tmp_path / "reference").glob("chunks/*/manifest.json")))
    assert sorted(again.ran[: total - 2]) == [k for k in range(total) if k not in (0, 2)]
    assert f"prepare: 2 of {total} chunks were done by an earlier run; doing the other {total - 2}\n" in log.getvalue()
    assert re.search(r"^prepare: [\d,]+ docs \| [\d,]+ tokens \| [\d.]+ MB/s \| \d+%", log.getvalue(), re.M)
    assert dataset_digests(str(out)) == dataset_digests(str(tmp_path / "reference"))


def test_verify_names_truncated_and_corrupted_shards(tmp_path, s3_bucket):
    bucket_url, options = s3_bucket
    write_jsonl(tmp_path / "in.jsonl", documents(100))
    url = f"{bucket_url}/tokens"
    index = prepare(str(tmp_path / "in.jsonl"), url, options, shard_tokens=300)
    assert verify(url, options) == {"shards": len(index["shards"]), "tokens": index["total_tokens"],
                                    "bytes": 2 * index["total_tokens"]}
    root = resolve(url, options)
    first, second = index["shards"][0]["name"], index["shards"][1]["name"]
    root.child(first).write_bytes(root.child(first).read_bytes()[:-2])
    data = bytearray(root.child(second).read_bytes())
    data[7] ^= 1
    root.child(second).write_bytes(bytes(data))
    with pytest.raises(DataError, match=re.escape(
            f"2 of {len(index['shards'])} shards are damaged: {first} (has 598 bytes, the index says 600), "
            f"{second} (SHA-256 differs from the index: corrupted)")):
        verify(url, options)


def test_a_line_that_is_not_json_is_named_by_file_and_line_even_mid_file(tmp_path):
    lines = [json.dumps({"text": d}) for d in documents(80)]
    lines[57] = '{"text": "cut off'
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'in.jsonl'} line 58 is not valid JSON: fix the file, "
                                                  "or pass --skip-bad-lines")):
        prepare(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), chunk_mb=1e-3)
    assert not (tmp_path / "out" / "index.json").exists()

    index = prepare(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), chunk_mb=1e-3, skip_bad_lines=True)
    assert index["removed"]["bad_lines"] == 1 and index["num_documents"] == 79


def test_a_missing_text_field_names_the_field_and_the_fields_there(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", ["a", "b"], field="content")
    with pytest.raises(DataError, match=re.escape(
            "line 1 has no field 'text' (its fields: content, id): pick the field with --text-field")):
        prepare(str(tmp_path / "in.jsonl"), str(tmp_path / "out"))
    index = prepare(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), text_field="content")
    assert index["num_documents"] == 2

    write_parquet(tmp_path / "p.parquet", ["a", "b"])
    with pytest.raises(DataError, match=re.escape("has no column 'body' (its columns: id, text): pick one with "
                                                  "--text-field")):
        prepare(str(tmp_path / "p.parquet"), str(tmp_path / "out2"), text_field="body")
    with pytest.raises(DataError, match=re.escape("column 'id' holds int64, not text")):
        prepare(str(tmp_path / "p.parquet"), str(tmp_path / "out2"), text_field="id")


def test_a_parquet_prepares_live_line_ends_at_100_percent(tmp_path, monkeypatch):
    """The share done counts the row groups' bytes read against all of them, not against the files' sizes (their
    footers and the columns not read included): it ended at 55 %."""
    monkeypatch.setattr(progress_module, "TTY_INTERVAL_S", 0)
    for name in "ab":
        write_parquet(tmp_path / "in" / f"{name}.parquet", [f"doc {name} {i} " * 50 for i in range(40)])
    terminal = Terminal()
    prepare(str(tmp_path / "in"), str(tmp_path / "out"), progress_stream=terminal)
    last = terminal.getvalue().split("\r")[-1]
    assert " | 100%" in last, last


def test_a_file_named_parquet_that_is_not_parquet_is_named(tmp_path):
    (tmp_path / "fake.parquet").write_text("just text")
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'fake.parquet'} is not a Parquet file")):
        prepare(str(tmp_path / "fake.parquet"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_missing_bucket_and_an_unreachable_endpoint_are_one_line_each(s3_server, tmp_path):
    from spotray.ray_local import free_port
    from spotray.storage import StorageOptions

    with pytest.raises(StorageError, match=re.escape(
            "--input 's3://no-such-bucket/raw': bucket 'no-such-bucket' does not exist; check the bucket name")):
        prepare("s3://no-such-bucket/raw", str(tmp_path / "out"), StorageOptions(endpoint_url=s3_server))
    nowhere = StorageOptions(endpoint_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(StorageError, match=r"--input 's3://b/raw': cannot list s3://b/raw \(.*\); check the bucket"):
        prepare("s3://b/raw", str(tmp_path / "out"), nowhere)
    assert not (tmp_path / "out").exists()


def test_inputs_under_the_output_are_not_read_back(tmp_path):
    write_jsonl(tmp_path / "data" / "in.jsonl", ["first"])
    prepare(str(tmp_path / "data"), str(tmp_path / "data" / "tokens"))
    (tmp_path / "data" / "tokens" / "index.json").unlink()
    index = prepare(str(tmp_path / "data"), str(tmp_path / "data" / "tokens"))
    assert index["num_documents"] == 1


def test_a_truncated_gzip_file_is_named(tmp_path):
    data = gzip.compress("".join(json.dumps({"text": d}) + "\n" for d in documents(500)).encode())
    (tmp_path / "in.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=re.escape(f"cannot read {tmp_path / 'in.jsonl.gz'} (")):
        prepare(str(tmp_path / "in.jsonl.gz"), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "index.json").exists()


def test_val_split_holds_exactly_the_documents_whose_hash_is_below_the_fraction_whatever_the_chunking(tmp_path):
    docs = documents(200)
    repeats = [d for d in docs if in_val(d, 0.25)][:3] + [d for d in docs if not in_val(d, 0.25)][:3]
    corpus = docs + [" " + d.replace(" ", "  ") for d in repeats] + documents(20, seed=1)
    write_jsonl(tmp_path / "in.jsonl", corpus)
    unique = deduplicated(corpus)
    want_val = [d for d in unique if in_val(d, 0.25)]

    for chunk_mb in (64, 2e-3):
        out = tmp_path / f"out-{chunk_mb}"
        index = prepare(str(tmp_path / "in.jsonl"), str(out), chunk_mb=chunk_mb, shard_tokens=700, val_fraction=0.25)
        train, val = stream_documents(str(out)), stream_documents(str(out / "val"))
        assert val == want_val, "dedup first, then the hash rule; in input order"
        assert train == [d for d in unique if d not in want_val]
        assert not set(train) & set(val)
        assert index["removed"]["duplicates"] == len(corpus) - len(unique) == len(repeats)
        assert index["val"] == {"fraction": 0.25, "path": "val", "documents": len(val),
                                "tokens": len(byte_stream(val))}
        assert index["num_documents"] == len(train) and index["source"]["val_fraction"] == 0.25
        val_index = read_index(resolve(str(out / "val")))
        assert (val_index["split"], val_index["fraction"], val_index["num_documents"]) == ("val", 0.25, len(val))
        same = ("format", "version", "dtype", "tokenizer", "vocab_size", "eot_token", "shard_tokens", "tokenizer_file")
        assert {k: val_index[k] for k in same} == {k: index[k] for k in same}
        assert sorted(p.relative_to(out).as_posix() for p in out.rglob("shard-*.bin")) == sorted(
            [s["name"] for s in index["shards"]] + [f"val/{s['name']}" for s in val_index["shards"]]), \
            "the shards of both splits that dedup rewrote are removed"
    assert len({s["name"].split("/")[1] for s in index["shards"]}) > 5, "many chunks, compacted in both splits"


def test_val_split_is_byte_identical_whatever_the_parallelism_on_ray(tmp_path, ray_cluster):
    docs = documents(300)
    write_jsonl(tmp_path / "in" / "a.jsonl", docs + docs[:20])
    digests = []
    for parallelism in (1, 2):
        out = tmp_path / f"p{parallelism}"
        prepare(str(tmp_path / "in"), str(out), executor=RayExecutor(parallelism), chunk_mb=6e-3, shard_tokens=512,
                val_fraction=0.2)
        digests.append((dataset_digests(str(out)), dataset_digests(str(out / "val"))))
    assert len(digests[0][1]) > 3
    assert digests[0] == digests[1]
    assert stream_documents(str(tmp_path / "p1" / "val")) == [d for d in docs if in_val(d, 0.2)]


def test_a_killed_prepare_with_a_val_split_redoes_only_the_missing_chunks_and_writes_the_val_index_first(
        tmp_path, monkeypatch):
    docs = documents(300)
    write_jsonl(tmp_path / "in.jsonl", docs + docs[:30])
    settings: PrepareFields = {"chunk_mb": 2e-3, "shard_tokens": 256, "val_fraction": 0.2}
    prepare(str(tmp_path / "in.jsonl"), str(tmp_path / "reference"), **settings)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        prepare(str(tmp_path / "in.jsonl"), str(out), executor=CountingExecutor(stop_after=3), **settings)
    assert not (out / "index.json").exists() and not (out / "val" / "index.json").exists()

    written, write_text = [], Location.write_text

    def recording_write_text(self, text):
        written.append(self.url)
        write_text(self, text)

    monkeypatch.setattr(Location, "write_text", recording_write_text)
    again = CountingExecutor()
    prepare(str(tmp_path / "in.jsonl"), str(out), executor=again, **settings)
    total = len(list((tmp_path / "reference").glob("chunks/*/manifest.json")))
    assert sorted(again.ran[: total - 3]) == list(range(3, total))
    assert [url for url in written if url.endswith("index.json")] == [f"{out}/val/index.json", f"{out}/index.json"]
    for split in ("", "val"):
        assert dataset_digests(str(out / split)) == dataset_digests(str(tmp_path / "reference" / split))


@pytest.mark.parametrize("value", ["0", "0.6", "-1", "abc"])
def test_an_out_of_range_val_fraction_is_one_line_and_exit_2_and_writes_nothing(tmp_path, capsys, value):
    write_jsonl(tmp_path / "in.jsonl", documents(10))
    code = main(["prepare", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out"),
                 "--val-fraction", value])
    stderr = capsys.readouterr().err
    assert code == 2
    assert len(stderr.splitlines()) == 1 and "Traceback" not in stderr, stderr
    assert stderr.startswith("spotray: error: --val-fraction must be a number more than 0 and at most 0.5, got ")
    assert value in stderr and "leave it out" in stderr
    assert not (tmp_path / "out").exists()


def test_the_cli_summary_names_the_val_split_and_verify_checks_it_with_the_training_split(tmp_path, capsys):
    from spotray.data.dataset import TokenDataset

    write_jsonl(tmp_path / "in.jsonl", documents(100))
    out = tmp_path / "out"
    assert main(["prepare", "--input", str(tmp_path / "in.jsonl"), "--output", str(out), "--val-fraction", "0.3",
                 "--shard-tokens", "300"]) == 0
    index = json.loads((out / "index.json").read_text())
    val = index["val"]
    assert (f"held out {val['tokens']:,} tokens from {val['documents']:,} documents for validation at {out}/val"
            in capsys.readouterr().out)
    val_index = read_index(resolve(str(out / "val")))
    val_result = {"shards": len(val_index["shards"]), "tokens": val["tokens"], "bytes": 2 * val["tokens"]}
    assert verify(str(out)) == {"shards": len(index["shards"]), "tokens": index["total_tokens"],
                                "bytes": 2 * index["total_tokens"], "val": val_result}
    assert verify(str(out / "val")) == val_result
    assert main(["prepare", "--verify", str(out)]) == 0
    assert f"and {len(val_index['shards'])} validation shards" in capsys.readouterr().out
    dataset = TokenDataset.open(str(out / "val"), seq_len=8)
    assert len(dataset) > 0 and dataset.tokenizer == index["tokenizer"]

    damaged = out / "val" / val_index["shards"][1]["name"]
    data = bytearray(damaged.read_bytes())
    data[3] ^= 1
    damaged.write_bytes(bytes(data))
    count, name = len(index["shards"]) + len(val_index["shards"]), val_index["shards"][1]["name"]
    with pytest.raises(DataError, match=re.escape(f"1 of {count} shards are damaged: val/{name} (SHA-256 differs "
                                                  "from the index: corrupted)")):
        verify(str(out))


def test_an_index_from_before_val_splits_still_opens_and_verifies(tmp_path):
    from spotray.data.dataset import TokenDataset

    write_jsonl(tmp_path / "in.jsonl", documents(50))
    index = prepare(str(tmp_path / "in.jsonl"), str(tmp_path / "out"))
    assert "val" not in index
    older = index | {"source": {k: v for k, v in index["source"].items() if k != "val_fraction"}}
    (tmp_path / "out" / "index.json").write_text(json.dumps(older))
    assert read_index(resolve(str(tmp_path / "out"))) == older
    assert len(TokenDataset.open(str(tmp_path / "out"), seq_len=8)) > 0
    assert set(verify(str(tmp_path / "out"))) == {"shards", "tokens", "bytes"}

    (tmp_path / "out" / "index.json").write_text(json.dumps(older | {"val": {"path": "../elsewhere"}}))
    with pytest.raises(DataError, match="field 'val' must name the validation split's directory inside the dataset"):
        read_index(resolve(str(tmp_path / "out")))


def test_val_split_url_joins_local_paths_and_s3_urls():
    assert val_split_url("/data/v1") == val_split_url("/data/v1/") == "/data/v1/val"
    assert val_split_url("relative/v1") == "relative/v1/val"
    assert val_split_url("s3://bucket/datasets/v1/") == "s3://bucket/datasets/v1/val"
    assert val_split_url("s3://bucket") == "s3://bucket/val"


def test_a_val_fraction_that_selects_no_document_is_refused_before_any_index(tmp_path):
    docs = [d for d in documents(40) if not in_val(d, 0.001)][:5]
    write_jsonl(tmp_path / "in.jsonl", docs)
    with pytest.raises(DataError, match=re.escape("--val-fraction 0.001 put none of the 5 documents into the "
                                                  "validation split: raise --val-fraction or add data")):
        prepare(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), val_fraction=0.001)
    assert not list((tmp_path / "out").rglob("index.json"))

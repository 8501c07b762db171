import hashlib
import json
import pickle
import re
import sys

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from spotray.data.dataset import TokenDataset
from spotray.data.prepare import prepare
from spotray.data.tokenizer import load_tokenizer
from spotray.errors import DataError
from spotray.storage import resolve

EOT = 256
SHARD0, SHARD1 = "chunks/c000000/shard-00000.bin", "chunks/c000000/shard-00001.bin"


@pytest.fixture(params=["local", "s3"])
def out(request, tmp_path):
    """(output url, storage options) on local disk or on the moto S3 server."""
    if request.param == "local":
        return str(tmp_path / "out"), None
    bucket_url, options = request.getfixturevalue("s3_bucket")
    return f"{bucket_url}/data/tokens", options


def write_corpus(root, files: dict[str, str]):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def byte_stream(*docs: str) -> list[int]:
    tokens: list[int] = []
    for doc in docs:
        tokens += list(doc.encode("utf-8")) + [EOT]
    return tokens


def expected_samples(stream: list[int], shard_tokens: int, seq_len: int) -> list[list[int]]:
    samples = []
    for start in range(0, len(stream), shard_tokens):
        shard = stream[start : start + shard_tokens]
        for j in range((len(shard) - 1) // seq_len):
            samples.append(shard[j * seq_len : j * seq_len + seq_len + 1])
    return samples


def train_bpe(path, texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", "<|endoftext|>"]))
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    return tok


DOCS = {"a.txt": "hello world, this is doc a", "b.txt": "wörld ünïcode ✓", "sub/c.txt": "third one\nwith lines"}


def test_round_trip_bytes_including_eot_between_documents(tmp_path, out):
    url, options = out
    corpus = write_corpus(tmp_path / "corpus", DOCS)
    prepare(str(corpus), url, shard_tokens=16, options=options)

    ds = TokenDataset.open(url, seq_len=4, options=options)
    want = expected_samples(byte_stream(*DOCS.values()), 16, 4)
    assert ds.num_samples == len(want) > 0
    assert [ds.sample(i).tolist() for i in range(ds.num_samples)] == want
    assert ds.sample(0).dtype == np.int64
    assert (ds.vocab_size, ds.eot_token, ds.tokenizer, ds.seq_len, ds.url) == (257, EOT, "bytes", 4, url)


def test_shards_are_fixed_size_with_a_shorter_last_one_and_index_is_correct(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", DOCS)
    stream = byte_stream(*DOCS.values())
    index = prepare(str(corpus), str(tmp_path / "out"), shard_tokens=10)

    assert json.loads((tmp_path / "out" / "index.json").read_text()) == index
    assert {k: index[k] for k in ("format", "version", "dtype", "tokenizer", "vocab_size", "eot_token")} == {
        "format": "spotray-tokens",
        "version": 1,
        "dtype": "uint16",
        "tokenizer": "bytes",
        "vocab_size": 257,
        "eot_token": EOT,
    }
    assert (index["shard_tokens"], index["total_tokens"], index["num_documents"]) == (10, len(stream), 3)
    sizes = [s["tokens"] for s in index["shards"]]
    assert sizes == [10] * (len(stream) // 10) + [len(stream) % 10]
    assert [s["name"] for s in index["shards"]] == [f"chunks/c000000/shard-{k:05d}.bin" for k in range(len(sizes))]
    on_disk = []
    for shard in index["shards"]:
        data = (tmp_path / "out" / shard["name"]).read_bytes()
        assert len(data) == 2 * shard["tokens"]
        assert hashlib.sha256(data).hexdigest() == shard["sha256"]
        on_disk += np.frombuffer(data, dtype="<u2").tolist()
    assert on_disk == stream


def test_recursive_glob_picks_matching_files_in_sorted_order(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", {"z.txt": "zz", "x/y.txt": "yy", "x/skip.md": "no", "a.txt": "aa"})
    index = prepare(str(corpus / "**" / "*.txt"), str(tmp_path / "out"))
    assert index["num_documents"] == 3
    data = np.fromfile(tmp_path / "out" / SHARD0, dtype="<u2").tolist()
    assert data == byte_stream("aa", "yy", "zz")


def test_hf_tokenizer_round_trip(tmp_path):
    texts = ["the quick brown fox jumps", "over the lazy dog", "the dog sleeps"]
    tok = train_bpe(tmp_path / "tok", texts)
    corpus = write_corpus(tmp_path / "corpus", {f"{i}.txt": t for i, t in enumerate(texts)})
    index = prepare(str(corpus), str(tmp_path / "out"), tokenizer=str(tmp_path / "tok"))

    eot = tok.token_to_id("<|endoftext|>")
    assert eot is not None
    stream = [i for t in texts for i in tok.encode(t, add_special_tokens=False).ids + [eot]]
    digest = hashlib.sha256((tmp_path / "tok" / "tokenizer.json").read_bytes()).hexdigest()[:16]
    assert (index["tokenizer"], index["eot_token"], index["vocab_size"]) == (f"hf:{digest}", eot, tok.get_vocab_size())
    assert index["dtype"] == "uint16"
    ds = TokenDataset.open(str(tmp_path / "out"), seq_len=3)
    assert [ds.sample(i).tolist() for i in range(ds.num_samples)] == expected_samples(stream, 1 << 20, 3)


def test_a_process_unpickles_one_hf_tokenizer_however_many_tasks_send_it(tmp_path):
    train_bpe(tmp_path / "tok", ["the quick brown fox jumps", "over the lazy dog"])
    tok = load_tokenizer(str(tmp_path / "tok"))

    first, second = pickle.loads(pickle.dumps(tok)), pickle.loads(pickle.dumps(tok))

    assert first is second  # each prepare task gets the tokenizer pickled; building a new one per task grew workers
    tokens, lengths = first.encode_documents(["the lazy fox"])
    assert tokens.tolist() == tok.encode_documents(["the lazy fox"])[0].tolist() and lengths.tolist() == [len(tokens)]


# A model directory's tokenizer files beside tokenizer.json: its special tokens and chat template.
COMPANIONS = {"tokenizer_config.json": '{"eos_token": "<|endoftext|>"}', "chat_template.jinja": "{{ messages }}"}


@pytest.mark.parametrize("spec", ["model", "model/tokenizer.json"])
def test_a_model_directory_on_s3_gives_the_tokenizer_and_the_dataset_keeps_a_copy_with_its_companion_files(
        tmp_path, s3_bucket, spec):
    bucket_url, options = s3_bucket
    texts = ["the quick brown fox jumps", "over the lazy dog"]
    train_bpe(tmp_path / "model", texts)
    (tmp_path / "model" / "config.json").write_text("{}")  # a model directory, not a bare tokenizer.json
    for name, text in COMPANIONS.items():
        (tmp_path / "model" / name).write_text(text)
    for path in (tmp_path / "model").iterdir():
        resolve(f"{bucket_url}/model/{path.name}", options).put_file(str(path))
    corpus = write_corpus(tmp_path / "corpus", {f"{i}.txt": t for i, t in enumerate(texts)})

    index = prepare(str(corpus), f"{bucket_url}/tokens", tokenizer=f"{bucket_url}/{spec}", options=options)

    assert index["tokenizer_file"] == "tokenizer.json"
    copies = TokenDataset.open(f"{bucket_url}/tokens", seq_len=3, options=options).tokenizer_files
    assert sorted(copies) == sorted(["tokenizer.json", *COMPANIONS])  # not config.json: the model's
    for name, copy in copies.items():
        assert copy.read_bytes() == (tmp_path / "model" / name).read_bytes()


def save_llama3_style(path, texts: list[str], template_ends_with_eos: bool = False) -> Tokenizer:
    """A byte-level BPE whose template begins each text with ``<|begin_of_text|>`` (and, if asked, ends it with
    ``<|end_of_text|>``), saved with the tokenizer_config.json that names its eos_token; it holds ``<|endoftext|>``
    too, a token that is not its end-of-text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    ends = " <|end_of_text|>" if template_ends_with_eos else ""
    tok.post_processor = processors.TemplateProcessing(
        single=f"<|begin_of_text|> $A{ends}", special_tokens=[(t, tok.token_to_id(t)) for t in
                                                              ("<|begin_of_text|>", "<|end_of_text|>")])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                            eos_token="<|end_of_text|>").save_pretrained(path)
    return tok


@pytest.mark.parametrize("template_ends_with_eos", [False, True])
def test_each_document_is_encoded_as_its_tokenizer_encodes_it_and_ends_with_its_eos_token(tmp_path,
                                                                                         template_ends_with_eos):
    """Llama 3's tokenizer: its template adds the beginning-of-text, its end-of-text is named only in
    tokenizer_config.json. The dataset's vocabulary is the tokenizer's (a model of that size trains on it)."""
    texts = ["the quick brown fox jumps", "over the lazy dog", "the dog sleeps"]
    tok = save_llama3_style(tmp_path / "model", texts, template_ends_with_eos)
    corpus = write_corpus(tmp_path / "corpus", {f"{i}.txt": t for i, t in enumerate(texts)})

    index = prepare(str(corpus), str(tmp_path / "out"), tokenizer=str(tmp_path / "model"))

    hf = PreTrainedTokenizerFast.from_pretrained(tmp_path / "model")
    assert (index["vocab_size"], index["eot_token"]) == (tok.get_vocab_size(), hf.eos_token_id)
    stream = [i for t in texts for i in [*hf(t).input_ids[: -1 if template_ends_with_eos else None],
                                         hf.eos_token_id]]
    assert stream[0] == hf.bos_token_id
    assert np.fromfile(tmp_path / "out" / SHARD0, dtype="<u2").tolist() == stream


def test_a_tokenizer_config_that_is_not_json_is_one_line(tmp_path):
    train_bpe(tmp_path / "tok", ["some text"])
    (tmp_path / "tok" / "tokenizer_config.json").write_text("{eos_token: </s>")
    with pytest.raises(DataError, match=r"^--tokenizer '.*tok': its tokenizer_config.json is not a JSON object"):
        load_tokenizer(str(tmp_path / "tok"))


def test_uint32_is_used_when_the_vocab_does_not_fit_in_uint16(tmp_path):
    vocab = {f"w{i}": i for i in range(70_000)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "big.json"))
    corpus = write_corpus(tmp_path / "corpus", {"a.txt": "w69999 w1 w65537 w2"})

    index = prepare(str(corpus), str(tmp_path / "out"), tokenizer=str(tmp_path / "big.json"))
    # No end-of-text token in this vocab, so one is appended after it.
    assert (index["dtype"], index["vocab_size"], index["eot_token"]) == ("uint32", 70_001, 70_000)
    stream = [69999, 1, 65537, 2, 70_000]
    assert np.fromfile(tmp_path / "out" / SHARD0, dtype="<u4").tolist() == stream
    assert TokenDataset.open(str(tmp_path / "out"), seq_len=4).sample(0).tolist() == stream


def test_missing_tokenizers_library_says_how_to_install(tmp_path, monkeypatch):
    train_bpe(tmp_path / "tok", ["some text"])
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(DataError, match="pip install tokenizers"):
        load_tokenizer(str(tmp_path / "tok"))


def test_unknown_or_malformed_tokenizer_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no tokenizer.json"):
        load_tokenizer(str(tmp_path / "nope"))
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "tokenizer.model").write_bytes(b"sentencepiece")
    with pytest.raises(DataError, match=r"SentencePiece tokenizer.model but no tokenizer.json: write one beside it "
                                        r"with AutoTokenizer.from_pretrained\(DIR\).save_pretrained\(DIR\)"):
        load_tokenizer(str(tmp_path / "old"))
    (tmp_path / "tokenizer.json").write_text('{"model": 1}')
    with pytest.raises(DataError, match="not a valid HuggingFace tokenizer.json"):
        load_tokenizer(str(tmp_path))


def test_open_reads_only_the_index_and_bad_shards_fail_when_read(tmp_path, out):
    url, options = out
    corpus = write_corpus(tmp_path / "corpus", {"a.txt": "x" * 40})
    prepare(str(corpus), url, shard_tokens=10, options=options)
    root = resolve(url, options)
    root.child(SHARD0).write_bytes(b"\0" * 6)
    root.child(SHARD1).delete_file()

    ds = TokenDataset.open(url, seq_len=3, options=options)
    assert ds.num_samples == 4 * 3 + 0  # shards of 10,10,10,10 tokens and a last one of 1 (the EOT)
    with pytest.raises(DataError, match=f"shard {SHARD0} has 6 bytes, index says 20: re-run prepare"):
        ds.sample(0)
    with pytest.raises(DataError, match=f"{SHARD1} is missing"):
        ds.sample(3)
    assert ds.sample(6).tolist() == [ord("x")] * 4


def test_s3_batch_matches_local(tmp_path, s3_bucket):
    bucket_url, options = s3_bucket
    rng = np.random.default_rng(0)
    docs = {f"{i:02d}.txt": "".join(rng.choice(list("abcdef ✓\n"), size=300)) for i in range(12)}
    corpus = write_corpus(tmp_path / "corpus", docs)
    prepare(str(corpus), str(tmp_path / "out"), shard_tokens=500)
    prepare(str(corpus), f"{bucket_url}/tokens", shard_tokens=500, options=options)

    local = TokenDataset.open(str(tmp_path / "out"), seq_len=16)
    remote = TokenDataset.open(f"{bucket_url}/tokens", seq_len=16, options=options)
    assert remote.num_samples == local.num_samples
    ids = rng.permutation(local.num_samples)[:40].tolist()
    got = remote.batch(ids)
    assert got.dtype == torch.int64 and got.shape == (40, 17)
    assert torch.equal(got, local.batch(ids))
    assert torch.equal(got[0], torch.from_numpy(local.sample(ids[0])))


def test_dataset_pickles_without_its_open_shards(tmp_path, out):
    url, options = out
    corpus = write_corpus(tmp_path / "corpus", {"a.txt": "abcdefgh" * 1000})
    prepare(str(corpus), url, shard_tokens=4000, options=options)
    ds = TokenDataset.open(url, seq_len=8, options=options)
    first = ds.batch([0, 1, ds.num_samples - 1])

    blob = pickle.dumps(ds)
    assert len(blob) < 2000  # the open shards (8000 tokens) are not in it
    assert torch.equal(pickle.loads(blob).batch([0, 1, ds.num_samples - 1]), first)


def test_out_of_range_sample_is_an_index_error(tmp_path):
    prepare(str(write_corpus(tmp_path / "corpus", {"a.txt": "abcdefghij"})), str(tmp_path / "out"))
    ds = TokenDataset.open(str(tmp_path / "out"), seq_len=2)
    assert ds.num_samples == 5
    for i in (-1, 5):
        with pytest.raises(IndexError):
            ds.sample(i)


def test_seq_len_must_fit_in_the_data(tmp_path):
    prepare(str(write_corpus(tmp_path / "corpus", {"a.txt": "abc"})), str(tmp_path / "out"))
    with pytest.raises(DataError, match=r"fewer tokens than seq_len\+1 = 5 .*lower train.seq_len or add data"):
        TokenDataset.open(str(tmp_path / "out"), seq_len=4)
    with pytest.raises(DataError, match="seq_len must be at least 1"):
        TokenDataset.open(str(tmp_path / "out"), seq_len=0)


def test_missing_index_says_to_run_prepare(tmp_path, out):
    url, options = out
    with pytest.raises(
        DataError, match=re.escape(f"no index.json at {url}: run `spotray prepare --input ... --output {url}`")
    ):
        TokenDataset.open(url, seq_len=4, options=options)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"dtype": "int8"}, "dtype"),
        ({"vocab_size": 70_000}, "dtype"),
        ({"format": "other"}, "format"),
        ({"version": 2}, "version"),
        ({"total_tokens": 999}, "shards"),
        ({"shards": [{"name": "../escape.bin", "tokens": 13, "sha256": ""}]}, "shards"),
        ({"tokenizer_companions": ["../tokenizer_config.json"]}, "tokenizer_companions"),
    ],
)
def test_bad_index_fields_are_named(tmp_path, change, field):
    index = prepare(str(write_corpus(tmp_path / "corpus", {"a.txt": "hello world"})), str(tmp_path / "out"))
    (tmp_path / "out" / "index.json").write_text(json.dumps(index | change))
    with pytest.raises(DataError, match=f"field '{field}'"):
        TokenDataset.open(str(tmp_path / "out"), seq_len=2)


def test_unreadable_index_json(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "index.json").write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        TokenDataset.open(str(tmp_path / "out"), seq_len=2)


def test_empty_corpus_is_refused_and_writes_no_dataset(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", {"a.txt": "", "b/c.txt": ""})
    with pytest.raises(DataError, match=re.escape(f"empty corpus: {corpus} contains no text")):
        prepare(str(corpus), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "index.json").exists()
    assert not list((tmp_path / "out").rglob("shard-*"))


def test_no_matching_files_names_the_pattern(tmp_path):
    pattern = str(tmp_path / "nothing" / "*.txt")
    with pytest.raises(DataError, match=re.escape(f"--input '{pattern}' matched no files")):
        prepare(pattern, str(tmp_path / "out"))


def test_refuses_to_overwrite_a_prepared_dataset(tmp_path, out):
    url, options = out
    prepare(str(write_corpus(tmp_path / "one", {"a.txt": "first corpus"})), url, options=options)
    root = resolve(url, options)
    names = ["index.json"] + [s["name"] for s in json.loads(root.child("index.json").read_bytes())["shards"]]
    before = {name: root.child(name).read_bytes() for name in names}

    with pytest.raises(DataError, match="already exists: refusing to overwrite.*choose another --output or delete it"):
        prepare(str(write_corpus(tmp_path / "two", {"a.txt": "second corpus!"})), url, options=options)
    assert {name: root.child(name).read_bytes() for name in names} == before

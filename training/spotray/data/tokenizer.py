"""Tokenizers: a built-in byte-level one, or a HuggingFace ``tokenizer.json``."""

from __future__ import annotations

import functools
import hashlib
import json

import numpy as np

from spotray.errors import DataError, StorageError
from spotray.storage import Location, StorageOptions, resolve

BYTES = "bytes"
# Where a tokenizer_config.json names no eos_token: the end-of-text tokens of GPT-2 and Qwen, Llama 2 and Mistral,
# Gemma, and Llama 3.
_EOT_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
# What AutoTokenizer reads beside a tokenizer.json for the special tokens and the chat template: a prepared dataset
# keeps a copy of those found, and `spotray export` writes them next to the model.
COMPANION_FILES = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json")
SENTENCEPIECE_FILE = "tokenizer.model"  # what older model directories hold instead of a tokenizer.json


class Tokenizer:
    """Turns text into token ids; ``eot_token`` ends each document. ``file`` is the tokenizer.json, if any, that
    a prepared dataset keeps a copy of (and ``spotray export`` writes next to the model), ``companions`` the
    ``COMPANION_FILES`` found beside it, by name."""

    vocab_size: int
    eot_token: int
    tokenizer_id: str
    file: bytes | None = None
    companions: dict[str, bytes]

    def encode_documents(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The documents' tokens, each ending with ``eot_token``, as one int64 array; and each document's length
        (its end-of-text included)."""
        raise NotImplementedError


class ByteTokenizer(Tokenizer):
    """Token = UTF-8 byte value (0..255); 256 is end-of-text."""

    vocab_size = 257
    eot_token = 256
    tokenizer_id = BYTES

    def __init__(self) -> None:
        self.companions = {}

    def encode_documents(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        encoded = [text.encode("utf-8") for text in texts]
        lengths = np.fromiter((len(b) + 1 for b in encoded), dtype=np.int64, count=len(encoded))
        joined = np.frombuffer(b"".join(encoded), dtype=np.uint8).astype(np.int64)
        return np.insert(joined, np.cumsum(lengths - 1), self.eot_token), lengths


class HFTokenizer(Tokenizer):
    """A document is encoded as ``tokenizer(text)`` encodes it (with the special tokens its template adds, such as
    Llama's beginning-of-text), and ends with the tokenizer's ``eos_token``."""

    def __init__(self, data: bytes, source: str, companions: dict[str, bytes]):
        try:
            import tokenizers
        except ImportError:
            raise DataError(f"tokenizer '{source}' needs the tokenizers library: pip install tokenizers") from None
        try:
            self._tok = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # noqa: BLE001 - tokenizers raises bare Exception for malformed files
            raise DataError(f"tokenizer '{source}' is not a valid HuggingFace tokenizer.json: {exc}") from None
        self.vocab_size = self._tok.get_vocab_size()
        names = (_eos_token(companions.get("tokenizer_config.json"), source), *_EOT_NAMES)
        eot = next((i for i in map(self._tok.token_to_id, filter(None, names)) if i is not None), None)
        if eot is None:
            eot = self.vocab_size
            self.vocab_size += 1
        self.eot_token = eot
        self.tokenizer_id = tokenizer_id(data)
        self.file = data
        self.companions = companions
        self._source = source

    def __reduce__(self):
        # A process that runs many prepare tasks builds the Rust tokenizer once: building one per task grew each
        # long-lived Ray worker by about 2 MB a task.
        return _shared_hf_tokenizer, (self.file, self._source, tuple(sorted(self.companions.items())))

    def encode_documents(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        flat: list[int] = []
        lengths = np.empty(len(texts), dtype=np.int64)
        for k, encoding in enumerate(self._tok.encode_batch_fast(texts, add_special_tokens=True)):
            ids = encoding.ids
            if not ids or ids[-1] != self.eot_token:  # a template may end a text with it already
                ids = [*ids, self.eot_token]
            flat.extend(ids)
            lengths[k] = len(ids)
        return np.array(flat, dtype=np.int64), lengths


def tokenizer_id(tokenizer_json: bytes) -> str:
    """How a prepared dataset's index names the Hugging Face tokenizer.json it was prepared with."""
    return "hf:" + hashlib.sha256(tokenizer_json).hexdigest()[:16]


def same_ids(tokenizer_json: bytes, other: bytes) -> bool:
    """Whether two tokenizer.json files give text the same ids: the same vocabulary and added tokens (a file saved
    again, with other bytes, does)."""
    def ids(data: dict) -> tuple:
        added = sorted((token.get("id"), token.get("content")) for token in data.get("added_tokens") or [])
        return data.get("model", {}).get("vocab"), added

    return ids(json.loads(tokenizer_json)) == ids(json.loads(other))


@functools.lru_cache(maxsize=2)
def _shared_hf_tokenizer(data: bytes, source: str, companions: tuple[tuple[str, bytes], ...]) -> HFTokenizer:
    return HFTokenizer(data, source, dict(companions))


def _eos_token(config: bytes | None, source: str) -> str | None:
    """The ``eos_token`` that a tokenizer_config.json names: a string, or an added token's ``content``."""
    if config is None:
        return None
    try:
        eos = json.loads(config).get("eos_token")
    except (ValueError, AttributeError):
        raise DataError(f"--tokenizer '{source}': its tokenizer_config.json is not a JSON object; fix or remove it "
                        "(AutoTokenizer reads it too)") from None
    return eos.get("content") if isinstance(eos, dict) else eos if isinstance(eos, str) else None


def load_tokenizer(spec: str = BYTES, options: StorageOptions | None = None) -> Tokenizer:
    """``"bytes"``, or the URL (local or s3://) of a HuggingFace ``tokenizer.json`` or of a model directory
    holding one."""
    if spec == BYTES:
        return ByteTokenizer()
    location = _tokenizer_json(spec, options)
    try:
        data = location.read_bytes()
    except StorageError:
        if location.parent().child(SENTENCEPIECE_FILE).exists():
            raise DataError(f"--tokenizer '{spec}' holds a SentencePiece {SENTENCEPIECE_FILE} but no tokenizer.json: "
                            "write one beside it with AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR) "
                            "(pip install sentencepiece), then prepare again") from None
        raise DataError(
            f"--tokenizer '{spec}': no tokenizer.json found there; give 'bytes', a HuggingFace tokenizer.json or a "
            "model directory holding one (local or s3://)"
        ) from None
    found = {name: location.parent().child(name).read_bytes_if_exists() for name in COMPANION_FILES}
    return HFTokenizer(data, spec, {name: text for name, text in found.items() if text is not None})


def _tokenizer_json(spec: str, options: StorageOptions | None) -> Location:
    return resolve(spec, options).file_named("tokenizer.json")

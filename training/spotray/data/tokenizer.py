"""Tokenizers: a built-in byte-level one, or a HuggingFace ``tokenizer.json``."""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from spotray.errors import DataError, StorageError
from spotray.storage import Location, StorageOptions, resolve

BYTES = "bytes"
_EOT_NAMES = ("<|endoftext|>", "</s>", "<eos>")
# What AutoTokenizer reads beside a tokenizer.json for the special tokens and the chat template: a prepared dataset
# keeps a copy of those found, and `spotray export` writes them next to the model.
COMPANION_FILES = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json")


class Tokenizer:
    """Turns text into token ids; ``eot_token`` separates documents. ``file`` is the tokenizer.json, if any, that
    a prepared dataset keeps a copy of (and ``spotray export`` writes next to the model)."""

    vocab_size: int
    eot_token: int
    tokenizer_id: str
    file: bytes | None = None

    def encode_documents(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The documents' tokens, each followed by ``eot_token``, as one int64 array; and each document's length
        (its end-of-text included)."""
        raise NotImplementedError


class ByteTokenizer(Tokenizer):
    """Token = UTF-8 byte value (0..255); 256 is end-of-text."""

    vocab_size = 257
    eot_token = 256
    tokenizer_id = BYTES

    def encode_documents(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        encoded = [text.encode("utf-8") for text in texts]
        lengths = np.fromiter((len(b) + 1 for b in encoded), dtype=np.int64, count=len(encoded))
        joined = np.frombuffer(b"".join(encoded), dtype=np.uint8).astype(np.int64)
        return np.insert(joined, np.cumsum(lengths - 1), self.eot_token), lengths


class HFTokenizer(Tokenizer):
    def __init__(self, data: bytes, source: str):
        try:
            import tokenizers
        except ImportError:
            raise DataError(f"tokenizer '{source}' needs the tokenizers library: pip install tokenizers") from None
        try:
            self._tok = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # noqa: BLE001 - tokenizers raises bare Exception for malformed files
            raise DataError(f"tokenizer '{source}' is not a valid HuggingFace tokenizer.json: {exc}") from None
        self.vocab_size = self._tok.get_vocab_size()
        eot = next((i for i in map(self._tok.token_to_id, _EOT_NAMES) if i is not None), None)
        if eot is None:
            eot = self.vocab_size
            self.vocab_size += 1
        self.eot_token = eot
        self.tokenizer_id = "hf:" + hashlib.sha256(data).hexdigest()[:16]
        self.file = data
        self._source = source

    def __reduce__(self):
        # A process that runs many prepare tasks builds the Rust tokenizer once: building one per task grew each
        # long-lived Ray worker by about 2 MB a task.
        return _shared_hf_tokenizer, (self.file, self._source)

    def encode_documents(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        flat: list[int] = []
        lengths = np.empty(len(texts), dtype=np.int64)
        for k, encoding in enumerate(self._tok.encode_batch_fast(texts, add_special_tokens=False)):
            flat.extend(encoding.ids)
            flat.append(self.eot_token)
            lengths[k] = len(encoding.ids) + 1
        return np.array(flat, dtype=np.int64), lengths


@functools.lru_cache(maxsize=2)
def _shared_hf_tokenizer(data: bytes, source: str) -> HFTokenizer:
    return HFTokenizer(data, source)


def load_tokenizer(spec: str = BYTES, options: StorageOptions | None = None) -> Tokenizer:
    """``"bytes"``, or the URL (local or s3://) of a HuggingFace ``tokenizer.json`` or of a model directory
    holding one."""
    if spec == BYTES:
        return ByteTokenizer()
    try:
        data = _tokenizer_json(spec, options).read_bytes()
    except StorageError:
        raise DataError(
            f"--tokenizer '{spec}': no tokenizer.json found there; give 'bytes', a HuggingFace tokenizer.json or a "
            "model directory holding one (local or s3://)"
        ) from None
    return HFTokenizer(data, spec)


def tokenizer_companions(spec: str, options: StorageOptions | None = None) -> dict[str, bytes]:
    """The ``COMPANION_FILES`` beside the tokenizer.json that ``spec`` names, by name; none for the byte tokenizer."""
    if spec == BYTES:
        return {}
    directory = _tokenizer_json(spec, options).parent()
    found = {name: directory.child(name).read_bytes_if_exists() for name in COMPANION_FILES}
    return {name: data for name, data in found.items() if data is not None}


def _tokenizer_json(spec: str, options: StorageOptions | None) -> Location:
    return resolve(spec, options).file_named("tokenizer.json")

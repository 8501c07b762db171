"""The built-in byte tokenizer as Hugging Face files, so that an export of a run trained on it loads with
``AutoTokenizer`` and ``pipeline``: the byte tokenizer itself has no ``tokenizer.json`` to copy."""

from __future__ import annotations

import json

from spotray.data.tokenizer import ByteTokenizer

EOT = "<|endoftext|>"


def byte_tokenizer_files() -> dict[str, bytes]:
    """``tokenizer.json`` and ``tokenizer_config.json``: ids 0..255 are the UTF-8 bytes, 256 is ``EOT`` (also the
    padding); other ids (a model's padded embedding rows) are in no vocabulary, so decoding skips them."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    # Byte-level (GPT-2's) tokens with no merges: every byte is its own token, its id the byte's value.
    tok = Tokenizer(models.BPE(vocab={char: byte for byte, char in bytes_to_unicode().items()}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOT, special=True, normalized=False)])
    assert tok.token_to_id(EOT) == ByteTokenizer.eot_token and tok.get_vocab_size() == ByteTokenizer.vocab_size
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOT, "pad_token": EOT,
              # "<|endoftext|>" in a text is its 13 bytes, as ByteTokenizer reads it; decoding changes no spaces
              "split_special_tokens": True, "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": tok.to_str(pretty=True).encode(),
            "tokenizer_config.json": (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()}

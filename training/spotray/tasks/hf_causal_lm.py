"""A Hugging Face Transformers causal LM as a task: any ``AutoModelForCausalLM`` built from its config."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, cast

import torch

from spotray.data.index import TOKENIZER_NAME
from spotray.data.tokenizer import same_ids, tokenizer_id
from spotray.errors import ConfigError, StorageError
from spotray.storage import Location, resolve
from spotray.tasks import EXPORT_DTYPES, GENERATION_CONFIG, ExportSpec
from spotray.tasks.base import LanguageModelTask, attention_flops_per_token
from spotray.tasks.pretrained import check_directory, load_sharded

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class HFTask(LanguageModelTask):
    def __init__(self, cfg):
        super().__init__(cfg)
        hf = cfg.model.hf
        self.pretrained = hf.pretrained
        self.config = _auto_config(*_config_source(hf, cfg.storage.options()))
        self.source_dtype = _dtype_name(self.config)  # building the model in float32 changes the config's
        self._check_fits_data()
        self.generation_config = None
        if self.pretrained:
            directory = resolve(self.pretrained, cfg.storage.options())
            check_directory(directory, "model.hf.pretrained")
            self._check_prepared_with_its_tokenizer(directory)
            self.generation_config = _generation_config(directory)

    def _check_fits_data(self) -> None:
        model_vocab, data_vocab = self.config.get_text_config().vocab_size, self.dataset.vocab_size
        if self.dataset.eot_token == model_vocab == data_vocab - 1:
            raise ConfigError("data.path", f"the dataset's tokenizer names no end-of-text token, so prepare added one "
                              f"(id {model_vocab}) beyond the model's {model_vocab} tokens", "name the model's "
                              "eos_token in the tokenizer_config.json beside its tokenizer.json and prepare again")
        if model_vocab < data_vocab:
            raise ConfigError("model.hf", f"the model's vocabulary has {model_vocab} tokens, the dataset's tokenizer "
                              f"{data_vocab}", "prepare the data with this model's tokenizer "
                              "(spotray prepare --tokenizer MODEL_DIR) or raise the config's vocab_size")
        positions = getattr(self.config.get_text_config(), "max_position_embeddings", None)
        if positions is not None and positions < self.cfg.train.seq_len:
            raise ConfigError("train.seq_len", f"{self.cfg.train.seq_len} exceeds the model's "
                              f"max_position_embeddings={positions}", "lower train.seq_len")

    def _check_prepared_with_its_tokenizer(self, directory: Location) -> None:
        """A pretrained model learnt its tokenizer's ids: data prepared with another (``bytes``, the default, or
        another vocabulary) would train it on different ones."""
        own = directory.child(TOKENIZER_NAME).read_bytes_if_exists()
        if own is None or self.dataset.tokenizer == tokenizer_id(own):
            return
        copy = self.dataset.tokenizer_files.get(TOKENIZER_NAME)
        if copy is not None and same_ids(copy.read_bytes(), own):
            return
        raise ConfigError("data.path", f"{self.cfg.data.path} was prepared with tokenizer {self.dataset.tokenizer}, "
                          f"not with the model's ({tokenizer_id(own)}, the tokenizer.json in model.hf.pretrained): the "
                          "model would train on ids it did not learn", f"prepare the corpus with `spotray prepare "
                          f"--tokenizer {self.pretrained}` into a new --output and point data.path at it")

    def build_model(self) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        try:
            return AutoModelForCausalLM.from_config(self.config, attn_implementation="sdpa", dtype=torch.float32)
        except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a config it cannot build
            raise ConfigError("model.hf", f"transformers cannot build a causal LM from this config "
                              f"({type(exc).__name__}: {exc})", "check the config's keys and model_type") from None

    def on_materialized(self, model: torch.nn.Module) -> None:
        built = _built(model)
        built.tie_weights()
        for module in built.modules():  # e.g. rotary embedding tables: buffers no checkpoint holds
            if next(module.buffers(recurse=False), None) is not None and not list(module.parameters(recurse=False)):
                built._init_weights(module)

    def init_weights(self, model: torch.nn.Module) -> None:
        _built(model).init_weights()

    def logits(self, model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        return model(input_ids=inputs, use_cache=False).logits

    def shard_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        layer_classes = set(_built(model)._no_split_modules or ())
        return [m for m in model.modules() if type(m).__name__ in layer_classes]

    def flops_per_unit(self, model: torch.nn.Module) -> float:
        text = self.config.get_text_config()
        return super().flops_per_unit(model) + attention_flops_per_token(
            text.num_hidden_layers, self.cfg.train.seq_len, text.hidden_size)

    def export_spec(self) -> ExportSpec:
        return ExportSpec(hf_config={**self.config.to_dict(), "dtype": self.source_dtype},
                          generation_config=self.generation_config)

    def load_pretrained(self, model: torch.nn.Module) -> int:
        return load_sharded(model, resolve(self.pretrained, self.cfg.storage.options()), "model.hf.pretrained")


def _dtype_name(config) -> str:
    """The floating-point type a config says its weights are in (``spotray export`` writes them back in it);
    float32 where it names none."""
    dtype = getattr(config, "dtype", None)
    name = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
    return name if name in EXPORT_DTYPES else "float32"


def _built(model: torch.nn.Module) -> PreTrainedModel:
    """The model ``build_model`` built: the loop hands a task's methods back the model the task built."""
    return cast("PreTrainedModel", model)


def _config_source(hf, options) -> tuple[dict, str]:
    """The config mapping and the setting it came from."""
    if isinstance(hf.config, dict):
        return hf.config, "model.hf.config"
    key, url = ("model.hf.pretrained", hf.pretrained) if hf.pretrained else ("model.hf.config", hf.config)
    try:
        location = resolve(url, options).file_named("config.json")
        text = location.read_text()
    except StorageError:
        raise ConfigError(key, f"no config.json at {url}",
                          "give a config.json file or a directory holding one (local or s3://)") from None
    return _json_object(text, location, key, "give a Transformers config.json"), key


def _generation_config(directory: Location) -> dict | None:
    """The pretrained model's generation_config.json (its stop tokens, sampling defaults), which export writes too."""
    location = directory.child(GENERATION_CONFIG)
    text = location.read_text_if_exists()
    return _json_object(text, location, "model.hf.pretrained", "fix or delete it") if text is not None else None


def _json_object(text: str, location: Location, key: str, fix: str) -> dict:
    try:
        mapping = json.loads(text)
    except ValueError as exc:
        raise ConfigError(key, f"{location.url} is not valid JSON ({exc})", "fix or re-save it") from None
    if not isinstance(mapping, dict):
        raise ConfigError(key, f"{location.url} is not a JSON object", fix)
    return mapping


def _auto_config(mapping: dict, key: str):
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = mapping.get("model_type")
    if model_type is None or model_type not in CONFIG_MAPPING:
        known = "missing" if model_type is None else f"unknown ({model_type!r})"
        raise ConfigError(key, f"model_type is {known}", "give the model_type of a Transformers causal LM, "
                          "e.g. llama or gpt2, as save_pretrained writes it")
    settings = {k: v for k, v in mapping.items() if k not in ("model_type", "transformers_version")}
    try:
        return AutoConfig.for_model(model_type, **settings)
    except Exception as exc:  # noqa: BLE001 - config classes validate with assorted exception types
        raise ConfigError(key, f"not a valid {model_type} config ({type(exc).__name__}: {exc})",
                          "fix the named keys") from None

"""Training configs the tests share."""

from __future__ import annotations

from spotray import config


def make_config(data_path: str, ckpt_path: str, name: str, *overrides: str, model: dict | None = None,
                cost: dict | None = None) -> config.TrainConfig:
    """A tiny GPT (or the ``model`` section given) on 2 workers, 40 steps, a checkpoint every 10; ``cost``: that
    section, where the overrides cannot say it (instance types hold dots)."""
    base = [
        f"data.path={data_path}", f"checkpoint.path={ckpt_path}", f"run.name={name}",
        "model.preset=tiny", "train.seq_len=32", "train.global_batch_size=12", "train.max_steps=40",
        "train.warmup_steps=5", "train.lr=0.003", "train.log_every=5", "checkpoint.every_steps=10",
        "checkpoint.keep_last=10", "scaling.num_workers=2", "seed=1",
    ]
    sections = {key: value for key, value in (("model", model), ("cost", cost)) if value}
    return config.load(None, base + list(overrides), base=sections or None)

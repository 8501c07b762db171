"""``spotray demo``: the main job on the embedded default — the stdlib corpus, a tiny GPT, DDP on 2 workers."""

from __future__ import annotations

import sysconfig
import time
from importlib import resources

from training import config, launch
from training.data.prepare import prepare
from training.storage import resolve


def stdlib_corpus(workdir: str) -> str:
    """Tokenize the Python standard library's own source once; later demos reuse it."""
    data_url = resolve(workdir).child("data", "stdlib").url
    if not resolve(data_url).child("index.json").exists():
        prepare(f"{sysconfig.get_paths()['stdlib']}/**/*.py", data_url)
    return data_url


def demo_config_path() -> str:
    return str(resources.files("training") / "configs" / "demo.yaml")


def run(workdir: str) -> dict:
    data_url = stdlib_corpus(workdir)
    run_name = time.strftime("demo-%Y%m%d-%H%M%S")
    cfg = config.load(demo_config_path(), [f"data.path={data_url}", f"checkpoint.path={resolve(workdir).url}",
                                           f"run.name={run_name}"])
    return launch.run(cfg)

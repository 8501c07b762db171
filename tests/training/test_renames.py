"""The names of earlier versions: ``training.*`` (up to 0.1.0) and the side-by-side modules of ``spotray.*`` chain to
where each module lives now, and nothing is reachable by two paths."""

import importlib.util

import pytest

from spotray.errors import ConfigError
from spotray.renames import MOVED, renamed
from spotray.tasks.load import load_task
from tests.training.configs import make_config


@pytest.mark.parametrize(("old", "now"), [
    ("training.checkpoint", "spotray.checkpoints.dcp"),  # what a 0.1.0 checkpoint's .metadata pickles
    ("spotray.checkpoint", "spotray.checkpoints.dcp"),  # and one written before the packages
    ("training.data.progress", "spotray.data.prepare_progress"),
    ("training.data.dataset", "spotray.data.dataset"),
    ("training", "spotray"),
    ("spotray.tasks.hf", "spotray.tasks.hf_causal_lm"),
    ("spotray.interval", "spotray.worker.cadence"),
])
def test_an_old_module_name_chains_to_where_the_module_lives_now(old, now):
    assert renamed(old) == now


@pytest.mark.parametrize("name", ["spotray.checkpoints.dcp", "spotray.data.dataset", "spotray", "trainingx.checkpoint",
                                  "mypackage.checkpoint"])
def test_a_current_or_foreign_module_is_left_alone(name):
    assert renamed(name) is None


@pytest.mark.parametrize(("old", "now"), sorted(MOVED.items()))
def test_every_moved_module_lives_at_its_new_name_alone(old, now):
    assert importlib.util.find_spec(f"spotray.{now}") is not None
    assert importlib.util.find_spec(f"spotray.{old}") is None


def test_a_task_path_of_the_side_by_side_layout_names_the_new_one_in_one_line(tmp_path):
    cfg = make_config(str(tmp_path / "data"), str(tmp_path / "runs"), "old", "model.task=spotray.tasks.hf:make_task")
    with pytest.raises(ConfigError, match=r"'spotray.tasks.hf' is spotray's own module, which is now named "
                                          r"'spotray.tasks.hf_causal_lm'.*model.task=spotray.tasks.hf_causal_lm"):
        load_task(cfg)

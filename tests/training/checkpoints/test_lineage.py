"""A run's checkpoints are one lineage (issue 28): a run that resumes below its newest committed step, because that
one cannot be read, sets it aside, and neither retention, ``spotray status`` nor ``spotray export`` counts it again.

The scenario as a user met it: train to step 20 (checkpoints at 10 and 20), a bad disk flips 64 bytes of step 20,
rerun with a shorter interval and ``keep_last`` to step 18, then run on to ``max_steps``."""

from __future__ import annotations

import pytest

from spotray.checkpoints.dcp import checkpoints_root, list_committed
from spotray.export import ExportError, export
from spotray.reports import status
from spotray.worker.attempt import run_root
from tests.training.configs import make_config
from tests.training.runs import train_locally


def flip_64_bytes(location) -> None:
    data = bytearray(location.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    location.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def uninterrupted(dataset_url, tmp_path_factory):
    """workers -> the summary of 40 steps on that many workers without a stop."""
    runs = {}

    def summary(workers: int) -> dict:
        if workers not in runs:
            root = str(tmp_path_factory.mktemp("uninterrupted"))
            runs[workers] = train_locally(make_config(dataset_url, root, "straight", f"scaling.num_workers={workers}"))
        return runs[workers]
    return summary


# The 2-worker case in make test; test_checkpoint sets aside, restores async saves and rides out outages on S3 there.
@pytest.mark.parametrize(("where", "workers", "keep_last", "save_async"), [
    ("local", 1, 1, False), ("local", 2, 2, False),
    ("local", 1, 1, True), ("s3", 1, 1, True)])
@pytest.mark.e2e
def test_a_run_resumed_below_an_unreadable_checkpoint_keeps_its_own_and_trains_to_the_end(
        where, workers, keep_last, save_async, uninterrupted, dataset_url, tmp_path, request):
    storage: tuple[str, ...] = ()
    ckpt_path = str(tmp_path / "runs")
    if where == "s3":
        bucket_url, options = request.getfixturevalue("s3_bucket")
        ckpt_path, storage = f"{bucket_url}/runs", (f"storage.endpoint_url={options.endpoint_url}",)

    def config(*overrides: str):
        return make_config(dataset_url, ckpt_path, "r", f"scaling.num_workers={workers}",
                           f"checkpoint.async={save_async}", *storage, *overrides)

    cfg = config()
    train_locally(config("checkpoint.every_steps=10", "checkpoint.keep_last=2", "train.stop_at_step=20"))
    root = run_root(cfg)
    ckpts = checkpoints_root(root)
    flip_64_bytes(ckpts.child("step_000000020", "__0_0.distcp"))

    second = train_locally(config("checkpoint.every_steps=7", f"checkpoint.keep_last={keep_last}",
                                  "train.stop_at_step=18"))
    assert second["final_step"] == 18
    assert [c.step for c in list_committed(ckpts)] == [18, 14][:keep_last]
    assert max(int(step) for step in second["losses"]) == 18  # steps 19-20 of the first run are not its history
    seen = status.gather(root.url, cfg.storage.options())
    assert seen["checkpoints"][0]["step"] == 18
    [aside] = seen["set_aside"]
    assert (aside["step"], aside["resumed_from"]) == (20, 10) and "is corrupted" in aside["reason"]
    assert aside["url"].startswith(ckpts.child("set-aside", "step_000000020.").url)

    final = train_locally(cfg)
    assert final["final_step"] == 40
    assert final["param_sha256"] == uninterrupted(workers)["param_sha256"]  # resumed from its own step 18, exactly
    seen = status.gather(root.url, cfg.storage.options())
    assert seen["attempts"][-1]["from_step"] == 18
    assert seen["checkpoints"][0]["step"] == 40 and [a["step"] for a in seen["set_aside"]] == [20]
    assert root.child("checkpoints", "set-aside").list_names() == [aside["url"].rsplit("/", 1)[1]]


@pytest.fixture(scope="module")
def run_with_a_set_aside_step(dataset_url, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("set-aside"))
    cfg = make_config(dataset_url, root, "r", "scaling.num_workers=1", "train.stop_at_step=20",
                      "train.max_steps=20")
    train_locally(cfg)
    flip_64_bytes(checkpoints_root(run_root(cfg)).child("step_000000020", "__0_0.distcp"))
    train_locally(make_config(dataset_url, root, "r", "scaling.num_workers=1", "train.max_steps=18",
                              "checkpoint.every_steps=4"))
    return run_root(cfg)


@pytest.mark.e2e
def test_export_takes_the_lineages_newest_and_refuses_a_set_aside_step_saying_why(run_with_a_set_aside_step,
                                                                                   tmp_path):
    assert export(run_with_a_set_aside_step.url, str(tmp_path / "newest"))["step"] == 18
    with pytest.raises(ExportError, match=r"--step 20 was set aside from the run's lineage, to .*set-aside/"
                                          r"step_000000020\..* because it cannot be read \(.*is corrupted.*\); the "
                                          r"run went on from step 10: export the newest, step 18"):
        export(run_with_a_set_aside_step.url, str(tmp_path / "aside"), step=20)


def test_status_names_the_set_aside_step_in_its_text(run_with_a_set_aside_step):
    text = status.format_text(status.gather(run_with_a_set_aside_step.url))
    checkpoints = next(line for line in text.splitlines() if line.startswith("checkpoints"))
    assert checkpoints.startswith("checkpoints  step 18 ") and "step 20" not in checkpoints
    [aside] = [line for line in text.splitlines() if line.startswith("set aside")]
    assert aside.startswith("set aside    step 20 in ") and "the run went on from step 10" in aside

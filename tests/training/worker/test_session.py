"""The session API of a user's own loop (``spotray.restore`` ... ``should_stop``) on a real gloo process group:
one copy per file, the commit marker last, one download per directory, nothing partial resumed from."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

import spotray
from spotray import config
from spotray.checkpoints.dcp import COMMIT_MARKER, checkpoints_root, list_committed
from spotray.checkpoints.script_files import FilesPrefetch
from spotray.drills.process_group import run_on_process_group
from spotray.errors import ConfigError
from spotray.storage import resolve
from spotray.worker import session
from spotray.worker.attempt import WorkerEnv
from spotray.worker.cadence import Cadence
from tests.repo import REPO
from tests.training.records_outage import first_loss_log_write_fails


def script_config(runs: Path, *sets: str) -> dict:
    """A script run in ``runs``; the nodes' local dir beside it (``script.local_dir`` in ``sets`` gives another)."""
    raw = {"script": {"path": "train.py", "local_dir": str(runs.parent / "local")}, "checkpoint": {"path": str(runs)},
           "run": {"name": "s"}}
    return config.merge(raw, config.parse_overrides(list(sets)))


def open_session(rank: int, world_size: int, raw: dict) -> session.Session:
    return session.Session(config.from_dict(raw), WorkerEnv(rank, world_size, torch.device("cpu"), lambda _: None))


def write_files(directory: Path, rank: int, step: int) -> None:
    """What a Trainer writes: shared files (written by rank 0 where ranks share a disk) and one per rank."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"rng_state_{rank}.pth").write_bytes(os.urandom(1000 + rank))
    (directory / "model.safetensors").write_bytes(bytes([step % 256]) * 50_000)


def commit_worker(rank: int, world_size: int, raw: dict, dirs: list[str], slow_rank: int | None) -> dict:
    """Each rank writes to its own directory (its node's disk) and commits step 10."""
    if rank == slow_rank:  # this rank's upload ends last: the marker must still come after it
        from spotray.checkpoints import script_files

        put = script_files._put

        def slow_put(source, target):
            time.sleep(1.0)
            return put(source, target)

        script_files._put = slow_put
    current = open_session(rank, world_size, raw)
    current.restore(str(Path(dirs[rank]).parent / "restored"))
    write_files(Path(dirs[rank]), rank, 10)
    current.commit(dirs[rank], 10)
    current.finish(moved=False)
    return {"uploaded_at": time.time()}


def restore_worker(rank: int, world_size: int, raw: dict, shared_dir: str) -> list[tuple[int | None, int, list[str]]]:
    """Both ranks restore into the same directory (one node): one of them downloads."""
    current = open_session(rank, world_size, raw)
    step = current.restore(shared_dir)
    files = sorted(os.listdir(shared_dir))
    gathered: list[Any] = [None] * world_size
    torch.distributed.all_gather_object(gathered, (step, current.files.bytes_read, files))
    return gathered


@pytest.mark.e2e
def test_files_reach_storage_once_before_the_marker_and_come_back_once_per_directory_never_cut_short(tmp_path):
    runs, raw = tmp_path / "runs", script_config(tmp_path / "runs")
    dirs = [str(tmp_path / f"node{r}" / "checkpoint-10") for r in range(2)]
    run_on_process_group(commit_worker, (raw, dirs, 1), world_size=2)
    root = checkpoints_root(resolve(str(runs)).child("s"))
    (good,) = list_committed(root)
    assert good.is_files and good.world_size == 2
    assert sorted(good.files) == ["files/model.safetensors", "files/rng_state_0.pth", "files/rng_state_1.pth"]
    for name, entry in good.files.items():
        stored = Path(good.location.child(name).path)
        assert (stored.stat().st_size, zlib.crc32(stored.read_bytes())) == (entry["size"], entry["crc32"])
        assert stored.stat().st_mtime <= good.committed_at, f"{name} was stored after the commit marker"
    # A newer checkpoint whose upload was cut short: its marker names a file that never arrived.
    cut = root.child("step_000000020")
    for name in good.files:
        cut.child(name).write_bytes(Path(good.location.child(name).path).read_bytes())
    marker = json.loads(good.location.child(COMMIT_MARKER).read_text())
    cut.child(COMMIT_MARKER).write_text(json.dumps({**marker, "step": 20}))
    cut.child("files/rng_state_1.pth").delete_file()
    new_node = script_config(runs, f"script.local_dir={tmp_path / 'new-node'}")  # it holds no copy of its own
    ranks = run_on_process_group(restore_worker, (new_node, str(tmp_path / "restored")), world_size=2)
    assert [step for step, _, _ in ranks] == [10, 10], "the cut-short checkpoint is never resumed from"
    assert sum(read for _, read, _ in ranks) == good.nbytes, "each byte read once for the one directory"
    assert ranks[0][2] == ranks[1][2] == [".spotray-restored", "model.safetensors", "rng_state_0.pth",
                                          "rng_state_1.pth"]
    assert [c.step for c in list_committed(root)] == [10], "the damaged one is set aside"


def prefetching_restore_worker(rank: int, world_size: int, raw: dict, shared_dir: str) -> list:
    """One node: the first rank to lock the node's local dir prefetches the newest checkpoint; both then restore."""
    messages: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]  # a stub emit
    logger = logging.getLogger("spotray.checkpoints.script_files")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    current = open_session(rank, world_size, raw)
    step = current.restore(shared_dir)
    scratch = Path(session.local_dir(current.cfg), "prefetch")
    gathered = [None] * world_size
    torch.distributed.all_gather_object(gathered, (step, current.files.bytes_read, messages, scratch.exists()))
    return gathered


def test_one_rank_per_node_prefetches_the_newest_checkpoint_and_the_restore_takes_it(tmp_path):
    runs, local = tmp_path / "runs", tmp_path / "local"
    raw = script_config(runs, f"script.local_dir={local}")
    dirs = [str(tmp_path / f"node{r}" / "checkpoint-10") for r in range(2)]
    run_on_process_group(commit_worker, (raw, dirs, None), world_size=2)
    (good,) = list_committed(checkpoints_root(resolve(str(runs)).child("s")))
    new_node = script_config(runs, f"script.local_dir={tmp_path / 'new-node'}")  # it holds no copy of its own
    ranks = run_on_process_group(prefetching_restore_worker, (new_node, str(tmp_path / "restored")), world_size=2)
    assert [step for step, *_ in ranks] == [10, 10]
    assert sorted(read for _, read, _, _ in ranks) == [0, good.nbytes], "one rank read it, once"
    assert any("(prefetched)" in message for _, read, messages, _ in ranks if read for message in messages), ranks
    assert not any(exists for *_, exists in ranks), "nothing is left in the prefetch folder"
    assert sorted(os.listdir(tmp_path / "restored")) == [".spotray-restored", "model.safetensors",
                                                         "rng_state_0.pth", "rng_state_1.pth"]


def own_node_worker(rank: int, world_size: int, raw: dict, tmp: str, restore: bool) -> list:
    """Each rank on a node of its own (its local dir, its Trainer's directory): commits step 10, or restores it."""
    os.environ[session.LOCAL_DIR_ENV] = f"{tmp}/local{rank}"
    current = open_session(rank, world_size, raw)
    if restore:
        step = current.restore(f"{tmp}/node{rank}/resumed")
    else:
        current.restore(f"{tmp}/node{rank}/first")
        write_files(Path(tmp, f"node{rank}", "checkpoint-10"), rank, 10)
        current.commit(f"{tmp}/node{rank}/checkpoint-10", 10)
        step = None
    current.finish(moved=False)
    gathered = [None] * world_size
    torch.distributed.all_gather_object(gathered, (step, current.files.bytes_read))
    return gathered


@pytest.mark.e2e
def test_a_node_takes_the_files_it_committed_from_its_own_disk_and_downloads_the_rest(tmp_path):
    """After a restart on the same nodes each reads from storage only what another node wrote, or what changed."""
    raw = script_config(tmp_path / "runs")
    del raw["script"]["local_dir"]  # each rank's own, below
    run_on_process_group(own_node_worker, (raw, str(tmp_path), False), world_size=2)
    (good,) = list_committed(checkpoints_root(resolve(str(tmp_path / "runs")).child("s")))
    model = tmp_path / "node0" / "checkpoint-10" / "model.safetensors"
    model.write_bytes(b"\xff" + model.read_bytes()[1:])  # node 0's copy changed: same size, other bytes
    ranks = run_on_process_group(own_node_worker, (raw, str(tmp_path), True), world_size=2)
    sizes = {name.removeprefix("files/"): entry["size"] for name, entry in good.files.items()}
    assert ranks == [(10, sizes["model.safetensors"] + sizes["rng_state_1.pth"]), (10, sizes["rng_state_0.pth"])]
    for rank in range(2):
        resumed = tmp_path / f"node{rank}" / "resumed"
        for name, entry in good.files.items():
            assert zlib.crc32((resumed / name.removeprefix("files/")).read_bytes()) == entry["crc32"], (rank, name)


def test_a_prefetch_of_another_checkpoint_is_not_taken_and_leaves_nothing(tmp_path):
    runs = tmp_path / "runs"
    raw = script_config(runs)
    dirs = [str(tmp_path / f"node{r}" / "checkpoint-10") for r in range(2)]
    run_on_process_group(commit_worker, (raw, dirs, None), world_size=2)
    root = checkpoints_root(resolve(str(runs)).child("s"))
    (good,) = list_committed(root)
    prefetch = FilesPrefetch.on_this_disk(root, tmp_path / "local")
    assert prefetch is not None
    assert FilesPrefetch.on_this_disk(root, tmp_path / "local") is None, "one per disk"
    older = dataclasses.replace(good, location=root.child("step_000000005"))
    assert prefetch.take(older) is None
    taken = prefetch.take(good)
    assert taken is not None
    fetched, read = taken
    assert read == good.nbytes and sorted(p.name for p in fetched.iterdir()) == [
        ".spotray-restored", "model.safetensors", "rng_state_0.pth", "rng_state_1.pth"]
    prefetch.discard()
    assert not (tmp_path / "local" / "prefetch").exists()
    assert FilesPrefetch.on_this_disk(root, tmp_path / "local") is not None, "the lock is released"


def test_a_checkpoint_saved_by_another_world_size_is_refused_unless_allowed(tmp_path):
    cfg = config.from_dict(script_config(tmp_path))
    with pytest.raises(ConfigError, match="scaling.num_workers.*saved by 2.*allow_world_size_change"):
        session.check_world_size(cfg, saved_by=2, workers=4)
    allowed = config.from_dict(script_config(tmp_path, "script.allow_world_size_change=true"))
    session.check_world_size(allowed, saved_by=2, workers=4)


def test_a_scripts_commit_waits_for_the_records_of_its_steps(tmp_path, monkeypatch):
    """As the loop's checkpoints do (``test_loop``): a kill after the commit must leave no committed step unrecorded."""
    commits = first_loss_log_write_fails(monkeypatch)
    current = open_session(0, 1, script_config(tmp_path / "runs"))
    current.restore(str(tmp_path / "checkpoint"))
    for step in (1, 2, 3):
        current.report(step, loss=1.0)
    write_files(tmp_path / "checkpoint", 0, 3)
    current.commit(str(tmp_path / "checkpoint"), 3)
    current.finish(moved=False)
    assert commits == [(3, 3)]


def test_a_trainers_evaluation_and_save_are_their_own_time_not_the_next_steps(tmp_path, monkeypatch):
    """The callback's hooks as a Trainer calls them: step 1, an evaluation (3 s), a save (2 s), step 2."""
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    from spotray import hf
    from spotray.accounts import goodput, ledger

    clock = [0.0]
    fake_time = SimpleNamespace(perf_counter=lambda: clock[0], time=time.time, sleep=time.sleep)
    monkeypatch.setattr(session, "time", fake_time)
    monkeypatch.setattr(hf, "time", fake_time)
    current = open_session(0, 1, script_config(tmp_path / "runs"))
    session.begin(current)
    current.restore(str(tmp_path / "resume"))
    callback, args = hf.SpotrayCallback(), SimpleNamespace(output_dir=str(tmp_path / "out"))
    state, control = TrainerState(max_steps=10), TrainerControl()
    callback.on_train_begin(args, state, control)
    for clock[0], hook in ((1.0, "step"), (4.0, "evaluate"), (6.0, "save"), (7.0, "step")):
        if hook == "step":
            state.global_step += 1
            callback.on_step_end(args, state, control)
        elif hook == "evaluate":
            callback.on_evaluate(args, state, control, metrics={"eval_loss": 2.0, "eval_accuracy": 0.5,
                                                                "eval_runtime": 3.0, "epoch": 0.1})
        else:
            write_files(tmp_path / "out" / "checkpoint-1", 0, 1)
            callback.on_save(args, state, control)
    current.finish(moved=False)
    session.begin(None)
    attempts, attempt = current.attempts, current.attempt_id
    assert {step: r.seconds for step, r in ledger.read_steps(attempts, attempt).items()} == {1: 1.0, 2: 1.0}
    assert ledger.read_evals(attempts, attempt)[1]["metrics"] == {"val_loss": 2.0, "accuracy": 0.5}
    status = goodput.read_status(attempts, attempt)
    assert status is not None and (status["eval_s"], status["checkpoint_save_s"]) == (3.0, 2.0)


@pytest.mark.parametrize("report_first", [True, False])
def test_a_loops_own_save_is_checkpoint_time_not_a_steps(tmp_path, monkeypatch, report_first):
    """The five calls: step 1 trains 1 s, the loop's own save (``accelerator.save_state``) takes 2 s between
    ``should_save`` and ``commit``, step 2 trains 1 s; reported before the save or after it."""
    from types import SimpleNamespace

    from spotray.accounts import goodput, ledger

    clock = [0.0]
    monkeypatch.setattr(session, "time", SimpleNamespace(perf_counter=lambda: clock[0], time=time.time,
                                                         sleep=time.sleep))
    current = open_session(0, 1, script_config(tmp_path / "runs", "checkpoint.every_steps=1"))
    session.begin(current)
    spotray.restore(str(tmp_path / "resume"))
    clock[0] = 1.0
    if report_first:
        spotray.report(1, loss=1.0)
    assert spotray.should_save(1)
    clock[0] = 3.0
    write_files(tmp_path / "save-1", 0, 1)
    spotray.commit(str(tmp_path / "save-1"), 1)
    if not report_first:
        spotray.report(1, loss=1.0)
    clock[0] = 4.0
    spotray.report(2, loss=1.0)
    current.finish(moved=False)
    session.begin(None)
    attempts, attempt = current.attempts, current.attempt_id
    assert {step: r.seconds for step, r in ledger.read_steps(attempts, attempt).items()} == {1: 1.0, 2: 1.0}
    status = goodput.read_status(attempts, attempt)
    assert status is not None and status["checkpoint_save_s"] == 2.0


def test_a_loops_evaluation_is_recorded_as_an_evaluation_and_other_step_metrics_are_warned_about(
        tmp_path, monkeypatch, caplog):
    """Step 1 trains 1 s, an evaluation takes 3 s, step 2 trains 1 s and reports a name that is no step metric."""
    from types import SimpleNamespace

    from spotray.accounts import goodput, ledger

    clock = [0.0]
    monkeypatch.setattr(session, "time", SimpleNamespace(perf_counter=lambda: clock[0], time=time.time,
                                                         sleep=time.sleep))
    current = open_session(0, 1, script_config(tmp_path / "runs"))
    session.begin(current)
    spotray.restore(str(tmp_path / "resume"))
    clock[0] = 1.0
    spotray.report(1, loss=1.0)
    with spotray.evaluating(1) as metrics:
        clock[0] = 4.0
        metrics |= {"val_loss": 2.0, "accuracy": 0.5}
    clock[0] = 5.0
    with caplog.at_level(logging.WARNING, logger=session.__name__):
        for step in (2, 3):
            spotray.report(step, loss=1.0, val_loss=2.0)
    current.finish(moved=False)
    session.begin(None)
    attempts, attempt = current.attempts, current.attempt_id
    assert {step: r.seconds for step, r in ledger.read_steps(attempts, attempt).items()} == {1: 1.0, 2: 1.0, 3: 0.0}
    assert ledger.read_evals(attempts, attempt)[1]["metrics"] == {"val_loss": 2.0, "accuracy": 0.5}
    status = goodput.read_status(attempts, attempt)
    assert status is not None and (status["eval_s"], status["val_loss"]) == (3.0, 2.0)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "'val_loss' is not a step metric" in warned[0] and "spotray.evaluating" in warned[0]


def test_a_scripts_compiling_is_the_compile_category_not_its_steps_or_evaluations(tmp_path, monkeypatch):
    """A script's torch.compile compiles in its first step and its first evaluation: a restart compiles again, so
    that time is badput, not a slow productive step."""
    import torch._dynamo

    from spotray.accounts import goodput, ledger

    torch._dynamo.reset()
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)  # compiles, whatever ran before
    train_step, evaluate = torch.compile(lambda x: torch.cos(x) + 1), torch.compile(lambda x: torch.sin(x) * 3)
    current = open_session(0, 1, script_config(tmp_path / "runs"))
    session.begin(current)
    current.restore(str(tmp_path / "resume"))  # step 1's time counts from here
    started = time.perf_counter()
    train_step(torch.ones(4))  # compiles
    current.report(1, loss=1.0)
    walls = [time.perf_counter() - started]
    train_step(torch.ones(4))
    current.report(2, loss=1.0)
    started = time.perf_counter()
    evaluate(torch.ones(4))
    walls.append(time.perf_counter() - started)
    current.evaluated(2, {"val_loss": 1.0}, walls[1])
    current.finish(moved=False)
    session.begin(None)
    attempts, attempt = current.attempts, current.attempt_id
    status = goodput.read_status(attempts, attempt)
    first_step, eval_s = ledger.read_steps(attempts, attempt)[1].seconds, ledger.read_evals(attempts, attempt)[2]["s"]
    assert status is not None and status["compile_s"] > 0.2
    # Every second once: in the step, the evaluation, or the compile category, never two of them.
    assert abs(first_step + eval_s + status["compile_s"] - sum(walls)) < 0.1, (first_step, eval_s, walls, status)


COMPILES_AFTER_RESTORE = """
import sys
from pathlib import Path

import torch

from spotray.accounts import goodput
from spotray.worker import session
from tests.training.worker.test_session import open_session, script_config

runs = Path(sys.argv[1])
for compiles in (False, True):  # nanoGPT's order: the checkpoint loaded, then torch.compile, which imports Dynamo
    current = open_session(0, 1, script_config(runs / str(compiles)))
    session.begin(current)
    current.restore(str(runs / "resume"))
    if compiles:
        torch.compile(lambda x: torch.cos(x) + 1)(torch.ones(4))
    current.report(1, loss=1.0)
    current.finish(moved=False)
    session.begin(None)
    status = goodput.read_status(current.attempts, current.attempt_id)
    print(compiles, "torch._dynamo" in sys.modules, round(status["compile_s"], 3) > 0,
          any(type(f).__name__ == "_AfterImport" for f in sys.meta_path))
"""


def test_a_script_importing_dynamo_after_restore_has_its_compiling_timed_and_one_never_compiling_never_imports_it(
        tmp_path):
    """torch.compile imports Dynamo on its first call, which a script often makes after loading its checkpoint; in a
    fresh process, as a worker is, before any other test imported it."""
    done = subprocess.run([sys.executable, "-c", COMPILES_AFTER_RESTORE, str(tmp_path)], capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["False False False False", "True True True False"], done.stdout


def test_outside_spotray_train_the_calls_do_nothing(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert spotray.restore(str(tmp_path)) is None and spotray.should_save(10) is False
        spotray.commit(str(tmp_path), 10)
        spotray.report(10, loss=1.0)
        with spotray.evaluating(10) as metrics:
            metrics["val_loss"] = 1.0
        assert spotray.should_stop() is False
    assert caplog.text.count("not running under `spotray train --script`") == 1
    assert spotray.hf.resume_checkpoint() is None


def test_a_script_that_never_commits_is_warned_once_after_the_first_interval(tmp_path, caplog):
    current = open_session(0, 1, script_config(tmp_path, "checkpoint.every_steps=5"))
    with caplog.at_level(logging.WARNING):
        for step in range(1, 16):
            current.report(step, loss=1.0)
    assert caplog.text.count("nothing has been checkpointed") == 1 and "step 6:" in caplog.text


def test_spotrays_loop_and_a_scripts_session_keep_the_same_cadence(tmp_path, monkeypatch, dataset_url):
    """Both paths ask ``cadence.Cadence`` when to save and whether a notice came: one core, not two copies."""
    from spotray.worker.loop import train
    from tests.training.configs import make_config

    asked = []

    def recorded(name, method):
        def call(self, *args):
            asked.append(name)
            return method(self, *args)
        return call

    monkeypatch.setattr(Cadence, "save_due", recorded("save_due", Cadence.save_due))
    monkeypatch.setattr(Cadence, "notice", recorded("notice", Cadence.notice))
    train(make_config(dataset_url, str(tmp_path / "loop"), "loop", "train.max_steps=2", "scaling.num_workers=1",
                      "train.global_batch_size=2"), WorkerEnv(0, 1, torch.device("cpu"), lambda _: None))
    from_loop = len(asked)
    assert {"save_due", "notice"} <= set(asked)
    current = open_session(0, 1, script_config(tmp_path / "script"))
    current.report(1, loss=1.0)
    current.should_save(1)
    assert {"save_due", "notice"} <= set(asked[from_loop:])


def test_a_failing_script_is_one_line_and_with_debug_waits_in_rays_post_mortem_debugger(tmp_path, monkeypatch):
    from ray.util import debugpy

    from spotray.worker.user_script import ScriptFailed, run_on_worker

    caught = []
    monkeypatch.setattr(debugpy, "_post_mortem", lambda: caught.append(sys.exc_info()[1]))
    script = tmp_path / "train.py"
    script.write_text("raise ValueError('no column named text')\n")
    for debug in (False, True):
        raw = {**script_config(tmp_path / "runs"), "script": {"path": str(script), "debug": debug}}
        with pytest.raises(ScriptFailed, match=r"^rank 0: ValueError: no column named text$"):
            run_on_worker(config.from_dict(raw), WorkerEnv(0, 1, torch.device("cpu"), lambda _: None))
    assert [type(exc) for exc in caught] == [ValueError], "only with --debug, on the script's own error"


def test_no_module_of_spotray_is_named_like_a_public_call():
    """Importing ``spotray.x`` sets the attribute ``spotray.x``: a module named ``report`` would replace the call."""
    package = Path(spotray.__file__).parent
    modules = {path.stem for path in package.glob("*.py")} | {path.name for path in package.iterdir() if path.is_dir()}
    assert not set(spotray._PUBLIC) & modules

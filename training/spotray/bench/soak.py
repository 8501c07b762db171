"""``spotray bench soak``: one training run on a real multi-node local Ray cluster through a seeded schedule of faults,
each kind at least once (``--minutes`` covers them and the training between them): a spot notice, a node killed
without one, two nodes lost at once, the driver killed (the same command run again resumes), the head killed (the
same command on a new cluster resumes, as a RayJob retry does), a storage outage window, and both worker nodes killed
and the newest checkpoint corrupted before the run resumes. The run keeps in-memory snapshots every
``SNAPSHOT_EVERY`` steps: a notice or a kill may resume from the copy on the node left, every other fault reads storage.

Fault ``i`` of ``n`` lands once the run trains again after the faults before it (one during a restart could hit a node
that the new worker group never takes) and a checkpoint of step ``(i + 1) * gap`` is committed, newer than any that was
committed as the fault before it ended (a kill right after an outage would go back past the save that failed in it); the
run trains ``n * gap`` steps and then at least ``LAST_FAULT_STEPS`` more, so that the last fault takes effect before it
ends. Checked and reported: the run finishes; its final parameters are bitwise those of the same run uninterrupted
(trained on a bare process group); every sample trained exactly once; each interruption lost at most its kind's bound of
steps; no snapshot was restored where its copies were lost, and every notice resumed from its own; the driver's
memory and open files stay within bounds while it lives; the checkpoint folder never holds more than ``HELD_AT_MOST``
folders; ``spotray status`` counts the interruptions the harness caused; no corrupted checkpoint is resumed from; the
driver of a lost head ends with one line, which names the step that the same command resumes from; saves fail in a
storage outage, what storage lists as committed meanwhile is whole (a save whose commit marker landed though its reply
was lost is), and no failed save is kept; and the loss log holds every step."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from spotray import config
from spotray.bench.common import bench_corpus, machine, scratch_dir
from spotray.checkpoints.dcp import checkpoints_root, list_committed
from spotray.drills.cluster import LocalCluster, ReusedCluster, given_or_own
from spotray.drills.outage import OutageProxy
from spotray.drills.process_group import train_on_process_group
from spotray.drills.s3local import create_bucket, moto_server
from spotray.errors import SpotrayError, StorageError
from spotray.reports import status as run_status
from spotray.storage import StorageOptions, resolve

KINDS = ("notice", "kill", "two_nodes", "driver", "head", "outage", "corrupt")
EVERY, KEEP_LAST = 10, 3  # checkpoint interval (steps) and retention
SNAPSHOT_EVERY = 5
# The most steps a fault may cost: a notice snapshots where it lands; a kill goes back to the newest whole snapshot (the
# one after it may be copying); a fault that takes every copy to the last periodic checkpoint, and a corrupted newest
# one to the one before it; an outage restarts nothing.
LOST_AT_MOST = {"notice": 0, "kill": 2 * SNAPSHOT_EVERY, "two_nodes": EVERY, "driver": EVERY, "head": EVERY,
                "corrupt": 2 * EVERY, "outage": 0}
# Where a snapshot survives the fault: the other worker node holds a whole copy (DDP). The holders go with their nodes,
# with a lost head, and with a driver's successor, which removes them when it starts. A kill may still resume from
# storage: a save whose parts were written before it commits on the rank left, newer than the newest snapshot.
COPY_SURVIVES = {"notice", "kill"}
RESTARTS = {kind for kind in KINDS if kind != "outage"}
# How the attempt each fault ended must be on record (``accounts.endings``): the drill's nodes are spot.
ENDINGS = {"notice": "notice", "kill": "kill", "two_nodes": "kill", "corrupt": "kill", "driver": "driver_lost",
           "head": "head_lost"}
OUTAGE_S = 5  # the link stays cut at least this long, and until a save has failed in it
OUTAGE_AT_MOST_S = 120  # a run that tries no save this long with its storage gone is stalled: the check says so
STEPS_PER_MINUTE = 500  # of the tiny model on 2 workers on cpu-2c, saving to S3 every EVERY steps
# About 25 s on cpu-2c: a notice reaches the workers seconds after it lands (Ray's drain, then Ray Train's poll), at
# the latest by the drills' 20 s drain deadline, when the node goes.
LAST_FAULT_STEPS = 200
FAULT_MINUTES = 1.1  # what a fault and its recovery took on average on cpu-2c (the head's: 2 minutes)
HELD_AT_MOST = KEEP_LAST + 1  # checkpoint folders in storage at any moment: keep_last and the one being written
DRIVER_RSS_GROWTH_MB, DRIVER_FD_GROWTH = 200, 64
HEAD_LOSS_ENDS_DRIVER_S = 180  # the driver's watch gives up on a dead head within this; it must not wait forever
RUN = "soak"


def schedule(seed: int, faults: int) -> list[str]:
    """Every kind once, the rest drawn with ``seed``; in an order drawn with ``seed``."""
    rng = random.Random(seed)
    kinds = [*KINDS, *rng.choices(KINDS, k=max(0, faults - len(KINDS)))]
    rng.shuffle(kinds)
    return kinds


@dataclass
class _Driver:
    """``spotray train`` of the soak's run, started again after a fault that ends it."""

    cluster: LocalCluster
    args: list[str]
    workdir: Path
    proc: subprocess.Popen | None = None
    samples: list[tuple[int, float, int]] = field(default_factory=list)  # (pid, RSS MB, open files)
    console_from: int = 0  # where this process's output starts in driver.log

    def start(self) -> None:
        cmd = [sys.executable, "-m", "spotray.cli", "train", "--summary-json", str(self.workdir / "summary.json"),
               "--audit-dir", str(self.workdir / "audit")]
        for arg in self.args:
            cmd += ["--set", arg]
        with open(self.workdir / "driver.log", "a") as log:
            self.console_from = log.tell()
            self.proc = subprocess.Popen(cmd, env={**self.cluster.node_env(), "RAY_ADDRESS": self.cluster.address},
                                         stdout=log, stderr=subprocess.STDOUT)

    @property
    def process(self) -> subprocess.Popen:
        assert self.proc is not None, "start() first"
        return self.proc

    def sample(self) -> None:
        try:
            process = psutil.Process(self.process.pid)
            self.samples.append((self.process.pid, process.memory_info().rss / 1e6, process.num_fds()))
        except psutil.Error:
            pass

    def log_tail(self) -> str:
        return (self.workdir / "driver.log").read_text()[-3000:]

    def console(self) -> str:
        """What the current process printed."""
        with open(self.workdir / "driver.log") as log:
            log.seek(self.console_from)
            return log.read()


def run(minutes: float = 20, seed: int = 0, faults: int = 10, clusters: ReusedCluster | None = None) -> dict:
    """``clusters``: where the clusters come from when they may outlive the soak (the drills'), else new ones."""
    if minutes <= 0 or faults < len(KINDS):
        raise SpotrayError(f"bench soak: --minutes must be positive and --faults at least {len(KINDS)}")
    kinds, started = schedule(seed, faults), time.time()
    training_minutes = max(0.5, (minutes - FAULT_MINUTES * len(kinds)) / 2)  # the soak's run, then the straight one
    gap = max(2 * EVERY, round(training_minutes * STEPS_PER_MINUTE / (len(kinds) + 1) / EVERY) * EVERY)
    max_steps = len(kinds) * gap + max(gap, LAST_FAULT_STEPS)
    with scratch_dir() as scratch:
        workdir = Path(scratch)
        data_url = bench_corpus(str(workdir))
        with moto_server() as s3, OutageProxy(s3) as proxy, given_or_own(clusters, workdir / "ray") as reused:
            ckpt = f"{create_bucket(s3)}/ckpt"
            root = resolve(ckpt, StorageOptions(endpoint_url=s3)).child(RUN)
            base = [f"data.path={data_url}", "model.preset=tiny", "train.seq_len=32", "train.global_batch_size=12",
                    f"train.max_steps={max_steps}", "train.log_every=1", f"checkpoint.every_steps={EVERY}",
                    f"checkpoint.keep_last={KEEP_LAST}", f"snapshot.every_steps={SNAPSHOT_EVERY}",
                    "scaling.num_workers=2", "fault_tolerance.preemption_check_every_steps=2",
                    f"storage.endpoint_url={proxy.endpoint}"]
            faults_done: list[dict] = []
            most_held = 0
            driver = _Driver(reused.get(), [*base, f"checkpoint.path={ckpt}", f"run.name={RUN}"], workdir)
            try:
                driver.start()
                landing = random.Random(seed)
                newest = 0  # the newest checkpoint committed as the last fault ended
                for i, kind in enumerate(kinds):
                    _wait_for_resumed(driver, sum(fault["kind"] in RESTARTS for fault in faults_done))
                    most_held = max(most_held, _wait_for_step(root, max((i + 1) * gap, newest + 1), driver))
                    time.sleep(landing.uniform(0, 1))  # anywhere in the next checkpoint interval or two
                    driver.sample()
                    faults_done.append(_inject(kind, driver, root, proxy, reused))
                    newest = max((c.step for c in _committed(root)), default=0)
                summary = _finish(driver)
                most_held = max(most_held, _held(root))
                saves = {"failed": _failed_saves(driver), "committed": [c.step for c in _committed(root)]}
                straight = _straight_run(base, ckpt)
            except BaseException:
                reused.discard()  # a driver may still run there
                raise
            status = run_status.gather(root.url, StorageOptions(endpoint_url=s3))
    report = _report(kinds, faults_done, summary, straight, status, driver.samples, most_held, max_steps, seed, minutes,
                     saves)
    return {**report, "wall_s": round(time.time() - started)}


def _wait_for_step(root, step: int, driver: _Driver, timeout_s: float = 900) -> int:
    """Until a checkpoint of ``step`` or later is committed; returns the most checkpoint folders seen meanwhile."""
    most = 0

    def committed() -> bool:
        nonlocal most
        most = max(most, _held(root))
        return any(c.step >= step for c in _committed(root))

    _poll(committed, driver, timeout_s, lambda: f"no checkpoint of step {step} was committed")
    return most


def _wait_for_resumed(driver: _Driver, restarts: int, timeout_s: float = 900) -> None:
    """Until the driver has said it resumed after each of ``restarts`` faults."""
    _poll(lambda: _resumes(driver) >= restarts, driver, timeout_s,
          lambda: f"the run resumed {_resumes(driver)} times, not once after each of the {restarts} faults that "
                  "restarted it")


def _poll(done: Callable[[], bool], driver: _Driver, timeout_s: float, what_failed: Callable[[], str]) -> None:
    """Every 0.5 s until ``done()``; one line saying ``what_failed()`` when the driver ends or ``timeout_s`` passes
    first."""
    deadline = time.time() + timeout_s
    while driver.process.poll() is None and time.time() < deadline:
        if done():
            return
        time.sleep(0.5)
    why = "before the driver ended" if driver.process.poll() is not None else f"within {timeout_s} s"
    raise SpotrayError(f"bench soak: {what_failed()} {why}:\n{driver.log_tail()}")


def _resumes(driver: _Driver) -> int:
    """How often the run's drivers said they resumed it."""
    return len(re.findall(r"^spotray: RESUMED from", (driver.workdir / "driver.log").read_text(), re.M))


def _committed(root, tries: int = 5) -> list:
    """The committed checkpoints, newest first, read again where retention deleted one between listing and reading."""
    for attempt in range(tries):
        try:
            return list_committed(checkpoints_root(root), warn=False)
        except StorageError:
            if attempt == tries - 1:
                raise
            time.sleep(0.2)
    return []


def _held(root) -> int:
    """Checkpoint folders in storage, committed or being written (those set aside by a resume not counted)."""
    return len([name for name in checkpoints_root(root).list_dir_names() if name.startswith("step_")])


def _inject(kind: str, driver: _Driver, root, proxy: OutageProxy, clusters: ReusedCluster) -> dict:
    cluster, started = driver.cluster, time.time()
    workers = [node for node in cluster.nodes[1:] if node.alive]
    if kind == "notice":
        cluster.preempt_with_notice(workers[-1])
        cluster.add_node()
    elif kind in ("kill", "two_nodes", "corrupt"):
        lost = workers[-1:] if kind == "kill" else workers  # every snapshot copy with them: the restart reads storage
        for node in lost:
            cluster.kill(node)
        # After the kill, and long before the restart reads it: corrupted first, a checkpoint the run committed before
        # the kill would be the newest and go unread.
        corrupted = [_corrupt(_committed(root)[0])] if kind == "corrupt" else []
        for _ in lost:
            cluster.add_node()
        if corrupted:
            # A save whose parts were all written before the kill still commits on the ranks left: it would be the
            # newest, and the one corrupted above never read.
            corrupted += [_corrupt(c) for c in _committed(root) if c.step > corrupted[0]]
            return {"kind": kind, "injected_s": round(time.time() - started, 1), "corrupted_step": corrupted[0],
                    "corrupted_later": corrupted[1:]}
    elif kind == "driver":
        driver.process.kill()
        driver.process.wait(timeout=60)
        driver.start()
    elif kind == "head":
        cluster.kill(cluster.nodes[0])
        try:
            driver.process.wait(timeout=HEAD_LOSS_ENDS_DRIVER_S)
        except subprocess.TimeoutExpired:
            driver.process.kill()
            raise SpotrayError(f"bench soak: the driver kept running {HEAD_LOSS_ENDS_DRIVER_S} s after the Ray head "
                               f"died:\n{driver.log_tail()}") from None
        ended = {"exit": driver.process.returncode, **_said(driver.console())}
        clusters.discard()
        driver.cluster = clusters.get()  # a RayJob retry: a new cluster, the same command
        driver.start()
        return {"kind": kind, "injected_s": round(time.time() - started, 1), **ended}
    else:  # outage
        failed_before = len(_failed_saves(driver))
        proxy.cut()
        time.sleep(OUTAGE_S)
        # Until a save has met the cut link (one may be waiting for storage when it is cut, and pass once it is back).
        while len(_failed_saves(driver)) == failed_before and time.time() < started + OUTAGE_AT_MOST_S:
            time.sleep(0.5)
        committed = _committed(root)  # read past the cut link
        proxy.restore()
        return {"kind": kind, "injected_s": round(time.time() - started, 1),
                "committed_during": [c.step for c in committed],
                "whole_during": [c.step for c in committed if _whole(c)]}
    return {"kind": kind, "injected_s": round(time.time() - started, 1)}


def _whole(checkpoint) -> bool:
    """Every file its commit marker names is in storage at its recorded size."""
    return all(checkpoint.location.child(name).size() == int(file["size"]) for name, file in checkpoint.files.items())


def _said(console: str) -> dict:
    """A driver's console, as the head-loss check reads it: its error lines, and whether a traceback reached it."""
    return {"errors": [line for line in console.splitlines() if "spotray: error" in line],
            "traceback": "Traceback" in console}


def _corrupt(checkpoint) -> int:
    """One flipped byte in the checkpoint's first shard (its size stays, its CRC32 does not); returns its step."""
    shard = next(name for name in checkpoint.location.list_names() if name.endswith(".distcp"))
    data = bytearray(checkpoint.location.child(shard).read_bytes())
    data[len(data) // 2] ^= 0xFF
    checkpoint.location.child(shard).write_bytes(bytes(data))
    return checkpoint.step


def _finish(driver: _Driver, timeout_s: float = 1200) -> dict:
    try:
        driver.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        driver.process.kill()
    if driver.process.returncode != 0:
        raise SpotrayError(f"bench soak: the run did not finish (exit {driver.process.returncode}):\n"
                           f"{driver.log_tail()}")
    return json.loads((driver.workdir / "summary.json").read_text())


def _straight_run(base: list[str], ckpt: str) -> dict:
    """The same run with no fault, on a bare process group of as many ranks (the loop is the same, bitwise), for
    the final parameters."""
    cfg = config.load(None, [*base, f"checkpoint.path={ckpt}-straight", f"run.name={RUN}"])
    return train_on_process_group(cfg.to_dict(), cfg.scaling.num_workers)


def _report(kinds, faults_done, summary, straight, status, samples, most_held, max_steps, seed, minutes,
            saves) -> dict:
    events = status["endings"]
    restarts = [fault for fault in faults_done if fault["kind"] in RESTARTS]
    per_fault = [{**fault, "lost_steps": event["lost_steps"], "lost_steps_at_most": event["lost_steps_at_most"],
                  "recovery_s": event["recovery_s"], "bound": LOST_AT_MOST[fault["kind"]]}
                 for fault, event in zip(restarts, events, strict=False)]
    checks = soak_checks(summary, straight, events, faults_done, samples, most_held, max_steps, saves)
    return {"machine": machine(), "minutes": minutes, "seed": seed, "max_steps": max_steps, "every": EVERY,
            "keep_last": KEEP_LAST, "schedule": kinds, "checks": checks, "passed": all(checks.values()),
            "faults": per_fault + [f for f in faults_done if f["kind"] not in RESTARTS],
            "endings": events,  # whole, in order: ``faults`` pairs them with the restarts and drops what has no pair
            "survived_by_kind": {kind: kinds.count(kind) for kind in KINDS},
            "lost_steps": status["lost_steps"], "goodput": status["goodput"], "most_checkpoint_folders": most_held,
            "driver_samples": samples}


def soak_checks(summary: dict, straight: dict, events: list[dict], faults: list[dict],
                samples: list[tuple[int, float, int]], most_held: int, max_steps: int,
                saves: dict[str, list[int]]) -> dict[str, bool]:
    """Each of the soak's checks; ``events`` are ``spotray status``'s interruptions, ``faults`` the harness's,
    ``saves`` the steps whose save failed (the driver said so) and those committed at the end."""
    restarts = [fault["kind"] for fault in faults if fault["kind"] in RESTARTS]
    return {
        "finished": summary["final_step"] == max_steps and max_steps in saves["committed"],
        "loss_log_complete": set(map(int, summary["losses"])) == set(range(1, max_steps + 1)),
        "outage_saves_failed_and_never_adopted": _outage_saves_held(faults, events, saves),
        "bitwise_equal_to_uninterrupted": summary["param_sha256"] == straight["param_sha256"],
        "exactly_once": bool(summary["audit"]["exactly_once"]),
        "lost_steps_within_bounds": all(event["lost_steps"] <= LOST_AT_MOST[kind]
                                        for kind, event in zip(restarts, events, strict=False)),
        "no_snapshot_outlived_its_copies": not any(event["from_snapshot"] for kind, event in
                                                   zip(restarts, events, strict=False) if kind not in COPY_SURVIVES),
        "notices_resumed_from_their_snapshot": all(event["from_snapshot"] for kind, event in
                                                   zip(restarts, events, strict=False) if kind == "notice"),
        "corrupted_checkpoint_never_resumed": all(
            event["resumed_from"] < fault["corrupted_step"]
            for fault, event in zip([f for f in faults if f["kind"] in RESTARTS], events, strict=False)
            if "corrupted_step" in fault),
        "driver_memory_and_files_bounded": _driver_bounded(samples),
        "storage_within_retention": most_held <= HELD_AT_MOST,
        "status_agrees": len(events) == len(restarts)
        and sum(e["kind"] == "notice" for e in events) == restarts.count("notice"),
        "endings_from_evidence": [e["kind"] for e in events] == [ENDINGS[kind] for kind in restarts],
        "head_loss_said_in_one_line": all(_head_loss_said(fault) for fault in faults if fault["kind"] == "head"),
    }


def _outage_saves_held(faults: list[dict], events: list[dict], saves: dict[str, list[int]]) -> bool:
    """Saves failed in an outage; every checkpoint storage listed as committed then was whole (a failed save whose
    commit marker reached storage though the reply was lost is whole, and deleted before the next save); and no failed
    step was committed at the end unless a restart went back below it (and trained it again)."""
    outages = [fault for fault in faults if fault["kind"] == "outage"]
    partial = set().union(*(set(fault["committed_during"]) - set(fault["whole_during"]) for fault in outages))
    retrained_below = min((event["resumed_from"] for event in events), default=None)
    later = {step for step in saves["committed"] if retrained_below is None or step <= retrained_below}
    return not outages or (bool(saves["failed"]) and not partial and not later & set(saves["failed"]))


def _failed_saves(driver: _Driver) -> list[int]:
    return sorted({int(step) for step in re.findall(r"checkpoint of step (\d+) failed",
                                                     (driver.workdir / "driver.log").read_text())})


def _head_loss_said(fault: dict) -> bool:
    """The driver of a lost head failed with one line, no traceback, naming the run and the committed checkpoint's
    step that the same command resumes from."""
    resume = re.search(rf"training run '{RUN}' lost its Ray cluster.*run the same command again.* to resume from step "
                       r"(\d+) \(the full log: .+\)$", fault["errors"][0]) if len(fault["errors"]) == 1 else None
    return fault["exit"] != 0 and not fault["traceback"] and resume is not None and int(resume.group(1)) % EVERY == 0


def _driver_bounded(samples: list[tuple[int, float, int]]) -> bool:
    """Within one driver process's life, memory and open files grow by at most the stated bounds."""
    by_pid: dict[int, list[tuple[float, int]]] = {}
    for pid, rss, fds in samples:
        by_pid.setdefault(pid, []).append((rss, fds))
    return all(seen[-1][0] - seen[0][0] <= DRIVER_RSS_GROWTH_MB and seen[-1][1] - seen[0][1] <= DRIVER_FD_GROWTH
               for seen in by_pid.values())

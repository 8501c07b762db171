"""Going on with the survivors (``scaling.min_workers``): when a worker group fails because nodes were lost and the
whole group no longer fits on the nodes left, Ray Train restarts it at once with the workers that fit instead of
waiting for replacements; the run grows back later (the loop fails its group on purpose at a committed step, and
Ray Train restarts it at the whole size: no node was lost, so this leaves Ray's size as it is).

Ray Train's own elastic sizing decides from the autoscaling coordinator's node list, which learns of a lost node
only after the GCS has marked it dead (about 15 s) and on a 20 s tick. spotray decides as Ray Train reports the
failure (the survivors' collectives fail first), asking each of the group's nodes whether its raylet still answers,
and sets the size of the restart Ray is about to make (``before_controller_execute_resize_decision``), its placement
steered off the lost nodes, which Ray may still list as alive.

In the survivors' own processes (``spotray.survivors``) Ray Train replaces each lost worker alone; where it fails to
(two nodes lost at once), the driver starts a new fit with the workers that fit (``restart_size``), kept off the lost
nodes (``KeepOff``), and that fit ends itself to grow back once the whole group fits."""

from __future__ import annotations

import threading

import ray
from ray.train import WorkerGroupError
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback
from ray.train.v2._internal.execution.controller.state import RestartingState
from ray.util.placement_group import NODE_ID_LABEL_KEY

from spotray.config import ScalingSection
from spotray.driver.placement import answering_fit, workers_that_fit
from spotray.ray_nodes import unreachable_nodes
from spotray.survivors.keeper import find_keeper

END_AFTER_S = 10.0


class ShrinkOnLoss(ControllerCallback, WorkerGroupCallback):
    """Within one fit (which starts with all ``num_workers``): the size of each restart after a worker group
    failure (``workers``: the running group's), and the group kept off the nodes taken as lost."""

    def __init__(self, scaling: ScalingSection):
        self.scaling, self.workers = scaling, scaling.num_workers
        self.avoid: tuple[str, ...] = ()
        self._nodes: set[str] = set()  # the running group's
        self._restart_with: int | None = None

    def after_worker_group_start(self, worker_group) -> None:
        workers = worker_group.get_workers()
        self._nodes, self.workers = {worker.metadata.node_id for worker in workers}, len(workers)

    def after_controller_state_update(self, previous_state, current_state) -> None:
        if (not isinstance(current_state, RestartingState) or self.scaling.fewest_workers == self.scaling.num_workers
                or not isinstance(current_state.training_failed_error, WorkerGroupError)):
            return
        lost = unreachable_nodes(self._nodes)
        if not lost:
            return
        self.avoid = tuple(sorted({*self.avoid, *lost}))
        fit = workers_that_fit(self.scaling, excluding=self.avoid)
        self._restart_with = fit if fit != self.workers and fit >= self.scaling.fewest_workers else None

    def before_controller_execute_resize_decision(self, resize_decision) -> None:
        if self._restart_with is not None:
            resize_decision.num_workers = self.workers = self._restart_with
            self._restart_with = None

    def on_controller_start_worker_group(self, *, scaling_config, num_workers: int) -> dict[str, str] | None:
        return _off(self.avoid)


def restart_size(scaling: ScalingSection) -> tuple[int, tuple[str, ...]]:
    """The size of a new fit after nodes were lost, and the lost nodes to keep it off: the workers that fit on the
    nodes left, where they are at least ``min_workers``, else the whole group (which waits for capacity)."""
    fit, lost = answering_fit(scaling)
    return (fit if fit >= scaling.fewest_workers else scaling.num_workers), lost


class KeepOff(ControllerCallback):
    """Keeps a fit's worker group off the nodes found lost before it started, which Ray may still list as alive."""

    def __init__(self, nodes: tuple[str, ...]):
        self.nodes = nodes

    def on_controller_start_worker_group(self, *, scaling_config, num_workers: int) -> dict[str, str] | None:
        return _off(self.nodes)


def _off(nodes: tuple[str, ...]) -> dict[str, str] | None:
    """Ray's label selector for a worker group placed on none of ``nodes``."""
    return {NODE_ID_LABEL_KEY: f"!in({','.join(nodes)})"} if nodes else None


class ControllerToKeeper(ControllerCallback):
    """Tells the survivors' keeper which actor is Ray Train's controller (``EndWithoutReplacement`` ends it)."""

    def __init__(self, run_url: str):
        self.run_url = run_url

    def after_controller_start(self, train_run_context) -> None:
        find_keeper(self.run_url).set_controller.remote(ray.get_runtime_context().current_actor)


class EndWithoutReplacement:
    """The survivors' run may train its last step while Ray Train still waits to replace a lost worker, on capacity
    that may never come: once the run's rank 0 has told the keeper it is done, Ray Train's controller is ended after
    ``END_AFTER_S`` (``ended``: this did it, so the controller's loss is the run's end, not an error)."""

    def __init__(self, keeper):
        self.keeper, self.ended = keeper, False
        self._stop = threading.Event()

    def __enter__(self) -> EndWithoutReplacement:
        threading.Thread(target=self._watch, daemon=True, name="end-without-replacement").start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            try:
                ended_for_s: object = ray.get(self.keeper.ended_for_s.remote(), timeout=10)
                if not isinstance(ended_for_s, float) or ended_for_s < END_AFTER_S:
                    continue
                controller = ray.get(self.keeper.get_controller.remote(), timeout=10)
            except ray.exceptions.GetTimeoutError:  # a slow answer on a loaded node: giving up would wait forever
                continue
            except ray.exceptions.RayError:  # the keeper is gone: the fit is ending
                return
            if controller is not None:
                self.ended = True
                ray.kill(controller)
                return

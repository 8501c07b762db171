"""A Hugging Face ``Trainer`` script on spot with two added lines (docs/scripts.md)::

    trainer = Trainer(..., callbacks=[spotray.hf.SpotrayCallback()])
    trainer.train(resume_from_checkpoint=spotray.hf.resume_checkpoint())

The Trainer saves and restores everything itself (model, optimizer, scheduler, RNG, ``trainer_state.json``); the
callback only says when to save (the checkpoint interval, a preemption notice), commits each ``checkpoint-N`` the
Trainer writes, reports the steps and logged metrics to the run's ledger, and ends the attempt after a notice's
checkpoint by raising ``MovedOn`` out of ``trainer.train()``, so that the code after it (``save_model``, a push)
runs once, when the run is complete (a rerun of a finished run ends the same way, by ``FinishedAlready``).
"""

from __future__ import annotations

import logging
import os
import shutil
import time

from transformers import TrainerCallback

from spotray.worker import session as sessions

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "checkpoint-"  # the Trainer's name for the directory of step N: checkpoint-N


def resume_checkpoint() -> str | None:
    """The run's newest committed checkpoint, fetched into this node's local directory (``script.local_dir``) for
    ``trainer.train(resume_from_checkpoint=...)``; None on a first start, or outside ``spotray train --script``."""
    session = sessions.current()
    if session is None:
        return None
    directory = os.path.join(sessions.local_dir(session.cfg), "resume", "checkpoint")
    return directory if session.restore(directory) is not None else None


class SpotrayCallback(TrainerCallback):
    """Survival on spot for a ``Trainer``; does nothing outside ``spotray train --script``."""

    def __init__(self):
        self.tokens_seen = 0
        self.warned_space = False
        self.mark = time.perf_counter()  # the end of the last step, evaluation or save: where the next one began

    def _check_space(self, output_dir: str, checkpoint_bytes: int) -> None:
        """Once: the disk must hold the next checkpoint beside the newest (the one still uploading)."""
        free = shutil.disk_usage(output_dir).free
        if free < 2 * checkpoint_bytes and not self.warned_space:
            self.warned_space = True
            log.warning("output_dir %s has %.1f GiB free, two checkpoints need %.1f GiB: point output_dir at "
                        "$%s (the RayJob's local volume) or a larger disk", os.path.abspath(output_dir),
                        free / 2**30, 2 * checkpoint_bytes / 2**30, sessions.LOCAL_DIR_ENV)

    def on_train_begin(self, args, state, control, **kwargs):
        session = sessions.current()
        if session is None:
            return
        session.plan(state.max_steps)
        self.tokens_seen, self.mark = state.num_input_tokens_seen, time.perf_counter()
        if state.global_step >= state.max_steps and (final := session.finished_before()) is not None:
            raise sessions.FinishedAlready(final)

    def on_step_end(self, args, state, control, **kwargs):
        session = sessions.current()
        if session is None:
            return
        step, tokens = state.global_step, state.num_input_tokens_seen - self.tokens_seen
        self.tokens_seen = state.num_input_tokens_seen
        session.report(step, tokens=tokens or None)
        if session.should_save(step):
            control.should_save = True
        if control.should_save:
            session.files.wait()  # the Trainer's rotation may delete the directory still being uploaded
        self.mark = time.perf_counter()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        session = sessions.current()
        if session is None or not metrics:
            return
        now = time.perf_counter()
        runtime = next((v for k, v in metrics.items() if k.endswith("_runtime")), now - self.mark)
        session.evaluated(state.global_step, _eval_metrics(metrics), runtime)
        self.mark = now

    def on_save(self, args, state, control, **kwargs):
        session = sessions.current()
        if session is None:
            return
        step = state.global_step
        session.commit(os.path.join(args.output_dir, f"{CHECKPOINT_PREFIX}{step}"), step,
                       written_s=time.perf_counter() - self.mark)
        self.mark = time.perf_counter()
        _remove_committed(args.output_dir, session.files.committed, state.best_model_checkpoint)
        self._check_space(args.output_dir, session.files.nbytes)
        if session.should_stop():
            raise sessions.MovedOn(step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        session = sessions.current()
        if session is not None and logs and "loss" in logs:
            session.report(state.global_step, loss=logs["loss"], learning_rate=logs.get("learning_rate"),
                           grad_norm=logs.get("grad_norm"))


def _eval_metrics(metrics: dict) -> dict[str, float]:
    """The Trainer's ``eval_loss`` as spotray's ``val_loss``, its other metrics without the ``eval_`` prefix, and
    none of its timings."""
    timings = ("_runtime", "_samples_per_second", "_steps_per_second")
    named = {("val_loss" if key == "eval_loss" else key.removeprefix("eval_")): value for key, value in metrics.items()
             if key.startswith("eval_") and not key.endswith(timings) and isinstance(value, int | float)}
    return {key: float(value) for key, value in named.items()}


def _remove_committed(output_dir: str, committed: list[int], best: str | None) -> None:
    """The local copies of committed checkpoints, except the newest committed one and the Trainer's best: the
    output_dir holds about two checkpoints, whatever save_total_limit says."""
    keep = os.path.abspath(best) if best else None
    for step in committed[:-1]:
        path = os.path.abspath(os.path.join(output_dir, f"{CHECKPOINT_PREFIX}{step}"))
        if path != keep and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)

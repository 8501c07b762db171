"""What a failure comes down to, in the one line the driver prints."""

import pickle

from ray.train import WorkerGroupError

from spotray.errors import CheckpointError, ConfigError, TrainingFailed, root_cause

# Ray's text of a worker's error: a long traceback's middle cut, and with it the start of its last line.
RAYS_TEXT = "[Rank 0,1 Error Snippet]:\nTraceback ...\n... (Output truncated) ...\ntray.errors.CheckpointError: no..."


def test_a_worker_groups_failure_is_the_lowest_failed_ranks_own_exception_whole():
    long = "no committed checkpoint could be read (" + "step 30: why, " * 40 + "step 10: why)"
    failures = {1: ValueError("rank 1's\nsecond line"), 0: CheckpointError(long)}
    wrapped = TrainingFailed("the fit failed")
    wrapped.__cause__ = WorkerGroupError(RAYS_TEXT, failures)

    assert root_cause(wrapped) == f"spotray.errors.CheckpointError: {long}"
    assert root_cause(WorkerGroupError(RAYS_TEXT, {1: failures[1]})) == "ValueError: rank 1's"


def test_any_other_failure_is_the_last_line_of_its_innermost_cause():
    outer = RuntimeError("outer")
    outer.__cause__ = RuntimeError("Traceback ...\nthe actor died")
    assert root_cause(outer) == "the actor died"
    assert root_cause(WorkerGroupError(RAYS_TEXT, {})) == "tray.errors.CheckpointError: no..."


def test_a_config_error_raised_in_a_worker_reaches_the_driver_whole():
    error = pickle.loads(pickle.dumps(ConfigError("train.seq_len", "64 is more than 32", "lower it")))
    assert (error.field, str(error)) == ("train.seq_len", "config 'train.seq_len': 64 is more than 32. lower it")

"""User-facing errors: one clear line, exit code 2, no traceback."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class SpotrayError(Exception):
    """An error caused by the user's input (config, CLI args, data, storage contents)."""

    exit_code = 2


def key_text(key: object) -> str:
    """A config key as an error line names it: as written, or quoted where it is empty, not a string, or not
    printable (an error stays one line)."""
    return key if isinstance(key, str) and key.isprintable() and key.strip() == key and key else repr(key)


def closest(key: object, valid: Iterable[str]) -> str:
    """``did you mean X? `` where a valid key X is spelt nearly as ``key`` (a typo), else nothing."""
    near = difflib.get_close_matches(str(key), list(valid), n=1, cutoff=0.75)
    return f"did you mean {near[0]}? " if near else ""


def yaml_error_text(exc: Exception) -> str:
    """Where and why a YAML parser stopped, in one line: ``at line 2, column 1: expected ',' or ']' ...``."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is None or not problem:
        return f"({type(exc).__name__})"
    context, begun = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    within = f" ({context} begun on line {begun.line + 1})" if context and begun else ""
    return f"at line {mark.line + 1}, column {mark.column + 1}: {problem}{within}"


class ConfigError(SpotrayError):
    def __init__(self, field: str, problem: str, fix: str = ""):
        self.field, self.problem, self.fix = field, problem, fix
        message = f"config '{field}': {problem}"
        super().__init__(f"{message}. {fix}" if fix else message)

    def __reduce__(self):  # raised in a worker, it crosses to the driver by pickle
        return type(self), (self.field, self.problem, self.fix)

    def within(self, prefix: str) -> ConfigError:
        """The same error with its field named from an enclosing section: ``within("network.")`` turns
        ``vpcCidr`` into ``network.vpcCidr`` (and ``""`` into ``network``). A namespaced field stays as it is."""
        if ":" in self.field:
            return self
        field = f"{prefix}{self.field}" if self.field else prefix.rstrip(".:")
        return ConfigError(field, self.problem, self.fix)


class DataError(SpotrayError):
    pass


class StorageError(SpotrayError):
    pass


class Unreachable(StorageError):  # noqa: N818 - a kind of StorageError, read as "storage: unreachable"
    """The object store does not answer (its endpoint is wrong, or it is down): nothing is wrong with the URL."""


class NotFound(StorageError):  # noqa: N818 - a kind of StorageError, read as "storage: not found"
    """The object or directory is not there (as opposed to storage that cannot be reached)."""


class CheckpointError(SpotrayError):
    pass


class Unrestorable(CheckpointError):
    """No committed checkpoint of the run can be read, for reasons its bytes (or the config it is resumed with) show
    on every rank: a restart would fail the same way."""


class TrainingFailed(SpotrayError):
    """The run itself failed (a worker error, a lost cluster): exit code 1."""

    exit_code = 1


class ClusterLost(TrainingFailed):
    """The run's Ray cluster stopped answering (its head is gone): rerunning the command resumes the run."""


class OutOfMemory(SpotrayError):  # noqa: N818 - read as "out of memory", like MemoryError
    """A rank ran out of host or device memory; says which rank and its memory figures."""

    exit_code = 1


def root_cause(exc: BaseException) -> str:
    """What a failure comes down to, in one line: where Ray Train's worker group failed, the lowest failed rank's
    own exception as ``module.Type: message`` (Ray's text of it cuts a long traceback's middle, and with it the start
    of the line that says what went wrong); else the last line of the innermost cause."""
    while True:
        failures = getattr(exc, "worker_failures", None)
        if isinstance(failures, dict) and failures and isinstance(failures[min(failures)], BaseException):
            return _raised(failures[min(failures)])
        if exc.__cause__ is None:
            break
        exc = exc.__cause__
    text = str(exc).strip().splitlines()
    return text[-1] if text else exc.__class__.__name__


def _raised(exc: BaseException) -> str:
    kind = type(exc)
    if kind.__module__.split(".")[0] == "ray":  # Ray's wrapper of what it could not ship: its text ends with it
        return root_cause(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    lines = str(exc).strip().splitlines()
    return f"{name}: {lines[0]}" if lines else name

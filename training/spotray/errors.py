"""User-facing errors: one clear line, exit code 2, no traceback."""

from __future__ import annotations


class SpotrayError(Exception):
    """An error caused by the user's input (config, CLI args, data, storage contents)."""

    exit_code = 2


def key_text(key: object) -> str:
    """A config key as an error line names it: as written, or quoted where it is empty, not a string, or not
    printable (an error stays one line)."""
    return key if isinstance(key, str) and key.isprintable() and key.strip() == key and key else repr(key)


class ConfigError(SpotrayError):
    def __init__(self, field: str, problem: str, fix: str = ""):
        self.field, self.problem, self.fix = field, problem, fix
        message = f"config '{field}': {problem}"
        super().__init__(f"{message}. {fix}" if fix else message)

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


class NotFound(StorageError):  # noqa: N818 - a kind of StorageError, read as "storage: not found"
    """The object or directory is not there (as opposed to storage that cannot be reached)."""


class CheckpointError(SpotrayError):
    pass


class TrainingFailed(SpotrayError):
    """The run itself failed (a worker error, a lost cluster): exit code 1."""

    exit_code = 1


class ClusterLost(TrainingFailed):
    """The run's Ray cluster stopped answering (its head is gone): rerunning the command resumes the run."""


class OutOfMemory(SpotrayError):  # noqa: N818 - read as "out of memory", like MemoryError
    """A rank ran out of host or device memory; says which rank and its memory figures."""

    exit_code = 1


def root_cause(exc: BaseException) -> str:
    """The last line of the innermost cause: what Ray's wrapped worker errors come down to."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip().splitlines()
    return text[-1] if text else exc.__class__.__name__

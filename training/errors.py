"""User-facing errors: one clear line, exit code 2, no traceback."""


class SpotrayError(Exception):
    """An error caused by the user's input (config, CLI args, data, storage contents)."""

    exit_code = 2


class ConfigError(SpotrayError):
    def __init__(self, field: str, problem: str, fix: str = ""):
        self.field = field
        message = f"config '{field}': {problem}"
        super().__init__(f"{message}. {fix}" if fix else message)


class DataError(SpotrayError):
    pass


class StorageError(SpotrayError):
    pass


class CheckpointError(SpotrayError):
    pass


class TrainingFailed(SpotrayError):
    """The run itself failed (a worker error, a lost cluster): exit code 1."""

    exit_code = 1

"""How spotray writes figures in the lines it prints: durations, steps and worker counts."""


def clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def step_of(step: int, total: int | None) -> str:
    """``12/40``, or ``12`` for a script that did not say how many steps it trains."""
    return f"{step}/{total}" if total else str(step)


def step_count(count: int) -> str:
    """``1 step``, ``3 steps``."""
    return f"{count} step{'' if count == 1 else 's'}"


def workers(count: int) -> str:
    """``1 worker``, ``3 workers``."""
    return f"{count} worker{'' if count == 1 else 's'}"

import io

from spotray.data import prepare_progress as progress_module
from spotray.data.prepare_progress import PrepareProgress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def at(monkeypatch, seconds: float) -> None:
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: 1000.0 + seconds)


def test_on_a_terminal_one_line_is_rewritten_in_place_and_ended_on_close(monkeypatch):
    at(monkeypatch, 0)
    terminal = Terminal()
    progress = PrepareProgress(total_bytes=100_000_000, stream=terminal)
    progress.chunk_done(documents=1000, tokens=50_000, bytes_in=20_000_000)

    at(monkeypatch, 10)
    progress.update(500, 25_000, 5_000_000)  # the running chunks' counts, on top of the finished ones
    at(monkeypatch, 10.2)
    progress.update(600, 30_000, 6_000_000)  # within 0.5 s of the last line: not shown
    at(monkeypatch, 20)
    progress.update(2000, 100_000, 30_000_000)
    progress.close()

    first, second = terminal.getvalue().split("\r")[1:]
    assert first == "prepare: 1,500 docs | 75,000 tokens | 2.5 MB/s | 25% | ETA 0:00:30\x1b[K"
    assert second == "prepare: 3,000 docs | 150,000 tokens | 2.5 MB/s | 50% | ETA 0:00:20\x1b[K\n"


def test_in_a_log_a_line_every_interval_and_nothing_to_end(monkeypatch):
    at(monkeypatch, 0)
    log = io.StringIO()
    progress = PrepareProgress(total_bytes=10_000_000, stream=log, log_interval_s=5)

    for second in range(12):
        at(monkeypatch, second)
        progress.update(second, 10 * second, 1_000_000 * second)
    progress.close()

    lines = log.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["prepare: 0 docs", "prepare: 5 docs", "prepare: 10 docs"]
    assert lines[-1].endswith("| 100%") and "\r" not in log.getvalue()  # done: no ETA left to show

"""The bare gloo process group that checks the loop without Ray: its ranks start where a spawned process would."""

from __future__ import annotations

import logging
import os
import socket
import sys

import pytest

from spotray.drills import process_group
from spotray.drills.process_group import run_on_process_group
from spotray.errors import TrainingFailed


def where(rank: int, world_size: int) -> tuple:
    return rank, world_size, os.environ.get("SPOTRAY_PROBE"), sys.path[0], os.getcwd()


def fails(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 cannot go on")


def test_ranks_start_with_the_callers_environment_import_path_and_directory_as_they_are_at_the_call(
        tmp_path, monkeypatch):
    run_on_process_group(where, (), world_size=2)  # the ranks' server has started, with the environment of then
    monkeypatch.setenv("SPOTRAY_PROBE", "set later")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert run_on_process_group(where, (), world_size=2) == (0, 2, "set later", str(tmp_path), str(tmp_path))


def test_a_ranks_error_is_raised_with_its_rank_and_last_line():
    with pytest.raises(TrainingFailed, match=r"rank 1: ValueError: rank 1 cannot go on"):
        run_on_process_group(fails, (), world_size=2)


def test_a_group_whose_ranks_cannot_connect_is_started_once_more_on_a_new_port(monkeypatch, caplog):
    """Its port taken before rank 0 binds it: ``where`` had not run anywhere, so the group starts again."""
    taken = socket.create_server(("127.0.0.1", 0))
    ports = iter([taken.getsockname()[1], process_group.free_port()])
    monkeypatch.setattr(process_group, "free_port", lambda: next(ports))
    with taken, caplog.at_level(logging.WARNING):
        assert run_on_process_group(where, (), world_size=2)[:2] == (0, 2)
    assert "could not connect" in caplog.text and next(ports, None) is None


def test_a_group_that_cannot_connect_twice_fails_with_its_ranks_last_line(monkeypatch):
    taken = socket.create_server(("127.0.0.1", 0))
    monkeypatch.setattr(process_group, "free_port", lambda: taken.getsockname()[1])
    with taken, pytest.raises(TrainingFailed, match=r"rank 0: .*(address already in use|EADDRINUSE)"):
        run_on_process_group(where, (), world_size=2)

"""Joining the cluster at RAY_ADDRESS, or a Ray of this machine alone."""

import pytest

from spotray import ray_local
from spotray.errors import SpotrayError


@pytest.fixture(autouse=True)
def not_connected(monkeypatch):
    """As a command starts: the test session's own Ray may be up in this process."""
    monkeypatch.setattr(ray_local.ray, "is_initialized", lambda: False)


def test_a_dashboards_address_is_one_line_naming_the_address_to_give(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")  # what `ray job submit` reads
    with pytest.raises(SpotrayError, match="^RAY_ADDRESS=http://127.0.0.1:8265: an address of http .* give its head's "
                                           "address \\(the GCS port, 6379 by default"):
        ray_local.join_or_start(1)


@pytest.mark.parametrize("form", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}"])
def test_an_address_where_no_cluster_answers_is_one_line_at_once_not_minutes_of_ray_retrying(monkeypatch, form):
    address = form.format(port=ray_local.free_port())  # nothing listens there
    monkeypatch.setenv("RAY_ADDRESS", address)
    monkeypatch.setattr(ray_local.ray, "init", lambda **_: pytest.fail("ray.init retries such an address for minutes"))
    with pytest.raises(SpotrayError, match=f"^RAY_ADDRESS={address}: no Ray cluster answers there \\(Connection "
                                           "refused\\): give its head's address"):
        ray_local.join_or_start(1)


def test_an_address_that_answers_or_that_ray_looks_up_itself_is_joined(monkeypatch):
    joined = []
    monkeypatch.setattr(ray_local.ray, "init", lambda **kwargs: joined.append(kwargs))
    with ray_local.socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        for address in (f"127.0.0.1:{listening.getsockname()[1]}", "auto"):
            monkeypatch.setenv("RAY_ADDRESS", address)
            assert ray_local.join_or_start(1, log_to_driver=False) is False
    assert joined == [{"log_to_driver": False}] * 2


def test_an_address_where_something_else_answers_is_one_line_with_rays_own_words(monkeypatch):
    def refuse(**_):
        raise ConnectionError("Failed to connect to Ray cluster at 127.0.0.1:80\nmore of Ray's words")

    monkeypatch.setattr(ray_local.ray, "init", refuse)
    with ray_local.socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        monkeypatch.setenv("RAY_ADDRESS", address)
        with pytest.raises(SpotrayError, match=f"^RAY_ADDRESS={address}: Failed to connect to Ray cluster at "
                                               "127.0.0.1:80: give its head's address"):
            ray_local.join_or_start(1)

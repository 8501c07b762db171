"""A Ray of this machine alone, for runs, prepares and tests that are not given a cluster."""

from __future__ import annotations

import os
import secrets
import socket

import ray

from spotray.errors import SpotrayError

REACH_TIMEOUT_S = 10
_ADDRESS_FIX = ("give its head's address (the GCS port, 6379 by default; ray://host:10001 for Ray Client), or unset "
                "RAY_ADDRESS to run on a Ray of this machine")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def state_api_env(dashboard_port: int) -> dict[str, str]:
    """Where Ray's processes find the state API, which Ray Train's placement-group cleaner polls from an actor.

    The dashboard serves it. Without this, the cleaner looks the cluster up in the machine's default Ray temp
    directory, which names whichever cluster started there last, and its query hangs past the 12 s Ray Train
    waits for it at the end of every run and every restart."""
    return {"RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{dashboard_port}"}


def start_local_ray(num_cpus: int, **kwargs) -> None:
    """A new single-node Ray on this machine, reachable on loopback only, with its dashboard for the state API.

    ``address="local"``: never attach to whatever cluster ``ray start`` last recorded on this machine. Ray's
    processes inherit this process's environment."""
    port = free_port()
    os.environ.update(state_api_env(port))
    # A token of its own, in the environment its processes inherit: Ray would otherwise write one to
    # ~/.ray/auth_token, and a pod's home is read-only.
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=True, dashboard_host="127.0.0.1",
             dashboard_port=port, _node_ip_address="127.0.0.1", **kwargs)


def join_or_start(num_cpus: int, **kwargs) -> bool:
    """The cluster at ``RAY_ADDRESS`` when it is set, else a new local Ray of ``num_cpus``; nothing when this process
    is connected already. True when it started a Ray here."""
    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        join_cluster(**kwargs)
        return False
    start_local_ray(num_cpus, **kwargs)
    return True


def join_cluster(**kwargs) -> None:
    """The cluster at ``RAY_ADDRESS``, once its port answers: ``ray.init`` would retry an address where nothing
    listens for many minutes, saying nothing on the terminal."""
    address = os.environ["RAY_ADDRESS"]
    scheme, _, rest = address.rpartition("://")
    if scheme not in ("", "ray"):
        raise SpotrayError(f"RAY_ADDRESS={address}: an address of {scheme} (a dashboard's, for `ray job submit`), "
                           f"not a Ray cluster's: {_ADDRESS_FIX}")
    host, _, port = rest.rpartition(":")
    if host and port.isdigit():  # "auto", "local": Ray's own lookups, which fail fast
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
        except OSError as exc:
            raise SpotrayError(f"RAY_ADDRESS={address}: no Ray cluster answers there ({exc.strerror or exc}): "
                               f"{_ADDRESS_FIX}") from None
    try:
        ray.init(**kwargs)
    except ConnectionError as exc:  # something answers there, but not a Ray head
        raise SpotrayError(f"RAY_ADDRESS={address}: {str(exc).splitlines()[0]}: {_ADDRESS_FIX}") from None

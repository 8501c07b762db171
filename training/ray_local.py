"""A Ray of this machine alone, for runs, prepares and tests that are not given a cluster."""

from __future__ import annotations

import ray


def start_local_ray(num_cpus: int, **kwargs) -> None:
    """A new single-node Ray on this machine, reachable on loopback only.

    ``address="local"``: never attach to whatever cluster ``ray start`` last recorded on this machine."""
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1", **kwargs)

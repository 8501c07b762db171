"""Shared fixtures: a real S3 endpoint on loopback (moto server), buckets, and a generated, prepared corpus; and
the session's last check, that no service a test started is left running."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from spotray.data.prepare import prepare
from spotray.drills.s3local import create_bucket, moto_server
from spotray.storage import StorageOptions, resolve
from tests.corpus import write_corpus
from tests.repo import REPO, STACKS

# What the tests start: Ray's processes, the moto S3 server, MLflow's tracking server, Prometheus. They are told
# apart from other sessions' by a variable of this session's that every process it starts inherits.
SERVICES = ("raylet", "gcs_server", "ray/dashboard", "ray::", "moto_server", "moto.server", "mlflow", "prometheus")
SESSION_VARIABLE = "SPOTRAY_TEST_SESSION"
LEFTOVER_GRACE_S = 30  # Ray's processes exit a few seconds after ray.shutdown()
_SECONDS_BY_FOLDER: dict[str, list] = {}  # folder -> [seconds, tests run]


def _services(session_id: str) -> dict[int, str]:
    """This session's service processes still running (a pytest -k may name them: this process is left out)."""
    found = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        command = " ".join(proc.info["cmdline"] or [])
        if proc.info["pid"] == os.getpid() or not any(name in command for name in SERVICES):
            continue
        try:
            if proc.environ().get(SESSION_VARIABLE) == session_id:
                found[proc.info["pid"]] = command
        except psutil.Error:
            pass
    return found


def _listening_ports(pid: int) -> list[int]:
    try:
        return sorted(c.laddr.port for c in psutil.Process(pid).net_connections() if c.status == psutil.CONN_LISTEN)
    except psutil.Error:
        return []


# Ray's timings for every Ray process the tests start (which inherit this environment). A killed node is marked dead
# after 5 failed health checks 3 s apart by default, and each kill drill waits for that: after 2, 1 s apart here (a
# check of a node that is gone fails at once; one of a busy node waits out its own 10 s timeout, so a node is taken for
# dead only after 20 s without an answer). A head unreachable for gcs_rpc_server_reconnect_timeout_s (60 s) ends its
# clients, and the head-loss drills wait for the driver's watch at half of it: 20 s here. Metrics are reported every 10
# s by default, longer than the runs whose gauges the telemetry tests read: every second here.
RAY_TIMINGS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "2",
               "RAY_gcs_rpc_server_reconnect_timeout_s": "20",
               "RAY_metrics_report_interval_ms": "1000"}


# `serial` (make test runs these alone, one at a time, after the others) for a test that starts Ray nodes: the
# `cluster` marker, or the drills' cluster.
@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("cluster") or "reused_clusters" in item.fixturenames:
            item.add_marker(pytest.mark.serial)


def pytest_sessionstart(session):
    # pytest-xdist starts its workers after this: they keep the id, and the check at the end covers what they started.
    os.environ.setdefault(SESSION_VARIABLE, f"{os.getpid()}-{time.time_ns()}")
    for name, value in RAY_TIMINGS.items():
        os.environ.setdefault(name, value)


def pytest_runtest_logreport(report):
    """Setup, call and teardown time, summed by the test's folder (session fixtures land on their first user)."""
    folder = report.nodeid.split("::")[0].rsplit("/", 1)[0]
    by_folder = _SECONDS_BY_FOLDER.setdefault(folder, [0.0, 0])
    by_folder[0] += report.duration
    by_folder[1] += report.when == "setup"  # once per test, skipped ones included


def pytest_terminal_summary(terminalreporter):
    """The suite's time by folder, for BENCHMARKS.md's table and the next feature's budget."""
    if not _SECONDS_BY_FOLDER:
        return
    terminalreporter.section("time by folder")
    for folder, (seconds, tests) in sorted(_SECONDS_BY_FOLDER.items(), key=lambda kv: -kv[1][0]):
        terminalreporter.write_line(f"{seconds / 60:6.1f} min  {tests:4d} tests  {folder}")
    total = sum(seconds for seconds, _ in _SECONDS_BY_FOLDER.values())
    terminalreporter.write_line(f"{total / 60:6.1f} min  in all")


def pytest_sessionfinish(session, exitstatus):
    """Fails the session where a service a test started outlives it (session fixtures are torn down by now); under
    pytest-xdist, once, in the controller, after every worker ended."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    session_id = os.environ[SESSION_VARIABLE]
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (left := _services(session_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        lines = [f"  pid {pid} (listening on {_listening_ports(pid) or 'no port'}): {cmd[:160]}"
                 for pid, cmd in sorted(left.items())]
        print("\nleft running after the session:\n" + "\n".join(lines))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server process on 127.0.0.1; credentials are exported so every process can reach it."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(params=["local", "s3"])
def storage_root(request, tmp_path):
    """The same test against a local directory and an S3 prefix."""
    if request.param == "local":
        return resolve(str(tmp_path / "root"))
    bucket_url, options = request.getfixturevalue("s3_bucket")
    return resolve(f"{bucket_url}/root", options)


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh bucket; yields (s3 url of the bucket, StorageOptions pointing at the server)."""
    return create_bucket(s3_server), StorageOptions(endpoint_url=s3_server)


@pytest.fixture(scope="session")
def dataset_url(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("dataset")
    corpus = write_corpus(root / "corpus")
    url = str(root / "tokens")
    prepare(corpus, url, shard_tokens=16_384)
    return url


@pytest.fixture(scope="session")
def stack_plans() -> dict:
    """Every stack file of the repository planned once under Pulumi mocks: stack -> (StackConfig, Plan)."""
    from infra.kernel.config import load_stack_file
    from infra.plan import plan

    plans = {}
    for stack in STACKS:
        cfg = load_stack_file(REPO, stack)
        plans[stack] = (cfg, plan(cfg))
    return plans


@pytest.fixture(scope="session")
def dev(stack_plans):
    return stack_plans["dev"][0]

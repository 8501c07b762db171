"""The training half of the command line as the training image runs it: the ``spotray`` console script with the
``infra`` extra's packages absent (the image has none of them). Bad inputs end with one clear error line on stderr
and exit code 2 (no traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from spotray.storage import resolve
from tests.console import assert_full_log, assert_quiet_console, the_log
from tests.corpus import write_corpus
from tests.repo import REPO
from tests.training.driver.test_lease import hold

SPOTRAY = Path(sys.executable).parent / "spotray"
# Every process that starts with it on its path (Ray's workers too) finds none of the extra's packages, and leaves
# its command line in $SPOTRAY_TEST_IMPORT_LOG to show that it ran so.
WITHOUT = """
import importlib.abc, os, pathlib, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {modules!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, NotInstalled())
pathlib.Path(os.environ["SPOTRAY_TEST_IMPORT_LOG"], str(os.getpid())).write_text(" ".join(sys.argv))
"""


def infra_extra_modules() -> list[str]:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return sorted(Requirement(r).name.replace("-", "_") for r in extras["infra"])


@pytest.fixture(scope="module")
def without_infra(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("without-infra")
    (site / "sitecustomize.py").write_text(WITHOUT.format(modules=infra_extra_modules()))
    return site


@pytest.fixture
def image_env(without_infra, tmp_path) -> dict[str, str]:
    (tmp_path / "processes").mkdir()
    return {**os.environ, "PYTHONPATH": str(without_infra), "SPOTRAY_TEST_IMPORT_LOG": str(tmp_path / "processes")}


@pytest.fixture
def spotray(image_env):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(SPOTRAY), *args], capture_output=True, text=True, timeout=180, env=image_env)
    return run


def test_the_extra_is_really_absent_and_train_help_works_without_it(spotray):
    assert "pulumi" in infra_extra_modules() and "pulumi_kubernetes" in infra_extra_modules()
    proc = spotray("train", "--help")
    assert proc.returncode == 0 and "--config" in proc.stdout, proc.stderr
    assert_one_line_error(spotray("plan", "--stack", "dev", "--project-dir", str(REPO)),
                          "spotray plan needs the Pulumi SDKs", "pip install 'spotray[infra]'")


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("spotray: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


def test_missing_index(spotray, tmp_path):
    proc = spotray("train", "--set", f"data.path={tmp_path}/nothing")
    assert_one_line_error(proc, "no index.json", "spotray prepare")


def test_wrong_dtype_in_index(spotray, dataset_url, tmp_path):
    import shutil

    copy = tmp_path / "tokens"
    shutil.copytree(dataset_url, copy)
    index = json.loads((copy / "index.json").read_text())
    index["dtype"] = "float32"
    (copy / "index.json").write_text(json.dumps(index))
    assert_one_line_error(spotray("train", "--set", f"data.path={copy}"), "dtype")


def test_empty_corpus(spotray, tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "empty.txt").write_text("")
    assert_one_line_error(spotray("prepare", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")),
                          "empty corpus")


def test_unknown_config_key(spotray, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  path: /x\ntrain:\n  max_stepz: 3\n")
    assert_one_line_error(spotray("train", "--config", str(config)), "train.max_stepz", "unknown key", "max_steps")


def test_world_size_larger_than_global_batch(spotray, dataset_url):
    proc = spotray("train", "--set", f"data.path={dataset_url}", "--set", "scaling.num_workers=16",
                   "--set", "train.global_batch_size=8")
    assert_one_line_error(proc, "scaling.num_workers", "global_batch_size")


@pytest.mark.parametrize("pair,needle", [("train.lr=fast", "train.lr"), ("parallel=tp", "parallel"),
                                         ("noequals", "key=value"), ("model.preset=gpt5", "model.preset")])
def test_bad_overrides(spotray, pair, needle, dataset_url):
    assert_one_line_error(spotray("train", "--set", f"data.path={dataset_url}", "--set", pair), needle)


def test_a_bad_prices_file_stops_the_run_before_it_writes_anything(spotray, dataset_url, tmp_path):
    (tmp_path / "prices.json").write_text('{"region": "us-east-1", "fetched_at": 1, "on_demand": {"g5.xlarge": -1.0}, '
                                          '"spot": {}}')
    proc = spotray("train", "--set", f"data.path={dataset_url}", "--set", f"checkpoint.path={tmp_path}/ckpt",
                   "--set", f"cost.prices_file={tmp_path}/prices.json")
    assert_one_line_error(proc, "on_demand.g5.xlarge", "positive")
    assert not (tmp_path / "ckpt").exists()


def test_a_run_into_a_bucket_that_does_not_exist_is_one_line_before_its_header_and_log(spotray, dataset_url, s3_server):
    """It printed the header, then a warning that the log could not be uploaded, then the error."""
    proc = spotray("train", "--set", f"data.path={dataset_url}", "--set", "checkpoint.path=s3://missing/runs",
                   "--set", f"storage.endpoint_url={s3_server}")
    assert_one_line_error(proc, "cannot write s3://missing/runs/spotray", "no bucket 'missing'")
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_a_run_that_another_live_driver_trains_is_refused_in_one_line_touching_nothing(spotray, dataset_url, tmp_path):
    """A second terminal's `spotray train` of the same run: it resumed from the first one's step, removed its
    snapshots and ended its attempt as lost, or failed on checkpoints the first one's retention deleted."""
    run = resolve(str(tmp_path / "ckpt" / "spotray"))
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) as other:
        hold(run.child("attempts"), other.pid)
        proc = spotray("train", "--set", f"data.path={dataset_url}", "--set", f"checkpoint.path={tmp_path}/ckpt")
        other.kill()
    assert_one_line_error(proc, f"run 'spotray' at {run.url} is being trained by another driver (pid {other.pid} on ")
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert [path.name for path in (tmp_path / "ckpt" / "spotray" / "attempts").iterdir()] == ["driver.json"]


# The prepare-on-Ray test below runs Ray's workers without the extra, and the manual's example's test in
# test_user_task trains through the console script, in make test.
@pytest.mark.e2e
def test_prepare_then_train_from_the_command_line_with_no_pulumi_in_any_process(spotray, image_env, tmp_path,
                                                                                  ray_address):
    corpus = write_corpus(tmp_path / "corpus", documents=8)
    prep = spotray("prepare", "--input", corpus, "--output", str(tmp_path / "data"))
    assert prep.returncode == 0, prep.stderr
    summary_path = tmp_path / "summary.json"
    run = ["--set", f"data.path={tmp_path}/data", "--set", f"checkpoint.path={tmp_path}/ckpt", "--set",
           "train.max_steps=6", "--set", "checkpoint.every_steps=3", "--set", "train.seq_len=32", "--set",
           "scaling.num_workers=2", "--set", "run.name=cli"]
    proc = spotray("train", *run, "--summary-json", str(summary_path), "--audit-dir", str(tmp_path / "audit"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["final_step"] == 6 and summary["samples_consumed"] == 6 * 8
    assert len(summary["param_sha256"]) == 64 and summary["tokens_per_s"] > 0
    assert len(summary["checkpoints"]) == 2 and summary["audit"]["exactly_once"]
    commands = [p.read_text() for p in Path(image_env["SPOTRAY_TEST_IMPORT_LOG"]).iterdir()]
    assert any(c.split()[1:2] == ["train"] for c in commands), commands
    assert any("default_worker.py" in c for c in commands), "Ray's workers must have run without the extra too"

    assert_quiet_console(proc.stdout + proc.stderr, "spotray: checkpoints: 2 kept")
    assert proc.stdout.startswith("spotray: done: cli at step 6") and "every sample exactly once: yes" in proc.stdout
    assert_full_log(the_log(tmp_path / "ckpt" / "cli", proc.stderr), last_step=6)

    # On the session's Ray: starting a local one is what the run above checked.
    again = subprocess.run([str(SPOTRAY), "train", *run, "--set", "train.max_steps=8", "--verbose", "--json"],
                           capture_output=True, text=True, timeout=180, env={**image_env, "RAY_ADDRESS": ray_address})
    assert again.returncode == 0, again.stderr[-3000:]
    extended = json.loads(again.stdout)
    assert extended["final_step"] == 8, "--json keeps stdout pure JSON"
    assert "spotray INFO: step 8/8" in again.stderr, "--verbose shows the workers' lines"
    # A finished run extended: the pause between the two commands is neither an interruption nor the run's time.
    assert "the run was finished at step 6: not an interruption" in again.stderr, again.stderr[-3000:]
    assert "CONTINUING from step 6" in again.stderr and "RESUMED" not in again.stderr
    (finished,) = extended["events"]
    assert (finished["kind"], finished["spot"], finished["recovery_s"]) == ("finished", False, None)
    assert extended["spot_interruptions"] == 0 and extended["time"]["paused_s"] > 0
    done = subprocess.run([str(SPOTRAY), "train", *run, "--set", "train.max_steps=8", "--json"], capture_output=True,
                          text=True, timeout=180, env={**image_env, "RAY_ADDRESS": ray_address})
    assert done.returncode == 0 and json.loads(done.stdout)["final_loss"] == extended["final_loss"], done.stderr
    assert ("spotray: run 'cli' finished at step 8 already: nothing to train (raise train.max_steps to train on)"
            in done.stderr.splitlines()), done.stderr[-3000:]


@pytest.mark.cluster  # starts a Ray of its own
@pytest.mark.e2e
def test_prepare_on_ray_prints_its_summary_and_verify_names_a_damaged_shard(spotray, image_env, tmp_path):
    lines = [json.dumps({"body": f"document {i} " + "spot ray " * (i % 17)}) for i in range(400)]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "data"
    proc = spotray("prepare", "--input", str(tmp_path / "in.jsonl"), "--output", str(out), "--text-field", "body",
                   "--chunk-mb", "0.01", "--parallelism", "2", "--shard-tokens", "4096")
    assert proc.returncode == 0, proc.stderr[-3000:]
    index = json.loads((out / "index.json").read_text())
    assert index["num_documents"] == 400 and len({s["name"].split("/")[1] for s in index["shards"]}) > 2
    assert (f"prepared {index['total_tokens']:,} tokens from 400 documents into {len(index['shards'])} shards at "
            f"{out}: 0.0 MB in") in proc.stdout
    commands = [p.read_text() for p in Path(image_env["SPOTRAY_TEST_IMPORT_LOG"]).iterdir()]
    assert any("default_worker.py" in c for c in commands), "the chunks ran as Ray tasks, without the infra extra"

    assert spotray("prepare", "--verify", str(out)).returncode == 0
    shard = out / index["shards"][-1]["name"]
    shard.write_bytes(shard.read_bytes()[:-2])
    assert_one_line_error(spotray("prepare", "--verify", str(out)), "1 of", index["shards"][-1]["name"],
                          "the index says")


def test_the_programs_verbs_run_the_pulumi_program_in_the_clone_at_project_dir(tmp_path, monkeypatch, capsys):
    from spotray.cli import main

    monkeypatch.chdir(tmp_path)  # not a clone
    assert main(["plan", "--stack", "dev", "--project-dir", str(REPO), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stack"] == "dev"
    assert main(["plan", "--stack", "dev"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"spotray: error: spotray plan runs the Pulumi program of a clone "
                                                   f"of spotray's repository, and {tmp_path} holds none"), err
    assert main(["submit", "--help"]) == 0  # a user with the package only
    assert "submit a training RayJob" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--stack", "dev", "--json"]])
def test_help_and_plan_import_no_torch(argv):
    """Each command imports what it needs when it runs: `spotray --help` and the Pulumi program's verbs load no torch
    (the provisioning side and a laptop's `spotray plan` need none)."""
    code = (f"import sys\nfrom spotray.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.splitlines()[-1] == "False"


@pytest.mark.parametrize(("argv", "unknown", "usage_names"), [
    (["prepare", "corpus.jsonl", "data"], "corpus.jsonl data", "--input URL"),
    (["status", "runs/a", "runs/b"], "runs/b", "RUN_URL"), (["train", "--steps", "4"], "--steps", "--set KEY=VALUE")])
def test_an_argument_a_command_does_not_take_is_said_with_that_commands_usage(argv, unknown, usage_names, capsys):
    from spotray.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.startswith(f"usage: spotray {argv[0]} ") and usage_names in err
    assert err.splitlines()[-1] == f"spotray {argv[0]}: error: unrecognized arguments: {unknown}"

"""The alert rules pass ``promtool check rules`` and behave as named, shown by ``promtool test rules`` on
synthetic series (time starts at 0 there, so a timestamp gauge of 0 means "at the start")."""

import re

import yaml

from infra.kernel.config import AlertThresholds
from monitoring.rules import rule_groups
from tests.monitoring.prom import promtool, rules_file

THRESHOLDS = AlertThresholds(stalled_minutes=10, checkpoint_minutes=30, goodput_below=0.7, preemptions_per_hour=3,
                             gpu_utilization_below=20)


def test_promtool_accepts_every_rule(tmp_path):
    result = promtool("check", "rules", str(rules_file(rule_groups(THRESHOLDS), tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 9 rules found" in result.stdout


def firing(name: str, at: str, labels: dict | None, value: str = "") -> dict:
    """One expectation: ``labels`` is the one alert expected (severity included), or None for none; its summary
    is the rule's, rendered with those labels and ``value``."""
    if labels is None:
        return {"eval_time": at, "alertname": name, "exp_alerts": []}
    rule = next(r for g in rule_groups(THRESHOLDS) for r in g.get("rules", []) if r.get("alert") == name)
    summary = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], rule["annotations"]["summary"])
    summary = summary.replace("{{ $value }}", value)
    return {"eval_time": at, "alertname": name,
            "exp_alerts": [{"exp_labels": {"alertname": name, **labels}, "exp_annotations": {"summary": summary}}]}


def run_cases(tmp_path, series: dict[str, str], cases: list[dict]):
    rules = rules_file(rule_groups(THRESHOLDS), tmp_path)
    test = {"rule_files": [rules.name], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series.items()],
                       "alert_rule_test": cases}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_run_without_step_progress_alerts_and_a_progressing_or_finished_one_does_not(tmp_path):
    run_cases(tmp_path, {
        'ray_spotray_last_step_timestamp_seconds{run="stuck"}': "0x30",
        'ray_spotray_step{run="stuck"}': "5x30",
        'ray_spotray_max_steps{run="stuck"}': "100x30",
        'ray_spotray_last_step_timestamp_seconds{run="moving"}': "0+60x30",
        'ray_spotray_step{run="moving"}': "0+1x30",
        'ray_spotray_max_steps{run="moving"}': "100x30",
        'ray_spotray_last_step_timestamp_seconds{run="done"}': "0x30",
        'ray_spotray_step{run="done"}': "100x30",
        'ray_spotray_max_steps{run="done"}': "100x30",
    }, [
        firing("SpotrayTrainingStalled", "9m", None),
        firing("SpotrayTrainingStalled", "13m", {"run": "stuck", "severity": "critical"}),
    ])


def test_a_run_whose_last_checkpoint_is_too_old_alerts(tmp_path):
    run_cases(tmp_path, {
        'ray_spotray_last_checkpoint_timestamp_seconds{run="r"}': "0x20 1500x30",
        'ray_spotray_step{run="r"}': "1+1x50",
        'ray_spotray_max_steps{run="r"}': "1000x50",
    }, [
        firing("SpotrayNoCommittedCheckpoint", "20m", None),
        firing("SpotrayNoCommittedCheckpoint", "40m", None),  # a checkpoint committed at 25 min
        firing("SpotrayNoCommittedCheckpoint", "58m", {"run": "r", "severity": "warning"}),
    ])


def test_goodput_must_stay_low_for_half_an_hour_to_alert(tmp_path):
    run_cases(tmp_path, {'ray_spotray_goodput{run="r"}': "0.5x40", 'ray_spotray_goodput{run="ok"}': "0.9x40"}, [
        firing("SpotrayGoodputLow", "20m", None),
        firing("SpotrayGoodputLow", "35m", {"run": "r", "severity": "warning"}),
    ])


def test_interruptions_within_an_hour_make_a_storm_even_across_restarted_worker_series(tmp_path):
    run_cases(tmp_path, {
        'ray_spotray_interruptions{run="r", WorkerId="a"}': "0x10 _x50",
        'ray_spotray_interruptions{run="r", WorkerId="b"}': "_x10 1x10 _x40",
        'ray_spotray_interruptions{run="r", WorkerId="c"}': "_x20 3x40",
        'ray_spotray_interruptions{run="calm"}': "0x60",
    }, [
        firing("SpotrayPreemptionStorm", "15m", None),
        firing("SpotrayPreemptionStorm", "25m", {"run": "r", "severity": "warning"}),
    ])


def test_idle_gpus_alert_only_while_a_run_trains(tmp_path):
    run_cases(tmp_path, {
        'DCGM_FI_DEV_GPU_UTIL{gpu="0"}': "5x60",
        'ray_spotray_step{run="r"}': "_x30 1+1x30",
    }, [
        firing("SpotrayGpuUtilizationLow", "25m", None),
        firing("SpotrayGpuUtilizationLow", "50m", {"severity": "warning"}),
    ])


def test_minio_and_ray_head_outages_alert(tmp_path):
    run_cases(tmp_path, {
        "minio_cluster_nodes_offline_total": "0x5 1x10",
        "minio_cluster_drive_offline_total": "0x15",
        "minio_cluster_capacity_usable_free_bytes": "5x30",
        "minio_cluster_capacity_usable_total_bytes": "100x30",
        'up{ray_node_type="head", ray_io_cluster="job-a", namespace="spotray", port="metrics"}': "1x3 0x10",
        'up{ray_node_type="head", ray_io_cluster="job-a", namespace="spotray", port="as-metrics"}': "0x13",
        'up{ray_node_type="head", ray_io_cluster="job-b", namespace="spotray", port="metrics"}': "1x13",
    }, [
        firing("MinioNodesOffline", "12m", {"severity": "critical"}, value="1"),
        firing("MinioDrivesOffline", "12m", None),
        firing("MinioDiskAlmostFull", "20m", {"severity": "warning"}),
        firing("RayHeadDown", "4m", None),
        firing("RayHeadDown", "7m", {"namespace": "spotray", "ray_io_cluster": "job-a", "severity": "critical"}),
    ])

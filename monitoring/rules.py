"""Alert rules as data: the Prometheus rule groups (checked by promtool) and the PrometheusRule that carries them.

Training series are Ray gauges (``training/spotray/worker/telemetry.py``), prefixed ``ray_spotray_`` and tagged
``run``. A restarted worker group exports them under new series, so rules aggregate ``by (run)`` over a window."""

from __future__ import annotations

from infra.kernel.config import AlertThresholds
from monitoring.monitors import MONITORING_API

RUN_MEMORY = "1d"  # how long a run that stopped reporting is still looked at
_FINISHED = (f"max by (run) (max_over_time(ray_spotray_step[{RUN_MEMORY}])) "
             f">= max by (run) (max_over_time(ray_spotray_max_steps[{RUN_MEMORY}]))")


def _seconds_since(gauge: str) -> str:
    return f"time() - max by (run) (max_over_time(ray_spotray_{gauge}[{RUN_MEMORY}]))"


def _alert(name: str, expr: str, for_: str, severity: str, summary: str) -> dict:
    return {"alert": name, "expr": expr, "for": for_, "labels": {"severity": severity},
            "annotations": {"summary": summary}}


def training_rules(t: AlertThresholds) -> list[dict]:
    return [
        _alert("SpotrayTrainingStalled",
               f"({_seconds_since('last_step_timestamp_seconds')}) > {t.stalled_minutes * 60} unless on (run) "
               f"({_FINISHED})", "1m", "critical",
               f"Run {{{{ $labels.run }}}} has trained no step for {t.stalled_minutes} minutes"),
        _alert("SpotrayNoCommittedCheckpoint",
               f"({_seconds_since('last_checkpoint_timestamp_seconds')}) > {t.checkpoint_minutes * 60} unless on (run) "
               f"({_FINISHED})", "1m", "warning",
               f"Run {{{{ $labels.run }}}} has committed no checkpoint for {t.checkpoint_minutes} minutes: a "
               "preemption now would lose all that work"),
        _alert("SpotrayGoodputLow", f"max by (run) (ray_spotray_goodput) < {t.goodput_below}", "30m", "warning",
               f"Run {{{{ $labels.run }}}} keeps less than {t.goodput_below:.0%} of its wall time as progress"),
        _alert("SpotrayPreemptionStorm",
               "max by (run) (max_over_time(ray_spotray_interruptions[1h])) "
               f"- min by (run) (min_over_time(ray_spotray_interruptions[1h])) >= {t.preemptions_per_hour}",
               "0m", "warning",
               f"Run {{{{ $labels.run }}}} had {t.preemptions_per_hour} or more spot interruptions in an hour: "
               "consider other instance types or on-demand fallback"),
        _alert("SpotrayGpuUtilizationLow",
               f"avg(DCGM_FI_DEV_GPU_UTIL) < {t.gpu_utilization_below} and on () (count(ray_spotray_step) > 0)",
               "15m", "warning",
               f"GPUs average under {t.gpu_utilization_below:g}% utilisation while a run trains"),
    ]


def platform_rules() -> list[dict]:
    return [
        _alert("MinioNodesOffline", "max(minio_cluster_nodes_offline_total) > 0", "5m", "critical",
               "{{ $value }} MinIO node(s) offline: checkpoints are at risk"),
        _alert("MinioDrivesOffline", "max(minio_cluster_drive_offline_total) > 0", "5m", "critical",
               "{{ $value }} MinIO drive(s) offline"),
        _alert("MinioDiskAlmostFull",
               "min(minio_cluster_capacity_usable_free_bytes / minio_cluster_capacity_usable_total_bytes) < 0.1",
               "15m", "warning", "MinIO has less than 10% usable space left: checkpoint saves will fail"),
        _alert("RayHeadDown", 'max by (namespace, ray_io_cluster) (up{ray_node_type="head"}) == 0', "2m", "critical",
               "The Ray head of {{ $labels.ray_io_cluster }} answers no scrape: the job is down or stuck"),
    ]


def rule_groups(t: AlertThresholds) -> list[dict]:
    return [{"name": "spotray-training", "rules": training_rules(t)},
            {"name": "spotray-platform", "rules": platform_rules()}]


def prometheus_rule(namespace: str, monitor_labels: dict[str, str], t: AlertThresholds) -> dict:
    return {"apiVersion": MONITORING_API, "kind": "PrometheusRule",
            "metadata": {"name": "spotray-alerts", "namespace": namespace, "labels": dict(monitor_labels)},
            "spec": {"groups": rule_groups(t)}}

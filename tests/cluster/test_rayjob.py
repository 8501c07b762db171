import json
from dataclasses import replace

import jsonschema
import pytest
import yaml

from cluster.pod_security import CACHE_VARIABLES
from cluster.rayjob import (
    DRAIN_MARGIN_S,
    HEAD_LOCAL_DISK_GIB,
    LOCAL_DIR,
    MAX_NAME,
    WORKER_LOCAL_DISK_GIB,
    JobSettings,
    config_map,
    job_name,
    job_settings,
    rayjob,
)
from infra.kernel.config import TrainingJobConfig
from infra.kernel.names import prometheus_url
from spotray.accounts.node_records import NODE_NAME_ENV
from spotray.config import from_dict, load
from spotray.errors import ConfigError
from tests.cluster.stacks import stack
from tests.schemas import validate_custom_resource

RAYJOB_CRD = "kuberay-v1.7.0_ray.io_rayjobs.yaml"
SETTINGS = JobSettings(image="123456789012.dkr.ecr.us-west-2.amazonaws.com/spotray/dev/training:abc123",
                       gpu_pool="a10g-spot", storage_endpoint="https://minio.spotray.svc.cluster.local:9000",
                       storage_secret="spotray-storage", storage_ca_secret="minio-crt",
                       job=TrainingJobConfig(env_secrets={"WANDB_API_KEY": "wandb"}, backoff_limit=5))


def train_config(*overrides):
    return load(None, ["data.path=s3://spotray-dev/spotray/data", "checkpoint.path=s3://spotray-dev/spotray/ckpt",
                       "run.name=gpt-a10g", "scaling.num_workers=4", "scaling.use_gpu=true",
                       "env.forward=[WANDB_API_KEY]", *overrides])


@pytest.fixture(scope="module")
def job():
    return rayjob(train_config(), SETTINGS)


def workers(job):
    return job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]


def head(job):
    return job["spec"]["rayClusterSpec"]["headGroupSpec"]


def test_the_rayjob_validates_against_the_kuberay_crd(job):
    validate_custom_resource(job, RAYJOB_CRD)


def test_the_crd_check_catches_a_misspelt_field(job):
    broken = json.loads(json.dumps(job))
    broken["spec"]["backofLimit"] = 3
    with pytest.raises(jsonschema.ValidationError, match="backofLimit"):
        validate_custom_resource(broken, RAYJOB_CRD)


@pytest.mark.parametrize(("gpus", "cpus", "memory"), [(1, 8, 32), (4, 48, 192)])
def test_each_workers_ray_resources_equal_its_containers(gpus, cpus, memory):
    settings = JobSettings(image="i", gpu_pool="p", job=TrainingJobConfig(
        gpus_per_worker=gpus, cpus_per_worker=cpus, memory_gib_per_worker=memory))
    group = workers(rayjob(train_config("env.forward=[]"), settings))
    container = group["template"]["spec"]["containers"][0]["resources"]
    assert container["requests"] == container["limits"]
    assert group["rayStartParams"]["num-gpus"] == container["limits"]["nvidia.com/gpu"] == str(gpus)
    assert group["rayStartParams"]["num-cpus"] == container["limits"]["cpu"] == str(cpus)
    assert int(group["rayStartParams"]["memory"]) == memory << 30 and container["limits"]["memory"] == f"{memory}Gi"


def test_a_multi_gpu_pod_runs_a_worker_per_gpu_so_that_no_gpu_is_paid_for_idle():
    """As torchrun's --nproc-per-node on a p5.48xlarge: before, 16 workers of one GPU each asked 16 pods of 8 GPUs,
    128 GPUs for 16 workers (Ray packed them into 2 pods and left 14 idle)."""
    settings = JobSettings(image="i", gpu_pool="p", job=TrainingJobConfig(gpus_per_worker=8, cpus_per_worker=96,
                                                                          memory_gib_per_worker=1024))
    group = workers(rayjob(train_config("env.forward=[]", "scaling.num_workers=16", "train.global_batch_size=16"),
                           settings))
    assert (group["replicas"], group["rayStartParams"]["num-gpus"]) == (2, "8")


def test_a_workers_pod_memory_includes_its_snapshots_but_rays_memory_resource_does_not():
    group = workers(rayjob(train_config("snapshot.every_steps=auto", "snapshot.max_gb_per_node=10"), SETTINGS))
    container = group["template"]["spec"]["containers"][0]["resources"]
    assert container["requests"]["memory"] == container["limits"]["memory"] == "42Gi"  # 32 + 10 GB in whole GiB
    assert int(group["rayStartParams"]["memory"]) == 32 << 30  # what tasks may reserve: the holders take none


@pytest.mark.parametrize("snapshots", ["snapshot.every_steps=0", "snapshot.every_steps=auto"])
def test_a_workers_pod_memory_without_a_snapshot_bound_is_its_own(snapshots):
    """Unset, the holders share the room the pod's limit leaves (spotray.snapshots.holders.refusal)."""
    group = workers(rayjob(train_config(snapshots), SETTINGS))
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == "32Gi"


def test_workers_are_a_fixed_size_group_on_the_gpu_spot_pool_and_tolerate_its_taint(job):
    group = workers(job)
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 4
    spec = group["template"]["spec"]
    assert spec["nodeSelector"] == {"spotray.dev/pool": "a10g-spot"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert group["template"]["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert job["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] is False


def test_the_head_runs_on_the_core_pool_trains_nothing_and_is_not_exposed(job):
    group = head(job)
    assert group["rayStartParams"]["num-cpus"] == "0"
    assert group["template"]["spec"]["nodeSelector"] == {"spotray.dev/pool": "core"}
    assert "tolerations" not in group["template"]["spec"]
    assert group["serviceType"] == "ClusterIP"
    assert "LoadBalancer" not in json.dumps(job) and "NodePort" not in json.dumps(job)
    assert job["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token"}


def test_the_spot_notice_covers_the_drain_and_the_pod_exit(job):
    spec = workers(job)["template"]["spec"]
    drain = next(e for e in spec["containers"][0]["env"] if e["name"] == "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S")
    assert int(drain["value"]) + DRAIN_MARGIN_S == spec["terminationGracePeriodSeconds"] == 120


def test_retries_build_a_new_cluster_and_a_job_starved_of_capacity_gives_up(job):
    spec = job["spec"]
    assert spec["backoffLimit"] == 5 and spec["preRunningDeadlineSeconds"] == 1800
    rules = spec["deletionStrategy"]["deletionRules"]
    assert {"policy": "DeleteWorkers", "condition": {"jobStatus": "FAILED", "ttlSeconds": 0}} in rules


def test_secrets_come_from_secret_refs_never_as_values(job):
    env = head(job)["template"]["spec"]["containers"][0]["env"]
    by_name = {e["name"]: e for e in env}
    assert by_name["AWS_SECRET_ACCESS_KEY"] == {
        "name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "spotray-storage",
                                                                         "key": "AWS_SECRET_ACCESS_KEY"}}}
    assert by_name["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "wandb", "key": "WANDB_API_KEY"}
    plain = {"AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE", "SPOTRAY_LOCAL_DIR", *CACHE_VARIABLES}
    assert all("value" not in e for e in env if e["name"] not in plain)


@pytest.mark.parametrize("group", [head, workers])
def test_ray_pods_reach_minio_over_https_trusting_the_ca_its_chart_generated(job, group):
    spec = group(job)["template"]["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["AWS_ENDPOINT_URL_S3"].startswith("https://")
    mount = next(m for m in container["volumeMounts"] if env["AWS_CA_BUNDLE"].startswith(m["mountPath"] + "/"))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert mount["readOnly"] and volume["secret"] == {"secretName": "minio-crt",
                                                      "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert env["AWS_CA_BUNDLE"] == f"{mount['mountPath']}/ca.crt"


def test_a_forwarded_variable_without_a_secret_is_refused():
    with pytest.raises(ConfigError, match="env.forward.*HF_TOKEN.*training.envSecrets"):
        rayjob(train_config("env.forward=[WANDB_API_KEY,HF_TOKEN]"), SETTINGS)


def test_the_entrypoint_reads_the_config_map_mounted_on_the_head(job):
    cm = config_map(train_config(), SETTINGS)
    assert job["spec"]["entrypoint"] == "spotray train --config /etc/spotray/train.yaml"
    volume = head(job)["template"]["spec"]["volumes"][0]
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    assert yaml.safe_load(cm["data"]["train.yaml"])["scaling"]["num_workers"] == 4


def test_the_driver_copies_no_variables_because_every_pod_gets_them_from_secrets():
    cfg = train_config("env.forward=[WANDB_API_KEY]")
    cm, job = config_map(cfg, SETTINGS), rayjob(cfg, SETTINGS)
    assert from_dict(yaml.safe_load(cm["data"]["train.yaml"])).env.on_nodes is True
    workers = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"]
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY"} <= {e["name"] for e in workers}


def _planned_rate(cfg, settings) -> float:
    return from_dict(yaml.safe_load(config_map(cfg, settings)["data"]["train.yaml"])).fault_tolerance \
        .interruptions_per_hour


def test_a_run_that_sets_no_interruption_rate_plans_for_its_pools_and_one_that_does_keeps_its_own(project):
    pools = [{"name": "a10g-spot", "families": ["g5"]}, {"name": "h100-spot", "families": ["p5"],
                                                         "interruptionsPerHour": 0.25}]
    settings = job_settings(stack(project, gpu_pools=pools, gpuPool="h100-spot"))
    assert settings.pool_interruptions_per_hour == 0.25
    assert _planned_rate(train_config(), settings) == 0.25
    assert _planned_rate(train_config("fault_tolerance.expected_interruptions_per_hour=3"), settings) == 3
    assert _planned_rate(train_config(), replace(settings, pool_interruptions_per_hour=None)) == 1  # no history


def test_names_longer_than_kuberay_allows_are_refused():
    assert job_name(train_config("run.name=My_Run.v2")) == "my-run-v2"
    with pytest.raises(ConfigError, match=f"run.name.*at most {MAX_NAME}"):
        job_name(train_config(f"run.name={'x' * (MAX_NAME + 1)}"))


@pytest.mark.parametrize(("group", "disk_gib"), [(head, HEAD_LOCAL_DISK_GIB), (workers, WORKER_LOCAL_DISK_GIB)])
def test_every_ray_pod_gets_a_local_scratch_dir(job, group, disk_gib):
    spec = group(job)["template"]["spec"]
    assert LOCAL_DIR == "/local"
    assert {"name": "local", "emptyDir": {"sizeLimit": f"{disk_gib}Gi"}} in spec["volumes"]
    (container,) = spec["containers"]
    assert {"name": "local", "mountPath": "/local"} in container["volumeMounts"]
    assert {"name": "SPOTRAY_LOCAL_DIR", "value": "/local"} in container["env"]


@pytest.mark.parametrize("group", [head, workers])
def test_every_ray_pod_learns_its_nodes_name_from_the_downward_api(job, group):
    (container,) = group(job)["template"]["spec"]["containers"]
    assert {"name": NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    assert NODE_NAME_ENV == "SPOTRAY_NODE_NAME"


def test_only_the_head_runs_as_the_service_account_that_may_read_nodes(job):
    assert head(job)["template"]["spec"]["serviceAccountName"] == "spotray-head"
    assert workers(job)["template"]["spec"]["serviceAccountName"] == "spotray-training"
    assert job["spec"]["submitterPodTemplate"]["spec"]["serviceAccountName"] == "spotray-training"


def _planned_cost(cfg, settings):
    return from_dict(yaml.safe_load(config_map(cfg, settings)["data"]["train.yaml"])).cost


POOL_PRICES = {"g5.xlarge": {"spot": 0.45, "on-demand": 1.006}, "g5.2xlarge": {"on-demand": 1.212}}


def test_a_run_that_sets_no_prices_bills_at_its_pools_counts_its_spares_and_reads_the_stacks_prometheus(project):
    pools = [{"name": "a10g-spot", "families": ["g5"], "warmSpares": 1, "pricesUsdPerHour": POOL_PRICES}]
    settings = job_settings(stack(project, gpu_pools=pools))
    assert settings.pool_prices == POOL_PRICES and settings.pool_warm_spares == 1
    # kube-prometheus-stack's Service for the release kube-prometheus-stack in monitoring
    assert settings.prometheus_url == \
        "http://kube-prometheus-stack-prometheus.monitoring.svc.cluster.local:9090"
    cost = _planned_cost(train_config(), settings)
    assert (cost.prices, cost.warm_spares, cost.prometheus_url) == (POOL_PRICES, 1, settings.prometheus_url)
    own = _planned_cost(train_config("cost.prices={p5.48xlarge: {spot: 40}}", "cost.warm_spares=2",
                                     "cost.prometheus_url=http://prometheus.obs:9090"), settings)
    assert (own.prices, own.warm_spares, own.prometheus_url) == (
        {"p5.48xlarge": {"spot": 40}}, 2, "http://prometheus.obs:9090")


def test_a_stack_without_prices_or_its_own_prometheus_leaves_the_run_to_find_them(project):
    settings = job_settings(stack(project, monitoring={"mode": "existing"}))
    assert (settings.pool_prices, settings.pool_warm_spares, settings.prometheus_url) == ({}, 0, None)
    cost = _planned_cost(train_config(), settings)
    assert (cost.prices, cost.warm_spares, cost.prometheus_url) == ({}, 0, None)


@pytest.mark.parametrize(("release", "service"), [
    ("kube-prometheus-stack", "kube-prometheus-stack-prometheus"),
    ("monitoring", "monitoring-kube-prometheus-prometheus"),  # <release>-<chart>, cut to 26 characters
    ("team-kube-prometheus-stack-a", "team-kube-prometheus-stack-prometheus"),
])
def test_the_prometheus_url_is_the_service_kube_prometheus_stack_names_after_its_release(release, service):
    assert prometheus_url(release, "obs") == f"http://{service}.obs.svc.cluster.local:9090"

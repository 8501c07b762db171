"""Warm spare GPU capacity (``gpuPools[].warmSpares``) under Pulumi mocks and in the render: placeholders that hold
exactly one worker's resources on the pool's nodes, below the training workers' priority, caching the image."""

import pytest

from cluster.warm_spares import TRAINING_PRIORITY, WARM_SPARE_PRIORITY
from infra.kernel.names import GPU_TOLERATION, POOL_LABEL, TRAINING_PRIORITY_CLASS, WARM_SPARE_PRIORITY_CLASS
from infra.plan import plan
from infra.render import render
from spotray.errors import ConfigError
from tests.cluster.stacks import IMAGE, stack
from tests.cluster.test_render import check_valid

POOLS = [{"name": "a10g-spot", "families": ["g5"], "gpuLimit": 8, "warmSpares": 2},
         {"name": "l4-spot", "families": ["g6"], "gpuLimit": 4}]


@pytest.fixture
def planned(project):
    cfg = stack(project, gpu_pools=POOLS, gpusPerWorker=1, cpusPerWorker=6, memoryGiBPerWorker=24)
    return cfg, plan(cfg)


def by_name(result, type_: str) -> dict:
    return {r.inputs["metadata"]["name"]: r.inputs for r in result.of_type(type_)}


def test_a_pool_with_spares_gets_placeholders_that_hold_exactly_one_workers_resources(planned):
    cfg, result = planned
    deployments = by_name(result, "kubernetes:apps/v1:Deployment")
    assert set(deployments) == {"warm-spare-a10g-spot"}  # the pool without spares gets none
    spec = deployments["warm-spare-a10g-spot"]["spec"]
    pod = spec["template"]["spec"]
    assert spec["replicas"] == 2
    assert pod["nodeSelector"] == {POOL_LABEL: "a10g-spot"} and pod["tolerations"] == [GPU_TOLERATION]
    assert pod["priorityClassName"] == WARM_SPARE_PRIORITY_CLASS
    (job,) = result.of_type("kubernetes:ray.io/v1:RayJob")
    (workers,) = job.inputs["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    worker = workers["template"]["spec"]
    (placeholder,) = pod["containers"]
    assert placeholder["resources"] == worker["containers"][0]["resources"]
    assert placeholder["resources"]["requests"] == {"cpu": "6", "memory": "24Gi", "nvidia.com/gpu": "1"}
    (cache,) = pod["initContainers"]
    assert cache["image"] == IMAGE == worker["containers"][0]["image"]  # the node pulls the worker's image
    assert worker["priorityClassName"] == TRAINING_PRIORITY_CLASS and worker["nodeSelector"] == pod["nodeSelector"]


def test_workers_outrank_the_spares_which_never_preempt(planned):
    classes = by_name(planned[1], "kubernetes:scheduling.k8s.io/v1:PriorityClass")
    assert classes[TRAINING_PRIORITY_CLASS]["value"] == TRAINING_PRIORITY > 0 > WARM_SPARE_PRIORITY
    assert classes[WARM_SPARE_PRIORITY_CLASS]["value"] == WARM_SPARE_PRIORITY
    assert classes[WARM_SPARE_PRIORITY_CLASS]["preemptionPolicy"] == "Never"
    assert not any(c.get("globalDefault") for c in classes.values())
    assert planned[1].violations(planned[0].environment) == {}


def test_the_rendered_spares_and_priorities_are_valid_kubernetes_objects(planned):
    cfg, result = planned
    rendered = render(cfg, result)
    kinds = {path: obj["kind"] for path, obj in rendered.objects.items()}
    assert kinds["objects/spotray/deployment-warm-spare-a10g-spot.yaml"] == "Deployment"
    assert kinds[f"objects/_cluster/priorityclass-{WARM_SPARE_PRIORITY_CLASS}.yaml"] == "PriorityClass"
    for obj in rendered.objects.values():
        check_valid(obj, cfg.kubernetes.version)


@pytest.mark.parametrize("training", [True, False])
def test_spares_no_node_of_their_pool_holds_are_one_line_naming_the_setting(project, training):
    """A spare holds one worker pod: on a pool whose largest node cannot, it would wait forever, keeping no node warm,
    whether or not the stack runs a training job (and whatever pool the job runs on)."""
    pools = [{"name": "a10g-spot", "families": ["g5"], "sizes": ["12xlarge"], "gpuLimit": 8},
             {"name": "small-spot", "families": ["g5"], "sizes": ["xlarge", "2xlarge"], "warmSpares": 1}]
    cfg = stack(project, gpu_pools=pools, gpusPerWorker=2, cpusPerWorker=8, memoryGiBPerWorker=32,
                enabled=training)
    with pytest.raises(ConfigError, match=r"^config 'spotray:training.gpusPerWorker': is 2, but pool small-spot's "
                                          r"nodes have at most 1 GPU\(s\): its workers and warm spares would wait"):
        plan(cfg)
    plan(stack(project, gpu_pools=[pools[0], {**pools[1], "warmSpares": 0}], gpusPerWorker=2, cpusPerWorker=8,
               memoryGiBPerWorker=32, enabled=training))

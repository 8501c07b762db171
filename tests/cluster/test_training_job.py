"""The training RayJob deployed by ``pulumi up`` when ``spotray:training.enabled``."""

import pytest
import yaml

from infra.plan import plan
from spotray.errors import ConfigError
from tests.cluster.stacks import stack
from tests.schemas import validate_custom_resource


@pytest.mark.parametrize("backend", ["minio", "s3"])
def test_an_enabled_job_is_a_valid_rayjob_that_waits_for_kuberay_and_its_namespace(project, backend):
    result = plan(stack(project, backend))
    job = result.of_type("kubernetes:ray.io/v1:RayJob")[0]
    validate_custom_resource(job.inputs, "kuberay-v1.7.0_ray.io_rayjobs.yaml")
    assert job.inputs["metadata"]["name"] == "gpt-small"
    component = next(r for r in result.resources if r.type == "spotray:cluster:TrainingJob")
    # a dependency on a component is on its resources
    assert {"kuberay-chart", "training-namespace", "training-service-account"} <= set(component.depends_on)
    assert ("minio-chart" in component.depends_on) == (backend == "minio")
    spec = job.inputs["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert spec["serviceAccountName"] == "spotray-training"
    env = {e["name"] for e in spec["containers"][0]["env"]}
    assert ("AWS_SECRET_ACCESS_KEY" in env) == (backend == "minio")  # on S3, Pod Identity instead of keys
    config = next(c.inputs for c in result.of_type("kubernetes:core/v1:ConfigMap")
                  if c.inputs["metadata"]["name"] == "gpt-small-config")
    assert yaml.safe_load(config["data"]["train.yaml"])["run"]["name"] == "gpt-small"


def test_disabled_by_default(stack_plans):
    for _, result in stack_plans.values():
        assert not result.of_type("kubernetes:ray.io/v1:RayJob")


@pytest.mark.parametrize(("training", "key"), [
    ({"image": "repo/training"}, "training.image"),
    ({"gpuPool": "h100-spot"}, "training.gpuPool"),
    ({"backoffLimit": 1}, "training.backoffLimit"),
    ({"config": ""}, "training.config"),
    ({"config": "runs/missing.yaml"}, "training.config"),
])
def test_bad_training_settings_name_the_key(project, training, key):
    with pytest.raises(ConfigError) as err:
        stack(project, **training)
    assert err.value.field == f"spotray:{key}"

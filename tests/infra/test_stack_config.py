import dataclasses
import re
import typing

import pytest

from infra.kernel.config import GpuPoolConfig, StackConfig, TrainingJobConfig, from_values, load_stack_file
from infra.kernel.settings import Section
from infra.kernel.versions import MINIO_IMAGES, Image
from spotray.errors import ConfigError, SpotrayError
from tests.repo import REPO, STACKS


def values(**overrides) -> dict:
    base = {
        "network": {"vpcCidr": "10.20.0.0/16", "availabilityZones": ["us-west-2a", "us-west-2b"]},
        "kubernetes": {"version": "1.33", "publicAccessCidrs": ["203.0.113.0/24"]},
        "gpuPools": [{"name": "a10g", "families": ["g5"]}],
    }
    return {**base, **overrides}


def load(stack: str = "dev", **overrides):
    return from_values("spotray", stack, values(**overrides), "us-west-2")


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_file_loads(stack):
    cfg = load_stack_file(REPO, stack)
    assert cfg.stack == stack and cfg.project == "spotray"


def test_stacks_differ_only_in_values_and_prod_is_protected_with_a_nat_per_zone():
    dev, prod = (load_stack_file(REPO, s) for s in ("dev", "prod"))
    assert dev.network is not None and prod.network is not None
    assert (dev.protect, dev.network.nat_gateways) == (False, "single")
    assert (prod.protect, prod.network.nat_gateways) == (True, "perAz")


def test_subnets_are_carved_from_the_vpc_one_private_and_one_public_per_zone():
    net = load().network
    assert net.private_subnet_cidrs == ("10.20.0.0/19", "10.20.32.0/19")
    assert net.public_subnet_cidrs == ("10.20.224.0/22", "10.20.228.0/22")


@pytest.mark.parametrize(("overrides", "key", "fix"), [
    ({"network": {"vpcCidr": "10.20.0.0/16", "availabilityZones": ["us-west-2a", "us-west-2b"],
                  "privateSubnetCidrs": ["10.20.0.0/19", "10.20.16.0/20"]}},
     "network.privateSubnetCidrs", "own address range"),
    ({"kubernetes": {"serviceCidr": "10.20.128.0/17", "publicAccessCidrs": ["203.0.113.0/24"]}},
     "kubernetes.serviceCidr", "own address range"),
    ({"corePool": {"minSize": 5, "maxSize": 3}}, "corePool", "fix the sizes"),
    ({"gpuPools": [{"name": "x", "families": ["m7i"]}]}, "gpuPools[0].families", "use some of"),
    ({"gpuPools": [{"name": "x", "families": []}]}, "gpuPools[0].families", "list GPU families"),
    ({"gpuPools": [{"name": "x"}]}, "gpuPools[0].families", "a spot pool needs instance types"),
    ({"gpuPools": [{"name": "a", "families": ["g5"]}, {"name": "a", "families": ["g6"]}]}, "gpuPools",
     "its own name"),
    ({"corePool": {"instanceTypes": ["p5.48xlarge"]}}, "corePool.instanceTypes", "GPUs come from gpuPools"),
    ({"network": {"availabilityZones": ["us-west-2a"]}}, "network.availabilityZones", "at least 2 zones"),
    ({"network": {"availabilityZones": ["us-east-1a", "us-east-1b"]}}, "network.availabilityZones",
     "zones of us-west-2"),
    ({"kubernetes": {"publicAccessCidrs": ["0.0.0.0/0"]}}, "kubernetes.publicAccessCidrs", "VPN"),
    ({"kubernetes": {"version": "1.21", "publicAccessCidrs": ["203.0.113.0/24"]}}, "kubernetes.version", "newer"),
    ({"storage": {"backend": "gcs"}}, "storage.backend", "minio or s3"),
    ({"storage": {"minioReplicas": 3}}, "storage.minioReplicas", "even number of pods, at least 4"),
    ({"storage": {"minioImages": {"server": "bitnamilegacy/minio"}}}, "storage.minioImages.server",
     "registry and a tag or digest"),
    ({"storage": {"minioImages": {"server": "docker.io/bitnamilegacy/minio@sha256:abc"}}},
     "storage.minioImages.server", "registry and a tag or digest"),
    ({"storage": {"minioImages": {"console": "docker.io/bitnamilegacy/minio-console:1"}}}, "storage.minioImages",
     "override any of"),
    ({"nodeGroups": {}}, "nodeGroups", "use only"),
    ({"network": {"vpcCidr": "10.20.0.0/16", "availabilityZones": ["us-west-2a", "us-west-2b"], "nat": 1}},
     "network.nat", "use only"),
    ({"storage": {"bucket": "b" * 60}}, "storage.bucket", "at most 54 characters with MinIO"),
    ({"storage": {"minioSizeGiB": 0}}, "storage.minioSizeGiB", "at least 1"),
    ({"monitoring": {"retentionDays": 0}}, "monitoring.retentionDays", "at least 1"),
    ({"monitoring": {"alerts": {"stalledMinutes": 0}}}, "monitoring.alerts.stalledMinutes", "at least 1"),
    ({"monitoring": {"gpuHourPriceUsd": {"spot": 1.2}}}, "monitoring.gpuHourPriceUsd",
     "gpuPools[].pricesUsdPerHour"),
    ({"gpuPools": [{"name": "a", "families": ["g5"], "pricesUsdPerHour": {"g5.xlarge": {"spot": -0.4}}}]},
     "gpuPools[0].pricesUsdPerHour.g5.xlarge.spot", "positive price"),
    ({"gpuPools": [{"name": "a", "families": ["g5"], "pricesUsdPerHour": {"g5.xlarge": {"reserved": 0.4}}}]},
     "gpuPools[0].pricesUsdPerHour.g5.xlarge.reserved", "spot or on-demand"),
    ({"gpuPools": [{"name": "a", "families": ["g5"], "pricesUsdPerHour": {"a10g": {"spot": 0.4}}}]},
     "gpuPools[0].pricesUsdPerHour.a10g", "like g5.xlarge"),
    ({"gpuPools": [{"name": "a", "families": ["g5"], "pricesUsdPerHour": {"g5.xlarge": 0.4}}]},
     "gpuPools[0].pricesUsdPerHour.g5.xlarge", "{spot: 0.45, on-demand: 1.006}"),
    ({"gpuPools": [{"name": "a", "families": ["g5"], "sizes": ["xlarge"],
                    "pricesUsdPerHour": {"p5.48xlarge": {"spot": 40}, "g5.2xlarge": {"spot": 0.6}}}]},
     "gpuPools[0].pricesUsdPerHour.p5.48xlarge", "families (g5) and sizes (xlarge)"),
    ({"gpuPools": [{"name": "a", "families": ["g5"]}, {"name": "b", "families": ["g5"], "gpuLimit": 0}]},
     "gpuPools[1].gpuLimit", "at least 1"),
    ({"corePool": {"diskGiB": "big"}}, "corePool.diskGiB", "whole number"),
    ({"kubernetes": {"version": 1.33, "publicAccessCidrs": ["203.0.113.0/24"]}}, "kubernetes.version", "quote it"),
    ({"tags": ["team"]}, "tags", "write it as an object"),
    ({"gpuPools": [{"name": "a", "families": ["g5"], "warmSpares": -1}]}, "gpuPools[0].warmSpares", "use 0"),
    ({"gpuPools": [{"name": "a", "families": ["g5"], "gpuLimit": 2, "warmSpares": 2}],
      "training": {"image": "x.io/spotray:1", "gpusPerWorker": 2}}, "gpuPools[0].warmSpares", "raise gpuLimit"),
    ({"gpuPools": [{"name": "a", "families": ["g5"], "warmSpares": 1}]}, "gpuPools[0].warmSpares",
     "set training.image"),
    ({"gpuPools": [{"name": "a", "families": ["g5"], "interruptionsPerHour": 0}]}, "gpuPools[0].interruptionsPerHour",
     "leave it out"),
    ({"gpuPools": [{"name": "a", "families": ["p5"], "sizes": ["48xlarge", "12xlarge"]}]}, "gpuPools[0].sizes",
     "names 12xlarge, which no family of p5 comes in: Karpenter would launch no such node. use some of 4xlarge, "
     "48xlarge"),
])
def test_bad_config_names_the_key_and_the_fix(overrides, key, fix):
    with pytest.raises(ConfigError) as err:
        load(**overrides)
    assert err.value.field == f"spotray:{key}"
    assert fix in str(err.value)


def test_a_pools_prices_are_read_as_usd_per_hour_by_instance_type_and_capacity_type():
    pool = load(gpuPools=[{"name": "a", "families": ["g5"], "warmSpares": 0,
                           "pricesUsdPerHour": {"g5.xlarge": {"spot": 1, "on-demand": 1.006}}}]).gpu_pools[0]
    assert pool.prices_usd_per_hour == {"g5.xlarge": {"spot": 1.0, "on-demand": 1.006}}
    assert load().gpu_pools[0].prices_usd_per_hour == {}


def test_the_dev_stack_file_shows_example_prices_for_the_instance_types_its_pool_launches():
    (pool,) = load_stack_file(REPO, "dev").gpu_pools
    assert {f"{pool.families[0]}.{size}" for size in pool.sizes} == set(pool.prices_usd_per_hour)
    assert all(set(prices) == {"spot", "on-demand"} for prices in pool.prices_usd_per_hour.values())


@pytest.mark.parametrize(("build", "message"), [
    (lambda: GpuPoolConfig("a10g", ("m7i",)), "'families'.*use some of g4dn"),
    (lambda: GpuPoolConfig("A10G", ("g5",)), "'name'.*lowercase DNS label"),
    (lambda: TrainingJobConfig(backoff_limit=1), "'backoffLimit'.*at least 2"),
])
def test_sections_built_directly_check_themselves(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_minio_images_from_config_replace_only_the_ones_named():
    mirror = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
    images = load(storage={"minioImages": {"server": f"{mirror}/bitnamilegacy/minio:2025.7.23-debian-12-r3"}}
                  ).storage.minio_images
    assert images["server"] == Image(mirror, "bitnamilegacy/minio", "2025.7.23-debian-12-r3")
    assert images["client"] == MINIO_IMAGES["client"]


DIGEST = "sha256:" + "0123456789abcdef" * 4


def test_images_may_be_given_by_digest_and_the_digest_is_what_the_chart_pulls():
    mirror = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
    images = load(storage={"minioImages": {"server": f"{mirror}/bitnamilegacy/minio@{DIGEST}",
                                           "client": f"{mirror}/bitnamilegacy/minio-client:1.0@{DIGEST}"}}
                  ).storage.minio_images
    assert images["server"] == Image(mirror, "bitnamilegacy/minio", "", DIGEST)
    assert images["client"] == Image(mirror, "bitnamilegacy/minio-client", "1.0", DIGEST)


@pytest.mark.parametrize("image, problem", [
    (f"123456789012.dkr.ecr.us-west-2.amazonaws.com/spotray/training@{DIGEST}", None),
    (f"123456789012.dkr.ecr.us-west-2.amazonaws.com/spotray/training:abc@{DIGEST}", None),
    ("123456789012.dkr.ecr.us-west-2.amazonaws.com/spotray/training", "has no tag"),
    ("123456789012.dkr.ecr.us-west-2.amazonaws.com/spotray/training@sha256:xyz", "malformed digest"),
])
def test_the_training_image_takes_a_tag_or_a_digest(image, problem):
    cfg = load()
    if problem is None:
        assert cfg.job_image(image) == image
    else:
        with pytest.raises(ConfigError, match=f"training.image.*{problem}"):
            cfg.job_image(image)


def test_prod_without_deletion_protection_is_refused():
    with pytest.raises(ConfigError, match="protect.*set spotray:protect: true"):
        load("prod", protect=False)
    assert load("prod", protect=True).protect


def test_an_existing_cluster_takes_no_aws_settings_and_needs_a_bucket_for_s3():
    cfg = from_values("spotray", "existing", {"platform": "existing", "environment": "dev"}, None)
    assert cfg.network is None and cfg.gpu_pools == ()
    existing = {"platform": "existing", "environment": "dev"}
    with pytest.raises(ConfigError, match="spotray:network.*not used on platform existing"):
        from_values("spotray", "existing", {**existing, "network": {"vpcCidr": "10.0.0.0/16"}}, None)
    with pytest.raises(ConfigError, match="spotray:storage.bucket.*required"):
        from_values("spotray", "existing", {**existing, "storage": {"backend": "s3"}}, None)


def test_an_aws_section_left_empty_in_the_stack_file_reads_as_its_defaults():
    assert load(corePool=None).core_pool == load().core_pool
    with pytest.raises(ConfigError, match="spotray:network.availabilityZones': has 0 zone"):
        load(network=None)
    with pytest.raises(ConfigError, match="spotray:kubernetes.publicAccessCidrs': is empty"):
        load(kubernetes=None)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        load().protect = True


def test_a_missing_stack_file_lists_the_stacks(tmp_path):
    (tmp_path / "Pulumi.yaml").write_text("name: spotray\n")
    (tmp_path / "Pulumi.dev.yaml").write_text("config: {}\n")
    with pytest.raises(SpotrayError, match="no stack file .*Pulumi.qa.yaml: use one of dev"):
        load_stack_file(tmp_path, "qa")


@pytest.mark.parametrize("text, message", [
    ("- spotray:environment: dev\n", "config': Pulumi.x.yaml must hold a mapping `config:` of keys, got list"),
    ("config: [1]\n", "config': Pulumi.x.yaml must hold a mapping `config:` of keys, got list"),
    ("config: [\n", "config': Pulumi.x.yaml is not valid YAML at line 2, column 1: expected the node content, but "
                    "found '<stream end>' (while parsing a flow node begun on line 2)"),
    ("config:\n  spotray:enviroment: dev\n", "config 'spotray:enviroment': is not a setting here. did "
                                              "you mean environment? use only corePool, environment,"),
    ("config:\n  spotray:network: {vpcCidrs: 10.0.0.0/16}\n", "config 'spotray:network.vpcCidrs': is not a setting "
                                                             "here. did you mean vpcCidr? use only"),
    ("config:\n  1: 2\n", "config '1': a stack config key is a namespace:name string"),
    ("config:\n  spotray:tags: {1: a, b: c, \"\\n\": d}\n  spotray:bogus: 1\n",
     "config 'spotray:bogus': is not a setting"),
    ("config:\n  spotray:network: {\"\\n\": 1, 2: 3}\n", "config 'spotray:network.'\\n'': is not a setting here"),
])
def test_a_stack_file_of_the_wrong_shape_is_refused_in_one_line(tmp_path, text, message):
    (tmp_path / "Pulumi.yaml").write_text("name: spotray\n")
    (tmp_path / "Pulumi.x.yaml").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)) as raised:
        load_stack_file(tmp_path, "x")
    assert "\n" not in str(raised.value)


def test_encrypted_values_in_a_stack_file_stay_secret(tmp_path):
    (tmp_path / "Pulumi.yaml").write_text("name: spotray\n")
    (tmp_path / "Pulumi.x.yaml").write_text(
        "config:\n  spotray:environment: dev\n  spotray:platform: existing\n"
        "  spotray:kubeconfig:\n    secure: AAABAC==\n")
    assert load_stack_file(tmp_path, "x").kubeconfig == "[secret]"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_pulumi_program_reads_the_same_config_as_the_stack_file(stack, monkeypatch):
    import json

    import pulumi
    import yaml

    from infra.kernel.config import from_pulumi

    raw = yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text())["config"]
    monkeypatch.setattr(pulumi, "get_project", lambda: "spotray")
    monkeypatch.setattr(pulumi, "get_stack", lambda: stack)
    saved = dict(pulumi.runtime.config.CONFIG.get())
    for key, value in raw.items():  # the engine hands structured values to the program as JSON
        pulumi.runtime.set_config(key, value if isinstance(value, str) else json.dumps(value))
    try:
        assert from_pulumi() == load_stack_file(REPO, stack)
    finally:
        pulumi.runtime.config.CONFIG.set(saved)


def test_a_missing_region_names_the_aws_key_itself():
    with pytest.raises(ConfigError) as err:
        from_values("spotray", "dev", values(), None)
    assert err.value.field == "aws:region" and "pulumi config set aws:region" in str(err.value)


def stack_keys(section: type = StackConfig, prefix: str = "") -> list[str]:
    """Every key a stack file may set below ``section`` (a pool's as ``gpuPools.name``)."""
    keys: list[str] = []
    hints = typing.get_type_hints(section)
    for field in dataclasses.fields(section):
        if "key" not in field.metadata:
            continue
        key = prefix + field.metadata["key"]
        inner = [t for t in (typing.get_args(hints[field.name]) or (hints[field.name],))
                 if isinstance(t, type) and issubclass(t, Section)]
        keys += stack_keys(inner[0], f"{key}.") if inner else [key]
    return keys


def test_the_docs_name_every_stack_setting():
    """Each key appears in the docs as a YAML key (``diskGiB: 100``) or in backticks, by its last part at least."""
    docs = " ".join(page.read_text() for page in (REPO / "docs").glob("*.md"))
    named = set(re.findall(r"`(?:[\w.:]+[.:])?(\w+)`", docs)) | set(re.findall(r"(\w+): ", docs))
    keys = stack_keys()
    assert len(keys) > 60 and [key for key in keys if key.rsplit(".", 1)[-1] not in named] == []

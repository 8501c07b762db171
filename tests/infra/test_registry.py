import json

from infra.aws.registry import ImageRepository, ImageRepositoryArgs
from infra.plan import run_mocked

TAGS = {"spotray:project": "spotray", "spotray:stack": "t"}


def test_the_image_repository_has_immutable_scanned_tags_and_expires_untagged_images():
    args = ImageRepositoryArgs("spotray/t/training", TAGS, protect=True)
    plan = run_mocked(lambda: {"url": ImageRepository("reg", args).url}, "spotray", "t", "us-west-2")
    repo = plan.of_type("aws:ecr/repository:Repository")[0]
    assert repo.inputs["imageTagMutability"] == "IMMUTABLE"
    assert repo.inputs["imageScanningConfiguration"] == {"scanOnPush": True}
    assert repo.protect and repo.retain_on_delete
    rule = json.loads(plan.of_type("aws:ecr/lifecyclePolicy:LifecyclePolicy")[0].inputs["policy"])["rules"][0]
    assert rule["selection"]["tagStatus"] == "untagged"
    assert plan.outputs["url"] == "123456789012.dkr.ecr.us-west-2.amazonaws.com/spotray/t/training"

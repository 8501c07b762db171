"""The ECR repository for the training image: immutable tags, scanned on push, untagged images expire."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

UNTAGGED_IMAGE_DAYS = 14


@dataclass(frozen=True)
class ImageRepositoryArgs:
    repository: str
    tags: dict[str, str]
    protect: bool


class ImageRepository(pulumi.ComponentResource):
    url: pulumi.Output[str]

    def __init__(self, name: str, args: ImageRepositoryArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:infra:ImageRepository", name, None, opts)
        tags, protect = args.tags, args.protect
        repo = aws.ecr.Repository(
            f"{name}-repo", name=args.repository, image_tag_mutability="IMMUTABLE",
            image_scanning_configuration={"scan_on_push": True}, encryption_configurations=[{"encryption_type": "KMS"}],
            force_delete=not protect, tags=tags,
            opts=pulumi.ResourceOptions(parent=self, protect=protect, retain_on_delete=protect))
        aws.ecr.LifecyclePolicy(f"{name}-lifecycle", repository=repo.name, policy=json.dumps({"rules": [{
            "rulePriority": 1, "description": f"expire untagged images after {UNTAGGED_IMAGE_DAYS} days",
            "selection": {"tagStatus": "untagged", "countType": "sinceImagePushed", "countUnit": "days",
                          "countNumber": UNTAGGED_IMAGE_DAYS},
            "action": {"type": "expire"}}]}), opts=pulumi.ResourceOptions(parent=self))
        self.url = repo.repository_url
        self.register_outputs({"url": self.url})

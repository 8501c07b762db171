"""The S3 bucket for datasets and checkpoints (storage backend ``s3``): private, encrypted, versioned, old
checkpoint versions expiring; and the Pod Identity role that lets training pods (the Ray workers' and the Ray head's
service accounts) use exactly their prefix."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws import iam
from infra.kernel.config import StorageConfig
from infra.kernel.names import HEAD_SERVICE_ACCOUNT, TRAINING_NAMESPACE, TRAINING_SERVICE_ACCOUNT


@dataclass(frozen=True)
class BucketArgs:
    bucket: str
    config: StorageConfig
    cluster_name: pulumi.Input[str]
    tags: dict[str, str]
    protect: bool
    boundary: pulumi.Input[str]  # the permissions boundary of every role the stack creates


class CheckpointBucket(pulumi.ComponentResource):
    bucket_name: pulumi.Output[str]

    def __init__(self, name: str, args: BucketArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:infra:CheckpointBucket", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = args.tags
        bucket = aws.s3.Bucket(f"{name}-bucket", bucket=args.bucket, force_destroy=not args.protect, tags=tags,
                               opts=pulumi.ResourceOptions(parent=self, protect=args.protect,
                                                           retain_on_delete=args.protect))
        aws.s3.BucketOwnershipControls(f"{name}-ownership", bucket=bucket.id,
                                       rule={"object_ownership": "BucketOwnerEnforced"}, opts=child)
        aws.s3.BucketPublicAccessBlock(f"{name}-private", bucket=bucket.id, block_public_acls=True,
                                       block_public_policy=True, ignore_public_acls=True,
                                       restrict_public_buckets=True, opts=child)
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption", bucket=bucket.id,
            rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": "aws:kms"},
                    "bucket_key_enabled": True}], opts=child)
        versioning = aws.s3.BucketVersioning(f"{name}-versioning", bucket=bucket.id,
                                             versioning_configuration={"status": "Enabled"}, opts=child)
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle", bucket=bucket.id,
            rules=[{"id": "expire-old-checkpoint-versions", "status": "Enabled",
                    "filter": {"prefix": f"{args.config.prefix}/"},
                    "noncurrent_version_expiration": {"noncurrent_days": args.config.checkpoint_retention_days}},
                   {"id": "abort-incomplete-uploads", "status": "Enabled", "filter": {},
                    "abort_incomplete_multipart_upload": {"days_after_initiation": 1}}],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[versioning]))
        aws.s3.BucketPolicy(f"{name}-tls-only", bucket=bucket.id, policy=iam.policy_document([
            {"Sid": "TlsOnly", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
             "Resource": [bucket.arn, pulumi.Output.concat(bucket.arn, "/*")],
             "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]), opts=child)
        role = iam.pod_role(f"{name}-training", args.cluster_name, TRAINING_NAMESPACE, TRAINING_SERVICE_ACCOUNT,
                            training_policy(bucket.arn, args.config.prefix), tags, args.boundary, child)
        aws.eks.PodIdentityAssociation(f"{name}-training-head", cluster_name=args.cluster_name,
                                       namespace=TRAINING_NAMESPACE, service_account=HEAD_SERVICE_ACCOUNT,
                                       role_arn=role.arn, tags=tags, opts=child)
        self.bucket_name = bucket.bucket
        self.register_outputs({"bucket_name": self.bucket_name})


def training_policy(bucket_arn: pulumi.Input[str], prefix: str) -> pulumi.Output[str]:
    """Objects under ``prefix/`` and nothing else: list only that prefix, read, write and delete inside it."""
    return iam.policy_document([
        {"Sid": "ListPrefix", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": bucket_arn,
         "Condition": {"StringLike": {"s3:prefix": [f"{prefix}/*", prefix]}}},
        {"Sid": "ObjectsInPrefix", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
         "Resource": pulumi.Output.concat(bucket_arn, f"/{prefix}/*")},
    ])

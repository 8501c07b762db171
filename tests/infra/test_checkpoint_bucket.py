import json

from infra.aws.storage import BucketArgs, CheckpointBucket
from infra.kernel.config import StorageConfig
from infra.plan import run_mocked

TAGS = {"spotray:project": "spotray", "spotray:stack": "t"}
BOUNDARY = "arn:aws:iam::123456789012:policy/spotray-t-boundary"


def build(protect=False):
    config = StorageConfig(backend="s3", prefix="teams/ml", checkpoint_retention_days=21)
    return run_mocked(lambda: {"bucket": CheckpointBucket("st", BucketArgs("spotray-t", config, "spotray-t", TAGS,
                                                                           protect, BOUNDARY)).bucket_name},
                      "spotray", "t", "us-west-2")


def test_the_bucket_is_private_encrypted_versioned_and_expires_old_checkpoint_versions():
    plan = build()
    assert plan.outputs["bucket"] == "spotray-t"
    block = plan.of_type("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")[0].inputs
    assert all(block[k] for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"))
    sse = plan.of_type("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")
    assert sse[0].inputs["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
    versioning = plan.of_type("aws:s3/bucketVersioning:BucketVersioning")[0].inputs
    assert versioning["versioningConfiguration"] == {"status": "Enabled"}
    rules = plan.of_type("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")[0].inputs["rules"]
    expiry = next(r for r in rules if "noncurrentVersionExpiration" in r)
    assert expiry["noncurrentVersionExpiration"] == {"noncurrentDays": 21}
    assert expiry["filter"] == {"prefix": "teams/ml/"}
    tls = json.loads(plan.of_type("aws:s3/bucketPolicy:BucketPolicy")[0].inputs["policy"])["Statement"][0]
    assert tls["Effect"] == "Deny" and tls["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_training_pods_may_use_exactly_their_prefix():
    plan = build()
    associations = [a.inputs for a in plan.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")]
    # the Ray workers' service account and the Ray head's (its own, for reading nodes), both to the one role
    assert sorted((a["namespace"], a["serviceAccount"]) for a in associations) == [
        ("spotray", "spotray-head"), ("spotray", "spotray-training")]
    assert len({a["roleArn"] for a in associations}) == 1
    statements = json.loads(plan.of_type("aws:iam/rolePolicy:RolePolicy")[0].inputs["policy"])["Statement"]
    bucket_arn = "arn:aws:mock:us-west-2:123456789012:st-bucket"
    assert {s["Sid"]: s["Resource"] for s in statements} == {"ListPrefix": bucket_arn,
                                                            "ObjectsInPrefix": f"{bucket_arn}/teams/ml/*"}
    listing = next(s for s in statements if s["Sid"] == "ListPrefix")
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["teams/ml/*", "teams/ml"]}}
    assert all("*" not in json.dumps(s["Action"]) for s in statements)


def test_protect_keeps_the_bucket_and_its_objects():
    bucket = build(protect=True).of_type("aws:s3/bucket:Bucket")[0]
    assert (bucket.protect, bucket.retain_on_delete, bucket.inputs["forceDestroy"]) == (True, True, False)
    assert build().of_type("aws:s3/bucket:Bucket")[0].inputs["forceDestroy"] is True

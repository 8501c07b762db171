"""The policy evaluator of the deploy-role checks (``tests/infra/iam_eval.py``) against the rules of the IAM User
Guide, one case each, written from its pages "Policy evaluation logic", "Permissions boundaries for IAM entities",
"IAM JSON policy elements: NotAction", "IAM JSON policy elements: NotResource" and "IAM JSON policy elements:
Condition operators"."""

import pytest

from tests.infra.iam_eval import ALLOW, EXPLICIT_DENY, IMPLICIT_DENY, Request, decide

BUCKET = "arn:aws:s3:::reports"
ROLE = "arn:aws:iam::123456789012:role/app"
TAG = "aws:ResourceTag/team"


def allow(action, resource="*", **more) -> dict:
    return {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": action, "Resource": resource, **more}]}


def deny(action, resource="*", **more) -> dict:
    return {"Version": "2012-10-17", "Statement": [{"Effect": "Deny", "Action": action, "Resource": resource, **more}]}


def both(*policies: dict) -> dict:
    return {"Version": "2012-10-17", "Statement": [s for p in policies for s in p["Statement"]]}


EVERYTHING = allow("*")
CASES = {
    # Policy evaluation logic: what no statement allows is denied, an explicit deny beats any allow.
    "nothing allows it: implicit deny": ([allow("s3:GetObject")], None, Request("s3:PutObject", BUCKET),
                                         IMPLICIT_DENY),
    "an allow that matches": ([allow("s3:GetObject", BUCKET)], None, Request("s3:GetObject", BUCKET), ALLOW),
    "explicit deny wins in the same policy": ([both(allow("s3:*"), deny("s3:DeleteBucket"))], None,
                                              Request("s3:DeleteBucket", BUCKET), EXPLICIT_DENY),
    "explicit deny wins across policies": ([allow("s3:*"), deny("s3:*", BUCKET)], None,
                                           Request("s3:DeleteBucket", BUCKET), EXPLICIT_DENY),
    "a deny elsewhere does not touch other resources": ([allow("s3:*"), deny("s3:*", "arn:aws:s3:::other")], None,
                                                        Request("s3:DeleteBucket", BUCKET), ALLOW),
    # Permissions boundaries: the effective permissions are the intersection of identity policy and boundary.
    "boundary allows, identity does not": ([allow("s3:GetObject")], EVERYTHING, Request("sqs:DeleteQueue", "*"),
                                           IMPLICIT_DENY),
    "identity allows, boundary does not": ([allow("sqs:*")], allow("s3:*"), Request("sqs:DeleteQueue", "*"),
                                           IMPLICIT_DENY),
    "both allow": ([allow("sqs:*")], allow("sqs:Delete*"), Request("sqs:DeleteQueue", "*"), ALLOW),
    "a deny in the boundary wins": ([allow("*")], both(EVERYTHING, deny("iam:*")), Request("iam:CreateUser", "*"),
                                    EXPLICIT_DENY),
    # Wildcards: * and ? in actions (any case) and in resources (exact case).
    "action wildcard": ([allow("s3:Get*")], None, Request("s3:GetBucketPolicy", BUCKET), ALLOW),
    "action names are not case sensitive": ([allow("S3:getobject")], None, Request("s3:GetObject", BUCKET), ALLOW),
    "? matches one character": ([allow("s3:GetObjec?")], None, Request("s3:GetObjects", BUCKET), IMPLICIT_DENY),
    "resource wildcard spans / and :": ([allow("logs:*", "arn:aws:logs:*:1:log-group:/aws/*")], None,
                                        Request("logs:DeleteLogGroup", "arn:aws:logs:us-west-2:1:log-group:/aws/x:*"),
                                        ALLOW),
    "resources are case sensitive": ([allow("s3:*", "arn:aws:s3:::Reports")], None,
                                     Request("s3:DeleteBucket", BUCKET), IMPLICIT_DENY),
    "an ARN statement does not cover an action without resources": ([allow("kms:CreateKey", "arn:aws:kms:*:1:key/*")],
                                                                    None, Request("kms:CreateKey", "*"),
                                                                    IMPLICIT_DENY),
    # NotAction and NotResource: everything except what they list.
    "NotAction allows what it does not list": ([{"Statement": [{"Effect": "Allow", "NotAction": "iam:*",
                                                                 "Resource": "*"}]}], None,
                                               Request("s3:DeleteBucket", BUCKET), ALLOW),
    "NotAction leaves out what it lists": ([{"Statement": [{"Effect": "Allow", "NotAction": "iam:*",
                                                             "Resource": "*"}]}], None,
                                           Request("iam:CreateUser", "*"), IMPLICIT_DENY),
    "deny with NotResource protects the listed": ([EVERYTHING, {"Statement": [{"Effect": "Deny", "Action": "s3:*",
                                                                                "NotResource": BUCKET}]}], None,
                                                  Request("s3:DeleteBucket", BUCKET), ALLOW),
    "deny with NotResource hits the rest": ([EVERYTHING, {"Statement": [{"Effect": "Deny", "Action": "s3:*",
                                                                          "NotResource": BUCKET}]}], None,
                                            Request("s3:DeleteBucket", "arn:aws:s3:::other"), EXPLICIT_DENY),
    # Condition operators: a key missing from the request fails a positive operator, passes a negated one.
    "StringEquals on a missing key: no match": ([allow("ec2:*", Condition={"StringEquals": {TAG: "a"}})], None,
                                                Request("ec2:DeleteVpc", "*"), IMPLICIT_DENY),
    "StringEquals matches": ([allow("ec2:*", Condition={"StringEquals": {TAG: "a"}})], None,
                             Request("ec2:DeleteVpc", "*", {TAG: "a"}), ALLOW),
    "condition keys are not case sensitive": ([allow("ec2:*", Condition={"StringEquals": {TAG: "a"}})], None,
                                              Request("ec2:DeleteVpc", "*", {TAG.upper(): "a"}), ALLOW),
    "condition values are": ([allow("ec2:*", Condition={"StringEquals": {TAG: "a"}})], None,
                             Request("ec2:DeleteVpc", "*", {TAG: "A"}), IMPLICIT_DENY),
    "StringNotEquals on a missing key: match": ([EVERYTHING, deny("ec2:*", Condition={"StringNotEquals": {TAG: "a"}})],
                                                None, Request("ec2:DeleteVpc", "*"), EXPLICIT_DENY),
    "values of one key: any of them": ([allow("ec2:*", Condition={"StringEquals": {TAG: ["a", "b"]}})], None,
                                       Request("ec2:DeleteVpc", "*", {TAG: "b"}), ALLOW),
    "keys and operators: all of them": ([allow("ec2:*", Condition={"StringEquals": {TAG: "a"},
                                                                   "StringLike": {"aws:RequestTag/x": "y*"}})], None,
                                        Request("ec2:DeleteVpc", "*", {TAG: "a", "aws:RequestTag/x": "z"}),
                                        IMPLICIT_DENY),
    "IfExists passes a missing key": ([allow("ec2:*", Condition={"StringEqualsIfExists": {TAG: "a"}})], None,
                                      Request("ec2:DeleteVpc", "*"), ALLOW),
    "Null true: the key is absent": ([allow("ec2:*", Condition={"Null": {TAG: "true"}})], None,
                                     Request("ec2:DeleteVpc", "*", {TAG: "a"}), IMPLICIT_DENY),
    "Null false: the key is present": ([allow("ec2:*", Condition={"Null": {TAG: "false"}})], None,
                                       Request("ec2:DeleteVpc", "*", {TAG: "a"}), ALLOW),
    "ArnLike with a wildcard": ([allow("iam:AttachRolePolicy", ROLE,
                                       Condition={"ArnLike": {"iam:PolicyARN": "arn:aws:iam::aws:policy/Amazon*"}})],
                                None, Request("iam:AttachRolePolicy", ROLE,
                                              {"iam:PolicyARN": "arn:aws:iam::aws:policy/AdministratorAccess"}),
                                IMPLICIT_DENY),
    "ArnNotLike denies the unlisted": ([EVERYTHING, deny("iam:AttachRolePolicy", Condition={
        "ArnNotLike": {"iam:PolicyARN": "arn:aws:iam::aws:policy/ReadOnlyAccess"}})], None,
        Request("iam:AttachRolePolicy", ROLE, {"iam:PolicyARN": "arn:aws:iam::aws:policy/AdministratorAccess"}),
        EXPLICIT_DENY),
    "Bool": ([allow("s3:*", Condition={"Bool": {"aws:SecureTransport": "true"}})], None,
             Request("s3:GetObject", BUCKET, {"aws:SecureTransport": "false"}), IMPLICIT_DENY),
    "ForAllValues: every requested value listed": ([allow("ec2:CreateTags", Condition={
        "ForAllValues:StringEquals": {"aws:TagKeys": ["a", "b"]}})], None,
        Request("ec2:CreateTags", "*", {"aws:TagKeys": ["a", "c"]}), IMPLICIT_DENY),
    "ForAllValues passes a missing key": ([allow("ec2:CreateTags", Condition={
        "ForAllValues:StringEquals": {"aws:TagKeys": ["a"]}})], None, Request("ec2:CreateTags", "*"), ALLOW),
    "ForAnyValue: one requested value listed": ([allow("ec2:CreateTags", Condition={
        "ForAnyValue:StringEquals": {"aws:TagKeys": ["a"]}})], None,
        Request("ec2:CreateTags", "*", {"aws:TagKeys": ["c", "a"]}), ALLOW),
    "ForAnyValue fails a missing key": ([allow("ec2:CreateTags", Condition={
        "ForAnyValue:StringEquals": {"aws:TagKeys": ["a"]}})], None, Request("ec2:CreateTags", "*"), IMPLICIT_DENY),
    # aws:RequestTag: a create is judged by the tags it asks for; the resource has none yet.
    "create with the required tag": ([allow("ec2:CreateVpc", Condition={"StringEquals": {"aws:RequestTag/team": "a"}})],
                                     None, Request("ec2:CreateVpc", "arn:aws:ec2:us-west-2:1:vpc/*",
                                                   {"aws:RequestTag/team": "a", "aws:TagKeys": ["team"]}), ALLOW),
    "create without it": ([allow("ec2:CreateVpc", Condition={"StringEquals": {"aws:RequestTag/team": "a"}})], None,
                          Request("ec2:CreateVpc", "arn:aws:ec2:us-west-2:1:vpc/*"), IMPLICIT_DENY),
}


@pytest.mark.parametrize("case", CASES)
def test_the_evaluator_follows_the_iam_user_guide(case):
    identity, boundary, request, expected = CASES[case]
    assert decide(request, identity, boundary) == expected


def test_an_operator_it_does_not_model_fails_loudly():
    with pytest.raises(ValueError, match="NumericLessThan"):
        decide(Request("s3:GetObject", BUCKET, {"s3:max-keys": "5"}),
               [allow("s3:*", Condition={"NumericLessThan": {"s3:max-keys": "10"}})])

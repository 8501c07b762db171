"""The roles GitHub Actions assumes, under Pulumi mocks for every AWS stack: exact subjects, no long-lived keys."""

import json

import pytest

from infra.kernel.config import from_values
from infra.plan import plan
from spotray.errors import ConfigError
from tests.infra.test_stack_config import values

AWS_STACKS = ("dev", "staging", "prod")
PROVIDER = "arn:aws:iam::123456789012:oidc-provider/token.actions.githubusercontent.com"


def github_providers(result) -> list:
    return [p for p in result.of_type("aws:iam/openIdConnectProvider:OpenIdConnectProvider")
            if p.inputs["url"] == "https://token.actions.githubusercontent.com"]


def trust(role) -> dict:
    (statement,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    return statement


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_each_stack_deploy_role_admits_only_its_repository_environment_and_preview_only_pull_requests(
        stack_plans, stack):
    cfg, result = stack_plans[stack]
    roles = {r.inputs["name"]: r for r in result.of_type("aws:iam/role:Role") if "-github-" in r.inputs.get("name", "")}
    deploy, preview = roles[f"spotray-{stack}-github-deploy"], roles[f"spotray-{stack}-github-preview"]
    for role, subject in ((deploy, f"repo:example-org/spotray:environment:{cfg.environment}"),
                          (preview, "repo:example-org/spotray:pull_request")):
        assert trust(role) == {
            "Effect": "Allow", "Principal": {"Federated": PROVIDER}, "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {"StringEquals": {"token.actions.githubusercontent.com:aud": "sts.amazonaws.com",
                                           "token.actions.githubusercontent.com:sub": subject}}}
    attached = {a.inputs["role"]: a.inputs["policyArn"] for a in result.of_type("aws:iam/rolePolicyAttachment:"
                                                                                 "RolePolicyAttachment")}
    assert attached[preview.inputs["name"]] == "arn:aws:iam::aws:policy/ReadOnlyAccess"
    assert [p.inputs["clientIdLists"] for p in github_providers(result)] == [["sts.amazonaws.com"]]
    assert not result.of_type("aws:iam/accessKey:AccessKey") and not result.of_type("aws:iam/user:User")
    assert {"deployRoleArn", "previewRoleArn"} <= set(result.outputs)


def test_an_account_that_has_the_provider_reuses_it():
    arn = "arn:aws:iam::210987654321:oidc-provider/token.actions.githubusercontent.com"
    gitops = {"repository": "acme/ml", "roles": True, "organization": "acme", "oidcProviderArn": arn}
    cfg = from_values("spotray", "staging", values(gitops=gitops), "us-west-2")
    result = plan(cfg)
    assert github_providers(result) == []
    assert {trust(r)["Principal"]["Federated"] for r in result.of_type("aws:iam/role:Role")
            if "-github-" in r.inputs.get("name", "")} == {arn}


@pytest.mark.parametrize(("gitops", "key", "fix"), [
    ({"roles": True}, "gitops.repository", "owner/name of the repository"),
    ({"repository": "spotray", "roles": True}, "gitops.repository", "write it as owner/name"),
    ({"repository": "acme/ml/extra"}, "gitops.repository", "write it as owner/name"),
    ({"repository": "acme/ml", "oidcProviderArn": "arn:aws:iam::1:oidc-provider/example.com"},
     "gitops.oidcProviderArn", "leave it out to create the provider"),
])
def test_bad_gitops_settings_name_the_key_and_the_fix(gitops, key, fix):
    with pytest.raises(ConfigError) as err:
        from_values("spotray", "dev", values(gitops=gitops), "us-west-2")
    assert err.value.field == f"spotray:{key}" and fix in str(err.value)


def test_roles_on_an_existing_cluster_are_refused():
    with pytest.raises(ConfigError) as err:
        from_values("spotray", "dev", {"platform": "existing", "gitops": {"repository": "acme/ml", "roles": True,
                                                                   "organization": "acme"}},
                    None)
    assert err.value.field == "spotray:gitops.roles" and "no AWS account" in str(err.value)

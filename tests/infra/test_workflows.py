"""The GitHub workflows as a platform team reviews them: promotion order, the prod gate, one update per stack at a
time, pinned actions, OIDC only where AWS is reached, and steps that call what this repository has.
(`make lint` validates them against GitHub's schema and runs zizmor.)"""

import re
import shlex

import pytest
import yaml

from tests.repo import REPO

WORKFLOWS = REPO / ".github" / "workflows"
REUSABLE = "./.github/workflows/deploy-stack.yml"
OIDC_ACTIONS = ("aws-actions/configure-aws-credentials", "pulumi/auth-actions")
PINNED = re.compile(r"^\s*(?:- )?uses: ([\w.-]+/[\w./-]+)@([0-9a-f]{40}) # v\d+\.\d+\.\d+$")


def workflow(name: str) -> dict:
    # YAML 1.1 reads the key `on` as True.
    return {("on" if k is True else k): v for k, v in yaml.safe_load((WORKFLOWS / name).read_text()).items()}


def all_workflows() -> dict[str, dict]:
    return {p.name: workflow(p.name) for p in sorted(WORKFLOWS.glob("*.yml"))}


def jobs_with_steps() -> list[tuple[str, str, dict]]:
    return [(name, job_name, job) for name, flow in all_workflows().items()
            for job_name, job in flow["jobs"].items() if "steps" in job]


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.MULTILINE))


def test_merges_to_main_promote_dev_then_staging_then_prod_through_the_stack_environments():
    deploy = workflow("deploy.yml")
    assert deploy["on"] == {"push": {"branches": ["main"]}}
    jobs = deploy["jobs"]
    assert {name: (job["uses"], job["with"]["stack"], job.get("needs")) for name, job in jobs.items()} == {
        "dev": (REUSABLE, "dev", None), "staging": (REUSABLE, "staging", "dev"), "prod": (REUSABLE, "prod", "staging")}
    (up,) = workflow("deploy-stack.yml")["jobs"].values()
    assert up["environment"] == "${{ inputs.stack }}"  # prod's environment holds the required reviewers
    assert up["concurrency"] == {"group": "pulumi-${{ inputs.stack }}", "cancel-in-progress": False}


def test_the_deploy_sets_the_image_it_built_at_this_commit_never_latest():
    (up,) = workflow("deploy-stack.yml")["jobs"].values()
    steps = {s.get("id"): s for s in up["steps"]}
    assert steps["image"]["run"] == 'make image STACK="$STACK" TAG="$GITHUB_SHA"'
    install, pulumi = (s for s in up["steps"] if s.get("uses", "").startswith("pulumi/actions@"))
    assert "with" not in install and up["steps"].index(install) < up["steps"].index(steps["image"])  # its CLI
    assert pulumi["with"]["command"] == "up" and pulumi["with"]["policyPacks"] == "policy"
    assert "spotray:training.image: {value: '${{ steps.image.outputs.image }}'" in pulumi["with"]["config-map"]
    assert "latest" not in (WORKFLOWS / "deploy-stack.yml").read_text()


def test_pull_requests_run_the_tests_diff_the_plans_and_preview_every_aws_stack_on_the_pr():
    jobs = workflow("pull-request.yml")["jobs"]
    runs = {name: [s["run"] for s in job["steps"] if "run" in s] for name, job in jobs.items()}
    assert runs["test"] == ["make test"]
    assert runs["plan-diff"] == ["make install", 'make plan-diff BASE="$BASE_SHA"']
    assert jobs["preview"]["strategy"]["matrix"]["stack"] == ["dev", "staging", "prod"]
    preview = next(s for s in jobs["preview"]["steps"] if s.get("uses", "").startswith("pulumi/actions@"))
    assert {k: preview["with"][k] for k in ("command", "stack-name", "policyPacks", "comment-on-pr")} == {
        "command": "preview", "stack-name": "${{ matrix.stack }}", "policyPacks": "policy", "comment-on-pr": True}


@pytest.mark.parametrize("path", sorted(WORKFLOWS.glob("*.yml")), ids=lambda p: p.name)
def test_every_third_party_action_is_pinned_to_a_commit_with_its_version_noted(path):
    uses = [line for line in path.read_text().splitlines() if re.match(r"^\s*(- )?uses: ", line)]
    unpinned = [line.strip() for line in uses if not PINNED.match(line) and "uses: ./" not in line]
    assert uses and unpinned == []


def test_only_jobs_that_reach_aws_or_pulumi_cloud_may_mint_an_oidc_token():
    for flow in all_workflows().values():
        assert flow["permissions"] == {}  # nothing by default: each job asks for what it needs
    for name, job_name, job in jobs_with_steps():
        uses_oidc = any(s.get("uses", "").startswith(OIDC_ACTIONS) for s in job["steps"])
        assert (job["permissions"].get("id-token") == "write") == uses_oidc, f"{name}: {job_name}"
        assert job["permissions"].get("contents") == "read", f"{name}: {job_name}"
    callers = [job for job in workflow("deploy.yml")["jobs"].values()]
    assert all(job["permissions"] == {"contents": "read", "id-token": "write"} for job in callers)


def test_every_run_step_calls_a_make_target_of_this_repository():
    targets = makefile_targets()
    for name, job_name, job in jobs_with_steps():
        for step in job["steps"]:
            if "run" in step:
                words = shlex.split(step["run"])
                assert words[0] == "make" and words[1] in targets, f"{name}: {job_name}: {step['run']}"
    assert {"test", "install", "plan-diff", "image"} <= targets

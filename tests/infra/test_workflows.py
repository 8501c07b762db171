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
PUBLISH = "./.github/workflows/publish-render.yml"
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
        "dev": (REUSABLE, "dev", None), "staging": (REUSABLE, "staging", "dev"), "prod": (REUSABLE, "prod", "staging"),
        "render-dev": (PUBLISH, "dev", "dev"), "render-existing": (PUBLISH, "existing", "dev"),
        "render-staging": (PUBLISH, "staging", "staging"), "render-prod": (PUBLISH, "prod", "prod")}
    (up,) = workflow("deploy-stack.yml")["jobs"].values()
    assert up["environment"] == "${{ inputs.stack }}"  # prod's environment holds the required reviewers
    assert up["concurrency"] == {"group": "pulumi-${{ inputs.stack }}", "cancel-in-progress": False}


def test_every_stack_render_is_published_to_its_environment_branch_one_push_at_a_time():
    stacks = sorted(p.name.split(".")[1] for p in REPO.glob("Pulumi.*.yaml"))
    jobs = workflow("deploy.yml")["jobs"].values()
    published = sorted(job["with"]["stack"] for job in jobs if job["uses"] == PUBLISH)
    assert published == stacks
    (publish,) = workflow("publish-render.yml")["jobs"].values()
    assert publish["concurrency"] == {"group": "render-${{ inputs.stack }}", "cancel-in-progress": False}
    assert publish["permissions"] == {"contents": "write"}
    assert publish["steps"][-1]["run"] == 'make publish-render STACK="$STACK"'


def test_the_deploy_sets_the_image_it_built_at_this_commit_never_latest():
    (up,) = workflow("deploy-stack.yml")["jobs"].values()
    steps = {s.get("id"): s for s in up["steps"]}
    assert steps["image"]["run"] == 'make image STACK="$STACK" TAG="$GITHUB_SHA"'
    install, pulumi = (s for s in up["steps"] if s.get("uses", "").startswith("pulumi/actions@"))
    assert "with" not in install and up["steps"].index(install) < up["steps"].index(steps["image"])  # its CLI
    assert pulumi["with"]["command"] == "up" and pulumi["with"]["policyPacks"] == "policy"
    assert "spotray:training.image: {value: '${{ steps.image.outputs.image }}'" in pulumi["with"]["config-map"]
    assert "latest" not in (WORKFLOWS / "deploy-stack.yml").read_text()


def test_pull_requests_test_diff_the_plans_check_the_render_and_preview_the_stacks_that_changed():
    jobs = workflow("pull-request.yml")["jobs"]
    runs = {name: [s["run"] for s in job["steps"] if "run" in s] for name, job in jobs.items()}
    assert runs["test"] == ["make test"]
    assert runs["plan-diff"] == ["make install", 'make plan-diff BASE="$BASE_SHA"']
    assert runs["render-check"] == ["make install", "make render-check"]
    preview = jobs["preview"]
    assert jobs["plan-diff"]["outputs"]["stacks"] == "${{ steps.diff.outputs.stacks }}"
    assert preview["needs"] == "plan-diff" and preview["if"] == "needs.plan-diff.outputs.stacks != '[]'"
    assert preview["strategy"]["matrix"]["stack"] == "${{ fromJSON(needs.plan-diff.outputs.stacks) }}"
    pulumi = next(s for s in preview["steps"] if s.get("uses", "").startswith("pulumi/actions@"))
    assert {k: pulumi["with"][k] for k in ("command", "stack-name", "policyPacks", "comment-on-pr")} == {
        "command": "preview", "stack-name": "${{ matrix.stack }}", "policyPacks": "policy", "comment-on-pr": True}


@pytest.mark.parametrize(("name", "job"), [("pull-request.yml", "preview"), ("deploy-stack.yml", "up")])
def test_the_state_backend_comes_from_the_stack_file_and_pulumi_cloud_only_without_one(name, job):
    steps = workflow(name)["jobs"][job]["steps"]
    backend = next(s for s in steps if s.get("id") == "backend")
    assert backend["run"] == 'make pulumi-env STACK="$STACK" >> "$GITHUB_OUTPUT"'
    auth = next(s for s in steps if s.get("uses", "").startswith("pulumi/auth-actions@"))
    assert auth["if"] == "steps.backend.outputs.backend-url == ''"
    pulumi = [s for s in steps if s.get("uses", "").startswith("pulumi/actions@") and "with" in s][-1]
    assert pulumi["with"]["cloud-url"] == "${{ steps.backend.outputs.backend-url }}"
    assert pulumi["with"]["secrets-provider"] == "${{ steps.backend.outputs.secrets-provider }}"


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
        assert job["permissions"].get("contents") == ("write" if name == "publish-render.yml" else "read"), \
            f"{name}: {job_name}"
    callers = {job["uses"]: job["permissions"] for job in workflow("deploy.yml")["jobs"].values()}
    assert callers == {REUSABLE: {"contents": "read", "id-token": "write"}, PUBLISH: {"contents": "write"}}


def test_every_run_step_calls_a_make_target_of_this_repository():
    targets = makefile_targets()
    for name, job_name, job in jobs_with_steps():
        for step in job["steps"]:
            if "run" in step:
                words = shlex.split(step["run"])
                assert words[0] == "make" and words[1] in targets, f"{name}: {job_name}: {step['run']}"
    assert {"test", "install", "plan-diff", "image", "render-check", "pulumi-env", "publish-render"} <= targets

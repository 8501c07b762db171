"""In-cluster GitOps from the render (``infra/gitops.py``): the Argo CD, Flux and Pulumi Kubernetes Operator objects
validate against their pinned CRDs, the ApplicationSet expands (as Argo CD's list generator with Go templates
does) into Applications that stay inside the AppProject, and bad GitOps settings name their key."""

import copy
import re

import pytest

from infra.kernel.config import from_values
from infra.render import render, write
from spotray.errors import ConfigError
from tests.cluster.test_render import check_valid
from tests.infra.test_stack_config import values
from tests.repo import REPO
from tests.schemas import validate_custom_resource

CRDS = {"AppProject": "argocd-v3.5.1_appproject-crd.yaml", "ApplicationSet": "argocd-v3.5.1_applicationset-crd.yaml",
        "Application": "argocd-v3.5.1_application-crd.yaml",
        "GitRepository": "flux-source-controller-v1.9.1_source.toolkit.fluxcd.io_gitrepositories.yaml",
        "Kustomization": "flux-kustomize-controller-v1.9.4_kustomize.toolkit.fluxcd.io_kustomizations.yaml",
        "Stack": "pulumi-kubernetes-operator-v2.9.0_pulumi.com_stacks.yaml"}
GITOPS = {"repository": "acme/ml", "roles": True, "organization": "acme"}


def config(stack: str = "dev", **gitops):
    return from_values("spotray", stack, values(gitops={**GITOPS, **gitops}), "us-west-2")


def by_kind(rendered) -> dict[str, dict]:
    return {obj["kind"]: obj for obj in rendered.controller}


def _fill(node, element: dict):
    """Argo CD's Go templating of one list element, for the ``{{.key}}`` form the ApplicationSet uses."""
    if isinstance(node, dict):
        return {k: _fill(v, element) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill(v, element) for v in node]
    if isinstance(node, str):
        return re.sub(r"{{\.(\w+)}}", lambda m: element[m.group(1)], node)  # missingkey=error: a KeyError
    return node


def _merge(base: dict, override: dict) -> dict:
    """A generator's template over the ApplicationSet's: its non-empty fields win."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        elif value not in ({}, "", None):
            merged[key] = value
    return merged


def applications(application_set: dict) -> list[dict]:
    spec = application_set["spec"]
    assert spec["goTemplate"] and spec["goTemplateOptions"] == ["missingkey=error"]
    apps = []
    for generator in spec["generators"]:
        template = _merge(spec["template"], generator["list"].get("template", {}))
        for element in generator["list"]["elements"]:
            app = _fill(template, element)
            apps.append({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                         "metadata": {**app["metadata"], "namespace": "argocd"}, "spec": app["spec"]})
    return apps


@pytest.fixture(scope="module")
def dev_render(tmp_path_factory, stack_plans):
    cfg = stack_plans["dev"][0]
    rendered = render(*stack_plans["dev"])
    out = tmp_path_factory.mktemp("render") / "dev"
    write(rendered, out)
    return cfg, rendered, out


def test_argo_cd_objects_validate_and_expand_to_one_application_per_part_of_the_render(dev_render):
    cfg, rendered, out = dev_render
    objects = by_kind(rendered)
    assert set(objects) == {"AppProject", "ApplicationSet"}
    for obj in objects.values():
        validate_custom_resource(obj, CRDS[obj["kind"]])
        assert (out / "gitops" / "argocd" / f"{obj['kind'].lower()}-spotray-dev.yaml").is_file()
    apps = {app["metadata"]["name"]: app for app in applications(objects["ApplicationSet"])}
    for app in apps.values():
        validate_custom_resource(app, CRDS["Application"])
    releases = {f"spotray-dev-{r['release']['namespace']}-{r['release']['name']}": r["release"]
                for r in rendered.releases.values()}
    assert set(apps) == {"spotray-dev-objects", "spotray-dev-kuberay-crds", *releases}

    objects_source = apps["spotray-dev-objects"]["spec"]["source"]
    assert objects_source == {"repoURL": "https://github.com/example-org/spotray.git",
                              "targetRevision": "rendered/dev", "path": "."}
    for name, release in releases.items():
        chart, values_ref = apps[name]["spec"]["sources"]
        assert chart["targetRevision"] == release["version"] and chart["helm"]["skipCrds"] == release["skipCrds"]
        assert chart["chart"] == release["chart"].rsplit("/", 1)[-1]
        (values_file,) = chart["helm"]["valueFiles"]
        assert values_file.startswith("$rendered/") and (out / values_file.removeprefix("$rendered/")).is_file()
        assert values_ref == {"repoURL": objects_source["repoURL"], "targetRevision": "rendered/dev", "ref": "rendered"}
        assert apps[name]["spec"]["destination"]["namespace"] == release["namespace"]


def test_the_app_project_admits_only_the_stacks_namespaces_and_sources(dev_render):
    cfg, rendered, out = dev_render
    project = by_kind(rendered)["AppProject"]["spec"]
    namespaces = {d["namespace"] for d in project["destinations"]}
    assert namespaces == {"kuberay-system", "monitoring", "spotray", "spotray-system"}  # not kube-system
    assert "*" not in str(project["sourceRepos"]) and "*" not in str(project["destinations"])
    for app in applications(by_kind(rendered)["ApplicationSet"]):
        spec = app["spec"]
        assert spec["project"] == "spotray-dev" and spec["destination"]["namespace"] in namespaces
        for source in spec.get("sources") or [spec["source"]]:
            assert source["repoURL"] in project["sourceRepos"]
        assert spec["syncPolicy"]["automated"] == {"prune": True, "selfHeal": True}


def test_flux_follows_the_stacks_environment_branch(stack_plans):
    rendered = render(*stack_plans["existing"])
    objects = by_kind(rendered)
    assert set(objects) == {"GitRepository", "Kustomization", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                            "RoleBinding", "Namespace"}
    for kind in ("GitRepository", "Kustomization"):
        validate_custom_resource(objects[kind], CRDS[kind])
    source, kustomization = objects["GitRepository"], objects["Kustomization"]
    assert source["spec"]["ref"] == {"branch": "rendered/existing"}
    assert kustomization["spec"]["sourceRef"] == {"kind": "GitRepository", "name": source["metadata"]["name"]}
    assert kustomization["spec"]["path"] == "./" and kustomization["spec"]["prune"] is True


def allowed(roles: list[dict], verb: str, obj: dict) -> bool:
    """Kubernetes RBAC's answer for ``verb`` on ``obj`` (by name) under ``roles``' rules."""
    group, kind = obj["apiVersion"].rpartition("/")[0], obj["kind"].lower()
    plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "es" if kind.endswith("s") else kind + "s"
    return any(group in rule["apiGroups"] and plural in rule["resources"] and verb in rule["verbs"]
               and obj["metadata"]["name"] in rule.get("resourceNames", [obj["metadata"]["name"]])
               for role in roles for rule in role["rules"])


def test_flux_applies_as_an_account_that_may_write_only_the_stacks_namespaces_and_cluster_objects(stack_plans,
                                                                                                    tmp_path):
    cfg, planned = stack_plans["existing"]
    rendered = render(cfg, planned)
    gitops = rendered.controller
    for obj in gitops:  # an existing cluster's Kubernetes version is not known here: dev's
        if obj["kind"] not in CRDS:
            check_valid(obj, stack_plans["dev"][0].kubernetes.version)
    (account,) = [o for o in gitops if o["kind"] == "ServiceAccount"]
    (kustomization,) = [o for o in gitops if o["kind"] == "Kustomization"]
    assert kustomization["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert account["metadata"]["namespace"] == kustomization["metadata"]["namespace"]  # where Flux looks it up
    subject = [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                "namespace": account["metadata"]["namespace"]}]
    roles = {o["metadata"]["name"]: o for o in gitops if o["kind"] == "ClusterRole"}
    bindings = [o for o in gitops if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert all(b["subjects"] == subject for b in bindings)
    in_namespace = {b["metadata"].get("namespace"): roles[b["roleRef"]["name"]] for b in bindings}
    everywhere = in_namespace.pop(None)
    stack_namespaces = {o["metadata"]["namespace"] for o in rendered.objects.values() if "namespace" in o["metadata"]}
    assert set(in_namespace) == stack_namespaces
    for obj in rendered.objects.values():
        namespace = obj["metadata"].get("namespace")
        roles_here = [everywhere] + ([in_namespace[namespace]] if namespace else [])
        assert all(allowed(roles_here, verb, obj) for verb in ("get", "create", "patch", "delete")), obj["metadata"]
    outside = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}},
               {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": "system-node-critical"}},
               {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "admin"}}]
    assert not any(allowed([everywhere], verb, obj) for obj in outside for verb in ("create", "patch", "delete"))
    namespaces = [o for o in gitops if o["kind"] == "Namespace"]
    created = {o["metadata"]["name"] for o in rendered.objects.values() if o["kind"] == "Namespace"}
    assert {o["metadata"]["name"] for o in namespaces} == created >= stack_namespaces  # the bindings' homes first
    written = [p.relative_to(tmp_path).as_posix() for p in write(rendered, tmp_path) if "gitops/" in p.as_posix()]
    assert {f"gitops/{ns}/rolebinding-spotray-existing.yaml" for ns in stack_namespaces} <= set(written)
    assert len(written) == len(gitops)


def test_flux_may_write_the_renders_rbac_holding_exactly_the_rights_its_roles_grant(stack_plans):
    cfg, planned = stack_plans["existing"]
    rendered = render(cfg, planned)
    roles = [o for o in rendered.objects.values() if o["kind"] == "ClusterRole"]
    assert [r["metadata"]["name"] for r in roles] == ["spotray-node-reader"]
    tenant = {o["metadata"]["name"]: o for o in rendered.controller if o["kind"] == "ClusterRole"}
    everywhere = tenant["spotray-existing-cluster"]
    # Kubernetes' escalation check: writing a role, or binding it, takes holding what it grants (or escalate/bind)
    for role in roles:
        for rule in role["rules"]:
            assert rule in everywhere["rules"], rule
    for binding in (o for o in rendered.objects.values() if o["kind"] == "ClusterRoleBinding"):
        assert allowed([everywhere], "patch", binding)
        assert binding["roleRef"]["name"] in {r["metadata"]["name"] for r in roles}  # held, so no bind needed
    verbs = {verb for role in tenant.values() for rule in role["rules"] for verb in rule["verbs"]}
    assert not verbs & {"escalate", "bind", "impersonate", "*"}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ip-10-0-1-1"}}
    assert allowed([everywhere], "get", node) and not allowed([everywhere], "patch", node)


def test_the_app_project_admits_every_cluster_scoped_kind_of_the_render_rbac_included(dev_render):
    _, rendered, _ = dev_render
    project = by_kind(rendered)["AppProject"]["spec"]
    admitted = {(k["group"], k["kind"]) for k in project["clusterResourceWhitelist"]}
    cluster_scoped = {(o["apiVersion"].rpartition("/")[0], o["kind"]) for o in rendered.objects.values()
                      if "namespace" not in o["metadata"]}
    assert {("rbac.authorization.k8s.io", "ClusterRole"), ("rbac.authorization.k8s.io", "ClusterRoleBinding")} <= \
        cluster_scoped <= admitted
    namespaced = {("", "ServiceAccount"), *((o["apiVersion"].rpartition("/")[0], o["kind"])
                                            for o in rendered.objects.values() if "namespace" in o["metadata"])}
    if "namespaceResourceWhitelist" in project:  # none: every namespaced kind, in the project's namespaces only
        assert namespaced <= {(k["group"], k["kind"]) for k in project["namespaceResourceWhitelist"]}
    assert "namespaceResourceBlacklist" not in project


@pytest.mark.parametrize(("backend", "expected"), [
    ({}, {"stack": "acme/spotray/staging",
          "envRefs": {"PULUMI_ACCESS_TOKEN": {"type": "Secret",
                                              "secret": {"name": "pulumi-api-secret", "key": "accessToken"}}}}),
    ({"stateBackend": "s3://acme-pulumi-state/spotray", "secretsProvider": "awskms://alias/pulumi?region=us-west-2"},
     {"stack": "staging", "backend": "s3://acme-pulumi-state/spotray",
      "secretsProvider": "awskms://alias/pulumi?region=us-west-2"}),
], ids=["pulumi-cloud", "s3-and-kms"])
def test_the_pulumi_operator_stack_deploys_this_program_from_main_with_the_stacks_backend(backend, expected):
    (stack,) = render(config("staging", controller="pulumi-operator", **backend)).controller
    validate_custom_resource(stack, CRDS["Stack"])
    spec = stack["spec"]
    assert {k: spec[k] for k in expected} == expected
    assert spec["projectRepo"] == "https://github.com/acme/ml.git" and spec["branch"] == "main"
    assert spec["destroyOnFinalize"] is False  # deleting the object never destroys the stack


def test_no_controller_renders_no_controller_objects(tmp_path):
    rendered = render(config(controller=""))
    assert rendered.controller == []
    write(rendered, tmp_path / "out")
    assert not (tmp_path / "out" / "gitops").exists()


@pytest.mark.parametrize(("stack", "gitops", "key", "fix"), [
    ("dev", {"controller": "jenkins"}, "gitops.controller", "use one of argocd, flux, pulumi-operator"),
    ("dev", {"repository": "", "roles": False, "controller": "argocd"}, "gitops.repository", "owner/name"),
    ("dev", {"organization": ""}, "gitops.organization", "set your Pulumi Cloud organization"),
    ("dev", {"stateBackend": "gs://bucket", "secretsProvider": "awskms://alias/k"}, "gitops.stateBackend",
     "write s3://<bucket>"),
    ("dev", {"stateBackend": "s3://bucket"}, "gitops.secretsProvider", "set awskms://alias/"),
    ("dev", {"stateBackend": "s3://bucket", "secretsProvider": "passphrase"}, "gitops.secretsProvider",
     "set awskms://alias/"),
    ("dev", {"secretsProvider": "awskms://alias/k"}, "gitops.secretsProvider", "Pulumi Cloud encrypts"),
    ("qa", {}, "environment", "set spotray:environment: qa"),
])
def test_bad_gitops_settings_name_the_key_and_the_fix_before_anything_is_planned(stack, gitops, key, fix):
    with pytest.raises(ConfigError) as err:
        from_values("spotray", stack, values(environment="dev", gitops={**GITOPS, **gitops}), "us-west-2")
    assert err.value.field == f"spotray:{key}" and fix in str(err.value)
    assert "\n" not in str(err.value)


def test_the_command_prints_the_stacks_backend_for_the_pipeline(capsys):
    from infra.cli import main

    assert main(["pulumi-env", "--stack", "prod", "--project-dir", str(REPO)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "backend-url=", "secrets-provider=", "organization=example-org", "roles=true"]
    assert main(["pulumi-env", "--stack", "qa", "--project-dir", str(REPO)]) == 2
    assert "no stack file" in capsys.readouterr().err


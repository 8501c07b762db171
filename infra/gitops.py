"""What a cluster's GitOps controller needs to apply a stack's render, as data: ``spotray render`` writes it under
``gitops/`` when the stack sets ``spotray:gitops.controller``. The pipelines publish each stack's render to its
environment branch ``rendered/<stack>``, in promotion order (``.github/workflows/publish-render.yml``); these
objects follow that branch.

- ``argocd``: an ``AppProject`` that admits only the stack's namespaces and sources, and an ``ApplicationSet``
  that makes one Application of the render's objects, one of KubeRay's CRDs (server-side, at the chart's
  version), and one per Helm release (the chart as a Helm source, its values the rendered ``values.yaml``);
- ``flux``: a ``GitRepository`` of the branch and a ``Kustomization`` of it (the objects; Flux's source and
  kustomize controllers do not install Helm charts: the CLI says so), applied as the stack's own service account,
  which may write the render's namespaced kinds only in its namespaces and its cluster-scoped objects only by name
  (and, so that it may write the render's RBAC, the very rights the render's roles grant, never ``escalate``);
- ``pulumi-operator``: a ``pulumi.com/v1`` ``Stack`` that runs this program from the repository's main branch."""

from __future__ import annotations

from infra.kernel.config import StackConfig
from infra.kernel.names import (
    ARGOCD_NAMESPACE,
    FLUX_NAMESPACE,
    KUBERAY_NAMESPACE,
    PROGRAM_BRANCH,
    PULUMI_OPERATOR_NAMESPACE,
    TRAINING_NAMESPACE,
    render_branch,
)
from infra.kernel.versions import KUBERAY_CRD_DIR, KUBERAY_CRD_FILES, KUBERAY_GIT, KUBERAY_OPERATOR

IN_CLUSTER = "https://kubernetes.default.svc"
# Cluster-scoped kinds the pinned charts create (RBAC, their CRDs, admission webhooks), beside the render's own.
CHART_CLUSTER_KINDS = (("rbac.authorization.k8s.io", "ClusterRole"),
                       ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
                       ("apiextensions.k8s.io", "CustomResourceDefinition"),
                       ("admissionregistration.k8s.io", "MutatingWebhookConfiguration"),
                       ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration"))
_VALUES_REF = "rendered"  # the Argo CD source that the Helm sources read their values files from


def controller_objects(cfg: StackConfig, objects: dict[str, dict], releases: dict[str, dict]) -> list[dict]:
    """``objects`` and ``releases`` as ``infra.render.Rendered`` holds them; [] without a controller."""
    builders = {"argocd": _argocd, "flux": _flux, "pulumi-operator": _pulumi_operator}
    return builders[cfg.gitops.controller](cfg, objects, releases) if cfg.gitops.controller else []


def git_url(cfg: StackConfig) -> str:
    return f"https://github.com/{cfg.gitops.repository}.git"


def namespaces(objects: dict[str, dict], releases: dict[str, dict]) -> list[str]:
    """Every namespace the render writes into or creates."""
    found = {obj["metadata"]["name"] for obj in objects.values() if obj["kind"] == "Namespace"}
    found |= {obj["metadata"]["namespace"] for obj in objects.values() if "namespace" in obj["metadata"]}
    found |= {release["release"]["namespace"] for release in releases.values()}
    return sorted(found)


def _name(cfg: StackConfig) -> str:
    return f"spotray-{cfg.stack}"


def _metadata(cfg: StackConfig, namespace: str | None, name: str = "") -> dict:
    return {"name": name or _name(cfg), **({"namespace": namespace} if namespace else {}),
            "labels": {"spotray.dev/stack": cfg.stack}}


def _argocd(cfg: StackConfig, objects: dict[str, dict], releases: dict[str, dict]) -> list[dict]:
    helm = [_helm_element(cfg, directory, release["release"]) for directory, release in releases.items()]
    repos = {git_url(cfg), KUBERAY_GIT} | {element["repoURL"] for element in helm}
    cluster_kinds = {(obj["apiVersion"].rpartition("/")[0], obj["kind"]) for obj in objects.values()
                     if "namespace" not in obj["metadata"]}
    project = {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject", "metadata": _metadata(cfg, ARGOCD_NAMESPACE),
        "spec": {
            "description": f"spotray stack {cfg.stack}: only its namespaces and sources",
            "sourceRepos": sorted(repos),
            "destinations": [{"server": IN_CLUSTER, "namespace": ns} for ns in namespaces(objects, releases)],
            "clusterResourceWhitelist": [{"group": group, "kind": kind}
                                         for group, kind in sorted(cluster_kinds | set(CHART_CLUSTER_KINDS))],
        },
    }
    generators = [
        _generator([{"app": "objects", "namespace": TRAINING_NAMESPACE}],
                   {"repoURL": git_url(cfg), "targetRevision": render_branch(cfg.stack), "path": "."}),
        _generator([{"app": "kuberay-crds", "namespace": KUBERAY_NAMESPACE}],
                   {"repoURL": KUBERAY_GIT, "targetRevision": f"v{KUBERAY_OPERATOR.version}", "path": KUBERAY_CRD_DIR,
                    "directory": {"include": "{" + ",".join(KUBERAY_CRD_FILES) + "}"}}),
    ]
    for skip_crds in (False, True):  # a boolean cannot come from a template string, so one generator for each
        elements = [{k: v for k, v in e.items() if k != "skipCrds"} for e in helm if e["skipCrds"] is skip_crds]
        if elements:
            generators.append(_helm_generator(cfg, elements, skip_crds))
    application_set = {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet", "metadata": _metadata(cfg, ARGOCD_NAMESPACE),
        "spec": {
            "goTemplate": True, "goTemplateOptions": ["missingkey=error"], "generators": generators,
            "template": {
                "metadata": {"name": f"{_name(cfg)}-{{{{.app}}}}", "labels": {"spotray.dev/stack": cfg.stack}},
                "spec": {"project": _name(cfg), "destination": {"server": IN_CLUSTER, "namespace": "{{.namespace}}"},
                         "syncPolicy": {"automated": {"prune": True, "selfHeal": True},
                                        "syncOptions": ["ServerSideApply=true"]}},
            },
        },
    }
    return [project, application_set]


def _generator(elements: list[dict], source: dict) -> dict:
    return {"list": {"elements": elements, "template": {"metadata": {}, "spec": {
        "project": "", "destination": {}, "source": source}}}}


def _helm_element(cfg: StackConfig, directory: str, release: dict) -> dict:
    chart = release["chart"]
    if chart.startswith("oci://"):  # Argo CD names an OCI Helm registry without its scheme
        repo, chart = chart.removeprefix("oci://").rsplit("/", 1)
    else:
        repo = release["repository"]
    return {"app": f"{release['namespace']}-{release['name']}", "namespace": release["namespace"], "repoURL": repo,
            "chart": chart, "version": release["version"], "release": release["name"],
            "values": f"{directory}/values.yaml", "skipCrds": release["skipCrds"]}


def _helm_generator(cfg: StackConfig, elements: list[dict], skip_crds: bool) -> dict:
    chart = {"repoURL": "{{.repoURL}}", "chart": "{{.chart}}", "targetRevision": "{{.version}}",
             "helm": {"releaseName": "{{.release}}", "valueFiles": [f"${_VALUES_REF}/{{{{.values}}}}"],
                      "skipCrds": skip_crds}}
    values = {"repoURL": git_url(cfg), "targetRevision": render_branch(cfg.stack), "ref": _VALUES_REF}
    return {"list": {"elements": elements, "template": {"metadata": {}, "spec": {
        "project": "", "destination": {}, "sources": [chart, values]}}}}


def _flux(cfg: StackConfig, objects: dict[str, dict], releases: dict[str, dict]) -> list[dict]:
    source = {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
              "metadata": _metadata(cfg, FLUX_NAMESPACE),
              "spec": {"interval": "1m", "url": git_url(cfg), "ref": {"branch": render_branch(cfg.stack)}}}
    kustomization = {"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
                     "metadata": _metadata(cfg, FLUX_NAMESPACE),
                     "spec": {"interval": "10m", "retryInterval": "1m", "timeout": "5m", "path": "./",
                              "prune": True, "wait": True, "serviceAccountName": _name(cfg),
                              "sourceRef": {"kind": "GitRepository", "name": _name(cfg)}}}
    return [source, kustomization, *_flux_tenant(cfg, objects)]


def _flux_tenant(cfg: StackConfig, objects: dict[str, dict]) -> list[dict]:
    """The service account the Kustomization applies as, and its rights. Its role bindings live in the render's
    namespaces, so those come with it: the objects of the render would otherwise be needed to apply themselves."""
    namespaced = [obj for obj in objects.values() if "namespace" in obj["metadata"]]
    cluster_scoped = [obj for obj in objects.values() if "namespace" not in obj["metadata"]]
    account = [{"kind": "ServiceAccount", "name": _name(cfg), "namespace": FLUX_NAMESPACE}]
    in_namespaces, by_name = f"{_name(cfg)}-namespaced", f"{_name(cfg)}-cluster"
    rbac = _RBAC
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(cfg, FLUX_NAMESPACE)},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": _metadata(cfg, None, in_namespaces),
         "rules": [_rule(group, plural, _READ + _CHANGE) for group, plural in _resources(namespaced)]
         + _rbac_rules(namespaced, "Role")},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": _metadata(cfg, None, by_name),
         "rules": [rule for group, plural in _resources(cluster_scoped) for rule in (
             _rule(group, plural, _READ),
             _rule(group, plural, _CHANGE, sorted(o["metadata"]["name"] for o in cluster_scoped
                                                  if _resource(o) == (group, plural))))]
         + _rbac_rules(list(objects.values()), "ClusterRole")},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": _metadata(cfg, None),
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": by_name}, "subjects": account},
        *({"apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": _metadata(cfg, namespace),
           "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": in_namespaces}, "subjects": account}
          for namespace in sorted({obj["metadata"]["namespace"] for obj in namespaced})),
        *(obj for obj in cluster_scoped if obj["kind"] == "Namespace"),
    ]


def _rbac_rules(objects: list[dict], kind: str) -> list[dict]:
    """Kubernetes lets an account write a role, or bind one, only if it holds every right the role grants (RBAC's
    escalation check) or may ``escalate``/``bind``. The applier holds the rules of each role of ``kind`` the render
    makes, no more (never ``escalate``), and ``bind`` only on roles a binding of the render names but does not make."""
    made = {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}
    bound = sorted({o["roleRef"]["name"] for o in objects
                    if o["kind"] in ("RoleBinding", "ClusterRoleBinding") and o["roleRef"]["kind"] == kind} - set(made))
    held = []
    for name in sorted(made):
        held += [dict(rule) for rule in made[name].get("rules", []) if rule not in held]
    return [*held, *([_rule(_RBAC, f"{kind.lower()}s", ["bind"], bound)] if bound else [])]


_RBAC = "rbac.authorization.k8s.io"
_READ = ["get", "list", "watch"]
_CHANGE = ["create", "update", "patch", "delete"]  # by name too: Flux creates with server-side apply, a named PATCH


def _rule(group: str, plural: str, verbs: list[str], names: list[str] | None = None) -> dict:
    rule = {"apiGroups": [group], "resources": [plural], "verbs": list(verbs)}
    return rule | {"resourceNames": names} if names else rule


def _resources(objects: list[dict]) -> list[tuple[str, str]]:
    return sorted({_resource(obj) for obj in objects})


def _resource(obj: dict) -> tuple[str, str]:
    """An object's API group and resource name, by Kubernetes' own plural of its kind."""
    kind = obj["kind"].lower()
    plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "es" if kind.endswith("s") else kind + "s"
    return obj["apiVersion"].rpartition("/")[0], plural


def _pulumi_operator(cfg: StackConfig, objects: dict[str, dict], releases: dict[str, dict]) -> list[dict]:
    gitops = cfg.gitops
    spec = {"projectRepo": git_url(cfg), "branch": PROGRAM_BRANCH, "refresh": True, "destroyOnFinalize": False,
            "serviceAccountName": _name(cfg), "resyncFrequencySeconds": 600}
    if gitops.state_backend:
        spec |= {"stack": cfg.stack, "backend": gitops.state_backend, "secretsProvider": gitops.secrets_provider}
    else:
        spec |= {"stack": f"{gitops.organization}/{cfg.project or 'spotray'}/{cfg.stack}",
                 "envRefs": {"PULUMI_ACCESS_TOKEN": {"type": "Secret",
                                                     "secret": {"name": "pulumi-api-secret", "key": "accessToken"}}}}
    return [{"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": _metadata(cfg, PULUMI_OPERATOR_NAMESPACE),
             "spec": spec}]

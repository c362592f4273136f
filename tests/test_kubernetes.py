"""deploy/kubernetes/: every manifest against pinned Kubernetes schemas, and against the code.

The kustomization is rendered here in Python (it uses only ``namespace``, ``labels`` without
selectors and ``images``); where ``kubectl`` is on PATH its built-in kustomize renders it too and
both must agree. Every rendered object, the optional KEDA ScaledObject and the Secret template are
validated strictly (unknown fields refused) by ``kubernetes-validate`` against the schemas of
each version in ``KUBERNETES_VERSIONS``. The two custom resources are validated against models
generated from their projects' published CRD schemas (``cloudcoil-models-prometheus-operator``
for the ServiceMonitor, ``cloudcoil-models-keda`` for the ScaledObject): parsed, and dumped back
unchanged, so a misspelt field — which such a model would ignore — fails too. Then the semantics:
probes on the ports the settings use, security contexts matching the image's user, resource
requests and limits, Secrets referenced and never shipped, grace periods longer than the
services' shutdown budgets, the per-release migration Job, PodDisruptionBudgets, the executor
autoscaler's metrics, the NetworkPolicies (evaluated: the public path reaches the webhook port
only, the admin API only its labelled clients) and the ServiceMonitor's targets.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject
from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

from connector.cli.main import COMMANDS
from connector.common.core import settings
from connector.executor import metrics as executor_metrics
from tests.test_deploy import known_env_names

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes"
# The oldest Kubernetes release we support and the newest whose schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")
COMPONENTS = ("ingress", "materializer", "executor")
IMAGE_USER = 10001  # deploy/Dockerfile: USER 10001:10001
CRD_MODELS: dict[tuple[str, str], Any] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ServiceMonitor,
    ("keda.sh/v1alpha1", "ScaledObject"): ScaledObject,
}
CLUSTER_SCOPED = {"Namespace"}


# --- rendering ----------------------------------------------------------------------------------------


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomization() -> dict[str, Any]:
    data = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert isinstance(data, dict)
    return data


def render() -> list[dict[str, Any]]:
    """``kustomize build deploy/kubernetes`` for the transformers this kustomization uses."""
    k = kustomization()
    supported = {"apiVersion", "kind", "namespace", "labels", "images", "resources"}
    assert set(k) <= supported, f"the Python renderer does not know {sorted(set(k) - supported)}"
    images = {i["name"]: i for i in k.get("images", [])}
    out = []
    for resource in k["resources"]:
        for doc in load_docs(K8S / resource):
            doc = copy.deepcopy(doc)
            meta = doc.setdefault("metadata", {})
            if doc["kind"] not in CLUSTER_SCOPED:
                meta["namespace"] = k["namespace"]
            for group in k.get("labels", []):
                assert not group.get("includeSelectors") and not group.get("includeTemplates")
                meta.setdefault("labels", {}).update(group["pairs"])
            for container in containers(doc):
                spec = images.get(container["image"].split(":")[0])
                if spec:
                    container["image"] = f"{spec.get('newName', container['image'])}:{spec['newTag']}"
            out.append(doc)
    return out


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc["kind"] in ("Deployment", "Job"):
        return dict(doc["spec"]["template"]["spec"])
    return None


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(doc)
    return [] if spec is None else [*spec.get("initContainers", []), *spec["containers"]]


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return render()


def find(rendered: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in rendered if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} objects"
    return matches[0]


def of_kind(rendered: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in rendered if d["kind"] == kind]


def deployment(rendered: list[dict[str, Any]], component: str) -> dict[str, Any]:
    return find(rendered, "Deployment", f"connector-{component}")


def test_every_manifest_file_is_in_the_kustomization_or_optional() -> None:
    listed = set(kustomization()["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secrets.example.yaml"}
    assert listed == on_disk


def test_kubectl_kustomize_agrees_with_the_python_rendering(rendered: list[dict[str, Any]]) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip(
            "kubectl is not on PATH: rendered by the Python renderer only (kustomize cross-check skipped)"
        )
    proc = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    theirs = [d for d in yaml.safe_load_all(proc.stdout) if d]

    def key(d: dict[str, Any]) -> tuple[str, str, str]:
        return (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])

    assert sorted(theirs, key=key) == sorted(rendered, key=key)


# --- schemas ------------------------------------------------------------------------------------------


def validate_strict(doc: dict[str, Any], version: str) -> None:
    model = CRD_MODELS.get((doc["apiVersion"], doc["kind"]))
    if model is not None:
        parsed = model.model_validate(doc)
        # Fields the model does not know are dropped, not refused: a round trip finds them.
        assert parsed.model_dump(by_alias=True, exclude_unset=True, mode="json") == doc, (
            f"{doc['kind']}/{doc['metadata']['name']} has fields its CRD schema does not define"
        )
        return
    kubernetes_validate.validate(doc, version, strict=True)


def all_validated_docs(rendered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    extra = [*load_docs(K8S / "secrets.example.yaml")]
    for path in sorted((K8S / "optional").glob("*.yaml")):
        extra += load_docs(path)
    return [*rendered, *extra]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_against_the_pinned_schemas(
    rendered: list[dict[str, Any]], version: str
) -> None:
    docs = all_validated_docs(rendered)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "Job", "PodDisruptionBudget", "HorizontalPodAutoscaler"} <= kinds
    assert {"NetworkPolicy", "ServiceMonitor", "ScaledObject", "Secret", "ConfigMap"} <= kinds
    for doc in docs:
        try:
            validate_strict(doc, version)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} (Kubernetes {version}): {exc}")


BROKEN = {
    "unknown-container-field": (
        "Deployment",
        "connector-executor",
        lambda d: d["spec"]["template"]["spec"]["containers"][0].update(imagePullPolicyy="Always"),
    ),
    "replicas-not-int": ("Deployment", "connector-ingress", lambda d: d["spec"].update(replicas="two")),
    "pdb-bad-type": (
        "PodDisruptionBudget",
        "connector-executor",
        lambda d: d["spec"].update(maxUnavailable=[1]),
    ),
    "hpa-target-not-a-quantity": (
        "HorizontalPodAutoscaler",
        "connector-executor",
        lambda d: d["spec"]["metrics"][0]["external"]["target"].update(averageValue={"items": 160}),
    ),
    "servicemonitor-typo": (
        "ServiceMonitor",
        "connector-runtime",
        lambda d: d["spec"]["endpoints"][0].update(intervall="15s"),
    ),
    "servicemonitor-port-type": (
        "ServiceMonitor",
        "connector-runtime",
        lambda d: d["spec"]["endpoints"][0].update(port=9103),
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_validation_can_fail(rendered: list[dict[str, Any]], case: str) -> None:
    kind, name, mutate = BROKEN[case]
    broken = copy.deepcopy(find(rendered, kind, name))
    mutate(broken)
    with pytest.raises((kubernetes_validate.ValidationError, AssertionError, ValueError)):
        validate_strict(broken, KUBERNETES_VERSIONS[-1])


def test_keda_alternative_validates_and_can_fail() -> None:
    (scaled,) = load_docs(K8S / "optional" / "keda-scaledobject.yaml")
    validate_strict(scaled, KUBERNETES_VERSIONS[-1])
    broken = copy.deepcopy(scaled)
    broken["spec"]["triggers"][0]["metadataa"] = broken["spec"]["triggers"][0].pop("metadata")
    with pytest.raises((AssertionError, ValueError)):
        validate_strict(broken, KUBERNETES_VERSIONS[-1])
    assert scaled["spec"]["scaleTargetRef"]["name"] == "connector-executor"


# --- workloads ----------------------------------------------------------------------------------------


def env_of(rendered: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, Any]:
    env: dict[str, Any] = {}
    for source in container.get("envFrom", []):
        env.update(find(rendered, "ConfigMap", source["configMapRef"]["name"])["data"])
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", item.get("valueFrom"))
    return env


def test_a_deployment_per_component_running_its_subcommand(rendered: list[dict[str, Any]]) -> None:
    assert {d["metadata"]["name"] for d in of_kind(rendered, "Deployment")} == {
        f"connector-{c}" for c in (*COMPONENTS, "console")
    }
    tag = kustomization()["images"][0]["newTag"]
    for component in COMPONENTS:
        (container,) = containers(deployment(rendered, component))
        assert tuple(container["args"]) in COMMANDS and container["args"] == [component]
        assert container["image"] == f"connector-runtime:{tag}"
        assert "command" not in container, "the image's entrypoint is `connector`"


def test_probes_use_the_services_ports(rendered: list[dict[str, Any]]) -> None:
    (ingress,) = containers(deployment(rendered, "ingress"))
    ports = {p["name"]: p["containerPort"] for p in ingress["ports"]}
    cfg = settings.IngressSettings()
    assert ports == {"http": cfg.http_port, "grpc": cfg.grpc_port, "metrics": cfg.metrics_port}
    assert ingress["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert ingress["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    for component, cfg_cls in (
        ("materializer", settings.MaterializerSettings),
        ("executor", settings.ExecutorSettings),
    ):
        (container,) = containers(deployment(rendered, component))
        c = cfg_cls()
        assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
            "grpc": c.grpc_port,
            "metrics": c.metrics_port,
        }
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"] == {"port": c.grpc_port}, (component, probe)


def test_every_container_has_requests_and_limits(rendered: list[dict[str, Any]]) -> None:
    for doc in rendered:
        for container in containers(doc):
            resources = container["resources"]
            for part in ("requests", "limits"):
                assert set(resources[part]) == {"cpu", "memory"}, (doc["metadata"]["name"], part)


def test_pods_run_non_root_with_a_read_only_root(rendered: list[dict[str, Any]]) -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert f"USER {IMAGE_USER}:{IMAGE_USER}" in dockerfile
    pods = [d for d in rendered if pod_spec(d) is not None]
    assert len(pods) == 5  # four Deployments (three services and the console) and the migration Job
    for doc in pods:
        spec = pod_spec(doc)
        assert spec is not None
        name = doc["metadata"]["name"]
        sc = spec["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == IMAGE_USER, name
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        assert spec["enableServiceLinks"] is False, f"{name}: service links inject CONNECTOR_* variables"
        # The services write nothing locally (the compose smoke runs them read-only too).
        assert not [v for v in spec.get("volumes", []) if "emptyDir" in v], name
        for container in containers(doc):
            csc = container["securityContext"]
            assert csc["readOnlyRootFilesystem"] is True, name
            assert csc["allowPrivilegeEscalation"] is False, name
            assert csc["capabilities"] == {"drop": ["ALL"]}, name


def test_environment_is_read_by_the_code(rendered: list[dict[str, Any]]) -> None:
    known = known_env_names()
    for doc in rendered:
        for container in containers(doc):
            env = env_of(rendered, container)
            unknown = {k for k in env if k.startswith("CONNECTOR_")} - known
            assert not unknown, f"{doc['metadata']['name']}: nothing reads {sorted(unknown)}"
            if doc["metadata"]["name"] == "connector-console":  # an admin API client: no database
                assert "CONNECTOR_DATABASE_URL" not in env and "CONNECTOR_ADMIN_TOKENS" not in env
            else:
                assert "CONNECTOR_DATABASE_URL" in env


def test_secrets_are_referenced_never_shipped(rendered: list[dict[str, Any]]) -> None:
    assert not of_kind(rendered, "Secret"), "the kustomization must not carry Secret values"
    template = {d["metadata"]["name"]: set(d["stringData"]) for d in load_docs(K8S / "secrets.example.yaml")}
    referenced: dict[str, set[str]] = {}
    for doc in rendered:
        spec = pod_spec(doc)
        if spec is None:
            continue
        for container in containers(doc):
            for item in container.get("env", []):
                assert "value" not in item or not re.search(r"(?i)secret|token|password", item["name"])
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    referenced.setdefault(ref["name"], set()).add(ref["key"])
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                referenced.setdefault(volume["secret"]["secretName"], set())
    assert referenced == {
        "connector-database": {"url"},
        "connector-admin": {"tokens"},
        "connector-webhook-secrets": set(),
    }
    for name, keys in referenced.items():
        assert name in template and keys <= template[name], name
    # The admin tokens reach the executor only; the signing secrets the ingress only.
    assert "CONNECTOR_ADMIN_TOKENS" in env_of(rendered, containers(deployment(rendered, "executor"))[0])
    for component in ("ingress", "materializer"):
        assert "CONNECTOR_ADMIN_TOKENS" not in env_of(
            rendered, containers(deployment(rendered, component))[0]
        )


def test_grace_periods_exceed_the_shutdown_budgets(rendered: list[dict[str, Any]]) -> None:
    config = find(rendered, "ConfigMap", "connector-config")["data"]
    executor = deployment(rendered, "executor")["spec"]["template"]["spec"]
    budget = float(config["CONNECTOR_EXECUTOR_SHUTDOWN_GRACE_S"])
    # grace for handlers + gRPC stop (<= 5 s, service.py) + finalize flush.
    assert executor["terminationGracePeriodSeconds"] >= budget + 10
    assert budget < settings.ExecutorSettings().lease_s, "a drained item must not outlive its lease"
    ingress = deployment(rendered, "ingress")["spec"]["template"]["spec"]
    pre_stop = int(ingress["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1])
    assert (
        ingress["terminationGracePeriodSeconds"]
        >= pre_stop + float(config["CONNECTOR_INGRESS_SHUTDOWN_GRACE_S"]) + 5
    )


def test_migration_job_runs_once_per_release(rendered: list[dict[str, Any]]) -> None:
    (job,) = of_kind(rendered, "Job")
    tag = kustomization()["images"][0]["newTag"]
    assert job["metadata"]["name"] == "connector-migrate-" + tag.replace(".", "-"), (
        "rename the migration Job with the release (a new Job per release; the same release re-applied"
        " changes nothing)"
    )
    (container,) = containers(job)
    assert container["args"] == ["db", "upgrade"] and ("db", "upgrade") in COMMANDS
    assert job["spec"]["template"]["spec"]["restartPolicy"] in ("OnFailure", "Never")
    assert job["spec"]["backoffLimit"] >= 1


def test_services_select_their_pods_by_named_ports(rendered: list[dict[str, Any]]) -> None:
    for service in of_kind(rendered, "Service"):
        selector = service["spec"]["selector"]
        targets = [
            d for d in of_kind(rendered, "Deployment")
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]  # fmt: skip
        assert len(targets) == 1, service["metadata"]["name"]
        names = {p["name"] for p in containers(targets[0])[0]["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in names, (service["metadata"]["name"], port)


def test_disruption_budgets_cover_every_deployment(rendered: list[dict[str, Any]]) -> None:
    budgets = of_kind(rendered, "PodDisruptionBudget")
    for component in COMPONENTS:
        labels = deployment(rendered, component)["spec"]["template"]["metadata"]["labels"]
        covering = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(covering) == 1, component
        spec = covering[0]["spec"]
        assert spec.get("minAvailable", 1) >= 1 or spec.get("maxUnavailable") == 1


def test_executor_autoscaler_uses_queue_metrics_the_executor_exports(rendered: list[dict[str, Any]]) -> None:
    (hpa,) = of_kind(rendered, "HorizontalPodAutoscaler")
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "connector-executor",
    }
    assert spec["minReplicas"] == deployment(rendered, "executor")["spec"]["replicas"]
    names = {m["external"]["metric"]["name"] for m in spec["metrics"]}
    assert names == {"connector_executor_backlog", "connector_executor_oldest_ready_age"}
    # The adapter rules in docs/deploy.md define both from gauges the executor really exports.
    exported = {
        executor_metrics.QUEUE_DEPTH._name,  # type: ignore[attr-defined]
        executor_metrics.OLDEST_READY_AGE._name,  # type: ignore[attr-defined]
    }
    assert exported == {"connector_executor_queue_depth", "connector_executor_oldest_ready_age_seconds"}
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for name in (*names, *exported):
        assert name in docs, f"docs/deploy.md does not explain {name}"
    (scaled,) = load_docs(K8S / "optional" / "keda-scaledobject.yaml")
    queries = " ".join(t["metadata"]["query"] for t in scaled["spec"]["triggers"])
    assert all(name in queries for name in exported)


# --- network policy -----------------------------------------------------------------------------------


def _selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    if selector is None:
        return False
    assert set(selector) <= {"matchLabels"}, "the evaluator knows matchLabels only"
    return bool(selector.get("matchLabels", {}).items() <= labels.items())


def allowed(
    rendered: list[dict[str, Any]],
    *,
    src_pod: dict[str, str],
    src_ns: dict[str, str],
    dst: dict[str, str],
    port: int,
) -> bool:
    """Whether the rendered NetworkPolicies let a pod (labels ``src_pod`` in a namespace labelled
    ``src_ns``) reach pod ``dst`` of the connector namespace on ``port``."""
    ns_labels = {"kubernetes.io/metadata.name": "connector"}
    same_ns = src_ns == ns_labels
    policies = [p for p in of_kind(rendered, "NetworkPolicy") if _selects(p["spec"]["podSelector"], dst)]
    isolated = [p for p in policies if "Ingress" in p["spec"]["policyTypes"]]
    if not isolated:
        return True
    for policy in isolated:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports is not None and port not in [p["port"] for p in ports]:
                continue
            peers = rule.get("from")
            if peers is None:
                return True  # no `from`: every source
            for peer in peers:
                assert "ipBlock" not in peer
                pod_sel, ns_sel = peer.get("podSelector"), peer.get("namespaceSelector")
                if ns_sel is None and same_ns and _selects(pod_sel, src_pod):
                    return True
                if ns_sel is not None and _selects(ns_sel, src_ns):
                    if pod_sel is None or _selects(pod_sel, src_pod):
                        return True
    return False


def test_network_policy_keeps_the_admin_api_off_the_public_path(rendered: list[dict[str, Any]]) -> None:
    def pod(component: str) -> dict[str, str]:
        return dict(deployment(rendered, component)["spec"]["template"]["metadata"]["labels"])

    ingress, executor, materializer = pod("ingress"), pod("executor"), pod("materializer")
    public = {
        "src_pod": {"app": "ingress-controller"},
        "src_ns": {"kubernetes.io/metadata.name": "ingress-nginx"},
    }
    connector_ns = {"kubernetes.io/metadata.name": "connector"}
    monitoring = {"src_pod": {"app": "prometheus"}, "src_ns": {"kubernetes.io/metadata.name": "monitoring"}}
    admin_client = {"src_pod": {"connector-runtime/admin-client": "true"}, "src_ns": connector_ns}
    http_port = settings.IngressSettings().http_port
    admin_port = settings.ExecutorSettings().grpc_port
    # The public path reaches the webhook port, and nothing else.
    assert allowed(rendered, **public, dst=ingress, port=http_port)
    for dst, port in (
        (ingress, settings.IngressSettings().grpc_port),
        (ingress, settings.IngressSettings().metrics_port),
        (executor, admin_port),
        (executor, settings.ExecutorSettings().metrics_port),
        (materializer, settings.MaterializerSettings().grpc_port),
    ):
        assert not allowed(rendered, **public, dst=dst, port=port), (dst, port)
    # The admin API: its labelled clients only — not even the ingress pods.
    assert allowed(rendered, **admin_client, dst=executor, port=admin_port)
    assert not allowed(rendered, src_pod=ingress, src_ns=connector_ns, dst=executor, port=admin_port)
    assert not allowed(rendered, src_pod=ingress, src_ns=public["src_ns"], dst=executor, port=admin_port)
    # Monitoring scrapes every metrics port.
    for component, cfg in (
        ("ingress", settings.IngressSettings()),
        ("materializer", settings.MaterializerSettings()),
        ("executor", settings.ExecutorSettings()),
    ):
        assert allowed(rendered, **monitoring, dst=pod(component), port=cfg.metrics_port), component
    # The operator console: an admin client itself; reached only by its labelled clients.
    console = pod("console")
    console_port = settings.ConsoleSettings().port
    assert allowed(rendered, src_pod=console, src_ns=connector_ns, dst=executor, port=admin_port)
    console_client = {"src_pod": {"connector-runtime/console-client": "true"}, "src_ns": connector_ns}
    assert allowed(rendered, **console_client, dst=console, port=console_port)
    assert not allowed(rendered, **public, dst=console, port=console_port)
    assert not allowed(rendered, src_pod=ingress, src_ns=connector_ns, dst=console, port=console_port)
    (container,) = containers(deployment(rendered, "console"))
    assert container["args"] == ["console"] and container["ports"] == [
        {"name": "http", "containerPort": console_port}
    ]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    env = env_of(rendered, container)
    assert env["CONNECTOR_CONSOLE_ADMIN_ADDRESS"] == f"connector-admin:{admin_port}"
    # Control: without the default deny and the executor's policy, the public path would reach it.
    open_ = [
        p for p in rendered if p["kind"] != "NetworkPolicy" or p["metadata"]["name"] == "connector-ingress"
    ]
    assert allowed(open_, **public, dst=executor, port=admin_port)


# --- monitoring ---------------------------------------------------------------------------------------


def test_service_monitor_scrapes_every_component_once(rendered: list[dict[str, Any]]) -> None:
    (monitor,) = of_kind(rendered, "ServiceMonitor")
    selector = monitor["spec"]["selector"]
    (expr,) = selector["matchExpressions"]
    assert expr["key"] == "app.kubernetes.io/component" and expr["operator"] == "In"
    selected = [
        s for s in of_kind(rendered, "Service")
        if selector["matchLabels"].items() <= s["metadata"]["labels"].items()
        and s["metadata"]["labels"].get(expr["key"]) in expr["values"]
    ]  # fmt: skip
    assert sorted(s["metadata"]["name"] for s in selected) == [f"connector-{c}" for c in sorted(COMPONENTS)]
    port_name = monitor["spec"]["endpoints"][0]["port"]
    for service in selected:
        assert port_name in [p["name"] for p in service["spec"]["ports"]], service["metadata"]["name"]
    admin = find(rendered, "Service", "connector-admin")
    assert admin not in selected and port_name not in [p["name"] for p in admin["spec"]["ports"]]

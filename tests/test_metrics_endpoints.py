"""Every service's ``/metrics`` endpoint, scraped from real processes after a small signed load:
``promtool check metrics`` finds nothing, each service exports only its own families (no
``connector_executor_*`` at the ingress: an alert without a job filter cannot misfire), the pack
label is the pack's name, the route labels are installed routes only, and docs/metrics.md lists
every family exported.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.metrics_stack import ROOT, SERVICES, require_prometheus_tools, running_stack, scrape

#: Family prefixes only one service may export.
OWN_PREFIX = {s: f"connector_{s}_" for s in SERVICES}
#: Families of other services that a service must never export (besides the prefixes above).
FOREIGN_EXTRA = {
    "ingress": ("connector_admin_", "connector_legacy_", "connector_retention_"),
    "materializer": ("connector_admin_", "connector_legacy_", "connector_retention_"),
    "executor": (),
}


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_each_endpoint_is_clean_and_exports_only_its_own_families(db_url: str, tmp_path: Path) -> None:
    tools = require_prometheus_tools()
    with running_stack(db_url, tmp_path) as stack, psycopg.connect(db_url, autocommit=True) as conn:
        stack.load(conn, n=10, refused=2)
        stack.post("x", bad_signature=True)
        stack.health_checks()
        # a delivery to a path that is no installed route: counted under one collapsed label value
        for path in ("stranger-ns/route-a", "bench/not-a-route"):
            assert stack.post_path(path) == 404
        texts = {s: scrape(stack.metrics[s]) for s in SERVICES}
        # the sampler has published its gauges at least once
        # the stats sampler has published the probe's retry-waiting item (state, not time)
        sampled = re.compile(
            r'^connector_executor_queue_depth\{[^}]*pack="metrics-probe"[^}]*state="retry"', re.M
        )
        deadline = time.monotonic() + 60
        while not sampled.search(texts["executor"]) or (
            "connector_executor_active_claimants 1.0" not in texts["executor"]
        ):
            assert time.monotonic() < deadline, "the executor's stats sampler never published"
            time.sleep(0.2)
            texts["executor"] = scrape(stack.metrics["executor"])

    documented = (ROOT / "docs" / "metrics.md").read_text()
    for service, text in texts.items():
        res = subprocess.run(
            [tools["promtool"], "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
        )
        assert res.returncode == 0, f"promtool check metrics ({service}): {res.stdout}{res.stderr}"
        assert not (res.stdout + res.stderr).strip(), (
            f"promtool check metrics ({service}): {res.stdout}{res.stderr}"
        )

        families = _families(text)
        names = set(families)
        for other in SERVICES:
            if other != service:
                leaked = sorted(n for n in names if n.startswith(OWN_PREFIX[other]))
                assert not leaked, f"{service} exports {other}'s families: {leaked}"
        leaked = sorted(n for n in names if n.startswith(FOREIGN_EXTRA[service]))
        assert not leaked, f"{service} exports families that are not its own: {leaked}"
        assert any(n.startswith(OWN_PREFIX[service]) for n in names), f"{service} exports none of its own"

        info = [s for s in families["connector_build_info"].samples]
        assert len(info) == 1 and set(info[0].labels) == {"version", "revision", "python"}, info
        handled = families["grpc_server_handled"].samples
        assert handled, f"{service}: no gRPC server samples after a health check"
        assert {"grpc_type", "grpc_service", "grpc_method", "grpc_code"} == set(handled[0].labels)
        pools = [s for s in families["connector_db_pool_size"].samples]
        pool_services = {s.labels["service"] for s in pools}
        assert service in pool_services, pools  # plus its second pools (executor-admin), nobody else's
        assert all(p == service or p.startswith(f"{service}-") for p in pool_services), pools

        for name in names:
            if name.startswith(("connector_", "grpc_server_")):
                assert f"`{name}" in documented, f"{name} ({service}) is not in docs/metrics.md"

    ingress = _families(texts["ingress"])
    routes = {
        (s.labels["namespace"], s.labels["route"], s.labels["outcome"]): s.value
        for s in ingress["connector_ingress_route_deliveries"].samples
    }
    assert routes[("bench", "events", "accepted")] >= 10, routes
    assert routes[("bench", "events", "rejected")] >= 3, routes
    assert routes[("_unknown", "_unknown", "rejected")] >= 2, routes  # strangers' paths: one value
    assert {(ns, r) for ns, r, _ in routes} == {
        ("bench", "events"),
        ("probe", "events"),
        ("_unknown", "_unknown"),
    }

    executor = _families(texts["executor"])
    outcome_packs = {s.labels["pack"] for s in executor["connector_executor_outcomes"].samples}
    assert outcome_packs == {"bench-e2e", "metrics-probe"}, outcome_packs  # the name, never the numeric id
    depth = {
        (s.labels["pack"], s.labels["state"]): s.value
        for s in executor["connector_executor_queue_depth"].samples
    }
    assert depth.get(("metrics-probe", "retry")) == 1, depth
    failures = {
        (s.labels["pack"], s.labels["work_type"], s.labels["failure_class"]): s.value
        for s in executor["connector_executor_failures"].samples
    }
    assert failures.get(("metrics-probe", "fail", "probe_invalid")) == 1, failures
    runs = [
        s
        for s in executor["connector_executor_handler_seconds"].samples
        if s.name.endswith("_count") and s.labels == {"pack": "bench-e2e", "work_type": "noop"}
    ]
    assert runs and runs[0].value >= 10, runs
    # The seed's proof metrics, asserted (issue #28 item 6): claim latency observed once per claim
    # statement, executor concurrency (slots, slots in use) exported within bounds, the retry rate
    # counting the probe's retrying item.
    value = {s.name + repr(sorted(s.labels.items())): s.value for f in executor.values() for s in f.samples}
    claim_count = value["connector_executor_claim_seconds_count[]"]
    claims = sum(s.value for s in executor["connector_executor_claim_statements"].samples)
    assert claim_count >= 1 and claim_count == claims, (claim_count, claims)
    assert value["connector_executor_claim_seconds_sum[]"] > 0
    slots = value["connector_executor_slots[]"]
    assert slots >= 1 and 0 <= value["connector_executor_slots_in_use[]"] <= slots
    retries = {
        s.labels["pack"]: s.value
        for s in executor["connector_executor_outcomes"].samples
        if s.labels["state"] == "retry"
    }
    assert retries.get("metrics-probe", 0) >= 1, retries
    assert re.search(
        r"^connector_materializer_receipts_total\{outcome=\"materialized\"\} (\d+)",
        texts["materializer"],
        re.M,
    )


def test_one_process_running_all_services_keeps_the_registries_apart() -> None:
    """``connector up`` imports every service into one process: each registry still holds only its
    own service's families (and its own samples of the shared pool families)."""
    from prometheus_client import generate_latest

    import connector.executor.admin.auth  # noqa: F401  (registers the admin families)
    import connector.executor.metrics as executor_metrics
    import connector.ingress.metrics as ingress_metrics
    import connector.materializer.metrics as materializer_metrics
    from connector.common.core import metrics as common
    from connector.common.core.grpc_server import GRPC_METRICS

    registries = {
        "ingress": ingress_metrics.REGISTRY,
        "materializer": materializer_metrics.REGISTRY,
        "executor": executor_metrics.REGISTRY,
    }
    for service in SERVICES:
        GRPC_METRICS(service).handled.labels("unary", "x.v1.S", "M", "OK").inc()
        assert common.registry(service) is registries[service]
    for service, reg in registries.items():
        names = {f.name for f in text_string_to_metric_families(generate_latest(reg).decode())}
        for other in SERVICES:
            if other != service:
                assert not [n for n in names if n.startswith(OWN_PREFIX[other])], (service, other)
        assert not [n for n in names if n.startswith(FOREIGN_EXTRA[service])], service
        assert "connector_build_info" in names and "grpc_server_handled" in names, service


def test_fast_histogram_exports_what_a_prometheus_client_histogram_exports() -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from connector.common.core.metrics import LATENCY_BUCKETS, FastHistogram

    values = [0.0, 0.00025, 0.0003, 0.001, 0.0049, 0.2, 2.5, 9.99, 10.0, 11.0, 1e6]
    fast_reg, ref_reg = CollectorRegistry(), CollectorRegistry()
    fast = FastHistogram("h_seconds", "doc", ("pack", "work_type"), LATENCY_BUCKETS, fast_reg)
    ref = Histogram("h_seconds", "doc", ["pack", "work_type"], buckets=LATENCY_BUCKETS, registry=ref_reg)
    for v in values:
        fast.labels("p", "w").observe(v)
        ref.labels("p", "w").observe(v)
    fast.labels("q", "w").observe(0.5)
    ref.labels("q", "w").observe(0.5)

    def samples(reg: CollectorRegistry) -> set[tuple]:
        return {
            (s.name, tuple(sorted(s.labels.items())), round(s.value, 9))
            for f in text_string_to_metric_families(generate_latest(reg).decode())
            for s in f.samples
            if not s.name.endswith("_created")
        }

    assert samples(fast_reg) == samples(ref_reg)
    assert samples(fast_reg)  # not vacuous

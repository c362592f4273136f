"""The rules and the dashboard against a real Prometheus (Debian's ``prometheus`` binary) scraping
the three services as real processes, after a small signed load went through them.

Every recording and alerting expression of deploy/prometheus/rules/ and every query of
deploy/grafana/connector.json is evaluated through Prometheus' HTTP API: none may error, and the
stage-level ones (ingress rate/errors/latency, routing lag and throughput, executor
throughput/latency/errors/saturation, queue depth, pools) must return data. The rule groups must
evaluate without error inside Prometheus, and the dead-letter alert's expression must see the
probe pack's dead letter (a control: the alerts' inputs are really there). Waits on state
(targets up, samples of the load visible, rules evaluated), never on time.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import psycopg
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.metrics_stack import ROOT, SERVICES, require_prometheus_tools, running_stack, scrape, wait_for

pytestmark = pytest.mark.slow

RULES = sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))
DASHBOARD = ROOT / "deploy" / "grafana" / "connector.json"
#: Dashboard panels whose data exists only while their condition does (nothing due, no lane, no
#: routing failure, no loop error in a healthy run): evaluated for errors, not required to have data.
CONDITIONAL_PANELS = {
    "Oldest ready age",
    "Blocked lanes",
    "Routing failures/s by class",
    "Materializer loop errors/s",
}
#: Recording rules of the same kind.
CONDITIONAL_RECORDS = {"connector:executor_oldest_ready_age_seconds:max"}
#: Grafana's variables, as the dashboard's defaults resolve them.
VARIABLES = {"$__rate_interval": "1m", "$pack": ".*"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prom:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> dict:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}" if params else f"{self.base}{path}"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:  # 400/422: the body says why
            return json.loads(exc.read())

    def query(self, expr: str) -> list[dict]:
        res = self.get("/api/v1/query", query=expr)
        assert res.get("status") == "success", f"{expr}: {res.get('errorType')} {res.get('error')}"
        assert not res.get("warnings"), f"{expr}: {res['warnings']}"
        return res["data"]["result"]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False


def _dashboard_queries() -> list[tuple[str, str]]:
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, f"{panel['title']}: unresolved variable in {expr}"
            out.append((panel["title"], expr))
    return out


def _rules() -> list[dict]:
    return [r for path in RULES for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def _value(prom: Prom, expr: str) -> float:
    result = prom.query(expr)
    return float(result[0]["value"][1]) if result else 0.0


def test_every_rule_and_dashboard_query_evaluates_on_real_data(db_url: str, tmp_path: Path) -> None:
    tools = require_prometheus_tools()
    web_port = _free_port()
    with running_stack(db_url, tmp_path) as stack, psycopg.connect(db_url, autocommit=True) as conn:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(p) for p in RULES],
            "scrape_configs": [
                {"job_name": s, "static_configs": [{"targets": [f"127.0.0.1:{stack.metrics[s]}"]}]}
                for s in SERVICES
            ],
        }
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config))
        res = subprocess.run([tools["promtool"], "check", "config", str(cfg)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr
        log = (tmp_path / "prometheus.log").open("wb")
        prom_proc = subprocess.Popen(
            [
                tools["prometheus"],
                f"--config.file={cfg}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{web_port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        prom = Prom(web_port)

        def prom_alive() -> None:
            stack.check_alive()
            assert prom_proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]

        try:
            # A priming load before Prometheus holds samples: a counter series born during the
            # measured load would start at its full value, and rate() never counts a first sample.
            stack.health_checks()
            # A pause of a queue class the probe pack does not use (its load still runs): the paused
            # panel and ConnectorPackPaused's expression get data (the executors' sampler exports it).
            conn.execute(
                "INSERT INTO connector_pause (installed_pack_id, queue_class, actor, reason)"
                " SELECT installed_pack_id, 'metrics-paused', 'test', 'live test'"
                " FROM connector_installed_pack WHERE name = 'metrics-probe'"
            )
            stack.load(conn, n=2, refused=1)
            assert stack.post_path("stranger/path") == 404
            wait_for(prom.ready, "Prometheus to be ready", check=prom_alive)
            # every target scraped successfully a few times before the load
            wait_for(
                lambda: _value(prom, "count(sum_over_time(up[1m]) >= 3)") == len(SERVICES),
                "three successful scrapes of every target",
                check=prom_alive,
            )
            # every active work type's outcome series exist from the start, at zero (the executor's
            # sampler starts them): the probe's "later" items only ever retry, so its dead series is
            # there only because of that (a series born at its first increment shows increase()
            # nothing, and the first dead letters after an executor start would never alert)
            zero = (
                'connector_executor_outcomes_total{pack="metrics-probe",work_type="later",state="dead"} == 0'
            )
            wait_for(lambda: prom.query(zero) != [], "the zero-started outcome series", check=prom_alive)
            stack.health_checks()
            stack.load(conn, n=20, refused=3)
            assert stack.post_path("stranger/path") == 404
            # Prometheus has scraped what the endpoints say now, at least twice (rates need two
            # samples), and the rules have been evaluated on it.
            executed = sum(
                float(m.group(1))
                for m in re.finditer(
                    r'^connector_executor_outcomes_total\{[^}]*state="succeeded"[^}]*\} (\S+)$',
                    scrape(stack.metrics["executor"]),
                    re.M,
                )
            )
            assert executed >= 20
            wait_for(
                lambda: (
                    _value(prom, 'sum(connector_executor_outcomes_total{state="succeeded"})') >= executed
                    and _value(prom, "count_over_time(sum(connector_executor_outcomes_total)[1m:1s])") >= 2
                ),
                "Prometheus to hold the load's samples",
                check=prom_alive,
            )
            # the probe's dead letters (one per load) are counted after their commit: wait until
            # Prometheus holds every one the database has, not only the succeeded ones
            dead_in_db = conn.execute(
                "SELECT count(*) FROM connector_work_item w JOIN connector_installed_pack p"
                " USING (installed_pack_id) WHERE p.name = 'metrics-probe' AND w.state = 'dead'"
            ).fetchone()[0]
            wait_for(
                lambda: (
                    _value(
                        prom,
                        'sum(connector_executor_outcomes_total{pack="metrics-probe",work_type="fail",state="dead"})',
                    )
                    >= dead_in_db
                ),
                "Prometheus to hold the probe's dead letters",
                check=prom_alive,
            )
            wait_for(
                lambda: (
                    _value(prom, "sum(connector:executor_outcomes:rate5m)") > 0
                    and _value(prom, "sum(connector:ingress_deliveries:rate5m)") > 0
                ),
                "the recording rules to be evaluated on the load",
                check=prom_alive,
            )

            # the rule groups evaluate inside Prometheus without error
            groups = prom.get("/api/v1/rules")["data"]["groups"]
            assert {g["name"] for g in groups} == {"connector-recording", "connector-alerts"}
            for g in groups:
                for r in g["rules"]:
                    assert r["health"] != "err", f"{r['name']}: {r.get('lastError')}"

            empty: list[str] = []
            for rule in _rules():
                name = rule.get("record") or rule["alert"]
                result = prom.query(rule["expr"])
                if "record" in rule and name not in CONDITIONAL_RECORDS and not result:
                    empty.append(f"recording rule {name}")
                if "record" in rule and not (name in CONDITIONAL_RECORDS or prom.query(name)):
                    empty.append(f"recorded series {name}")
            for title, expr in _dashboard_queries():
                result = prom.query(expr)
                if title not in CONDITIONAL_PANELS and not result:
                    empty.append(f"panel {title!r}: {expr}")
            assert not empty, "stage-level expressions without data:\n" + "\n".join(empty)

            # control: the alerts' inputs are real: the probe's dead letter is seen, healthy alerts are quiet
            alerts = {r["alert"]: r["expr"] for r in _rules() if "alert" in r}
            dead = prom.query(alerts["ConnectorDeadLetters"])
            assert {(d["metric"]["pack"], d["metric"]["work_type"]) for d in dead} == {
                ("metrics-probe", "fail")
            }
            paused = prom.query(alerts["ConnectorPackPaused"])
            assert {(p["metric"]["pack"], p["metric"]["queue_class"]) for p in paused} == {
                ("metrics-probe", "metrics-paused")
            }
            for quiet in ("ConnectorDueWorkNoClaimant", "ConnectorExecutorsDown", "ConnectorRoutingLagHigh"):
                assert prom.query(alerts[quiet]) == [], quiet
            assert prom.query("group by (pack) (connector_executor_outcomes_total)")  # the $pack variable
        finally:
            prom_proc.terminate()
            try:
                prom_proc.wait(30)
            except subprocess.TimeoutExpired:
                prom_proc.kill()
                prom_proc.wait(10)
            log.close()

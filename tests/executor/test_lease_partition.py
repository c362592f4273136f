"""An executor that knows its lease is gone (issue #26, item 5), with real processes: executor A
reaches PostgreSQL through a TCP proxy process (``tests/support/netfault.py``), executor B directly.

A holds four items — one running in an async handler (30 s of work), three prefetched — when the
proxy stalls (stops forwarding) or its port is black-holed (an iptables DROP both ways): A's
renewals hang on a connection that never answers (no error, no RST). The lease in the database is
what it last was; A measures it on its monotonic clock from before its last claim
or renewal, less the margin (``CONNECTOR_EXECUTOR_LEASE_MARGIN_S``), and at that deadline cancels
the running call and starts none of the others. B reclaims them once they expire in the database
and runs them. Effects go to a file sink (start / cancelled / end, wall time).

Asserted: A's call ended (cancelled) before its lease expired in the database (``lease_until``,
the same host's clock); A started nothing after the partition; B ran all four, each only after A
had stopped it; A counted 1 cancelled and 3 unstarted. Control (``CONNECTOR_TEST_NO_LEASE_WATCH=1``:
the deadline never passes, as before the watch): A's call runs past its lease, overlapping B's.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.executor import effects, seed
from tests.executor.helpers import ExecutorProcess, states, wait_for
from tests.support.netfault import ProxyProcess, blackhole_on

pytestmark = pytest.mark.slow

CONTROLS_DIR = Path(__file__).resolve().parent / "controls"
LEASE_S = 4.0

# Every lease the database granted (claims and renewals), by owner: A's last one is what it had.
_LEASE_LOG = """
CREATE TABLE executor_test_lease (work_id bigint, owner text, lease_until timestamptz);
CREATE FUNCTION executor_test_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO executor_test_lease VALUES (NEW.work_id, NEW.lease_owner, NEW.lease_until); RETURN NEW;
END $$;
CREATE TRIGGER executor_test_lease AFTER UPDATE OF lease_until ON connector_work_item FOR EACH ROW
  WHEN (NEW.state = 'processing') EXECUTE FUNCTION executor_test_lease();
"""


def _sink(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def partition(
    db: psycopg.Connection, db_url: str, spawn: Any, sink: Path, control: bool, fault: str = "stall"
) -> dict[str, Any]:
    db.execute(_LEASE_LOG)
    pack = seed.seed_pack(db, "p", {"w": seed.python_work_type(f"{effects.__name__}:sleep_and_sink")})
    info = conninfo_to_dict(db_url)
    proxy = ProxyProcess(int(info.get("port") or 5432), str(info.get("host") or "127.0.0.1")).start()
    try:
        via_proxy = db_url.replace(f"{info['host']}:{info.get('port') or 5432}", f"127.0.0.1:{proxy.port}", 1)
        assert via_proxy != db_url
        common = {"EXECUTOR_TEST_SINK": str(sink), "CONNECTOR_EXECUTOR_LEASE_S": str(LEASE_S)}
        env_a = {
            **common,
            "EXECUTOR_TEST_SLEEP_S": "30",
            "CONNECTOR_EXECUTOR_WORKERS": "1",
            "CONNECTOR_EXECUTOR_CLAIM_BATCH": "4",
            "CONNECTOR_EXECUTOR_PREFETCH": "3",
        }
        if control:
            env_a["CONNECTOR_TEST_NO_LEASE_WATCH"] = "1"
            env_a["PYTHONPATH"] = os.pathsep.join([str(CONTROLS_DIR), os.environ.get("PYTHONPATH", "")])
        ids = seed.seed_items(db, pack, 4)
        env_a["CONNECTOR_DATABASE_URL"] = via_proxy
        a: ExecutorProcess = spawn(extra_env=env_a)
        a_id = a.wait_registered(db)
        wait_for(
            lambda: (
                db.execute(
                    "SELECT count(*) FROM connector_work_item"
                    " WHERE state = 'processing' AND lease_owner = %s",
                    (a_id,),
                ).fetchone()[0]
                == 4
                and any(e["phase"] == "start" for e in _sink(sink))
            ),
            20,
            "A holds four items and runs one",
        )
        if fault == "blackhole":  # A's packets dropped both ways (iptables): a host gone silent
            blackhole_on(proxy.port)
        else:  # the proxy stops forwarding: a server that never answers
            proxy.stall()
        stalled_at = db.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]
        b = spawn(extra_env={**common, "EXECUTOR_TEST_SLEEP_S": "0.2"})
        b.wait_registered(db)
        wait_for(lambda: states(db).get("succeeded", 0) == 4, 60, "B finished all four")
        # The leases A held, as the database had them (nothing of A's reached it since the stall).
        ends = dict(
            db.execute(
                "SELECT work_id, extract(epoch FROM max(lease_until))::float8 FROM executor_test_lease"
                " WHERE owner = %s GROUP BY 1",
                (a_id,),
            ).fetchall()
        )
        if not control:
            wait_for(lambda: a.metric("connector_executor_lease_expired_local_total") >= 4, 20, "A's count")
        return {
            "ids": ids,
            "a_pid": a.pid,
            "b_pid": b.pid,
            "stalled_at": stalled_at,
            "lease_until": ends,
            "sink": _sink(sink),
            "expired": {
                w: a.metric("connector_executor_lease_expired_local_total", {"what": w})
                for w in ("unstarted", "cancelled", "uncancellable")
            },
            "a": a,
        }
    finally:
        proxy.stop()


def _a_violations(run: dict[str, Any]) -> dict[str, list[Any]]:
    """What A did after its lease was gone, and where B overlapped A."""
    sink, a_pid, b_pid = run["sink"], run["a_pid"], run["b_pid"]
    past_lease = [
        e
        for e in sink
        if e["pid"] == a_pid and e["phase"] != "start" and e["wall"] > run["lease_until"][e["work_id"]]
    ]
    late_starts = [
        e for e in sink if e["pid"] == a_pid and e["phase"] == "start" and e["wall"] > run["stalled_at"]
    ]
    a_stop = {e["work_id"]: e["wall"] for e in sink if e["pid"] == a_pid and e["phase"] != "start"}
    a_start = {e["work_id"] for e in sink if e["pid"] == a_pid and e["phase"] == "start"}
    running = [w for w in a_start if w not in a_stop]
    overlap = [
        e
        for e in sink
        if e["pid"] == b_pid
        and e["phase"] == "start"
        and e["work_id"] in a_start
        and (e["work_id"] not in a_stop or e["wall"] < a_stop[e["work_id"]])
    ]
    return {
        "past_lease": past_lease,
        "late_starts": late_starts,
        "overlap": overlap,
        "running": running,
    }


@pytest.mark.parametrize("fault", ["stall", "blackhole"])
def test_a_partitioned_executor_stops_its_calls_before_its_lease_expires(
    db, db_url, spawn, tmp_path, fault: str
) -> None:
    run = partition(db, db_url, spawn, tmp_path / "sink", control=False, fault=fault)
    bad = _a_violations(run)
    a_runs = [e for e in run["sink"] if e["pid"] == run["a_pid"]]
    assert [e["phase"] for e in a_runs] == ["start", "cancelled"], a_runs  # one call, cancelled
    cancelled = a_runs[1]
    ahead = run["lease_until"][cancelled["work_id"]] - cancelled["wall"]
    print(
        f"\n  A cancelled its call {ahead:.2f} s before its lease expired in the database"
        f" ({run['stalled_at'] and cancelled['wall'] - run['stalled_at']:.2f} s after the stall)"
    )
    assert not bad["past_lease"] and not bad["late_starts"] and not bad["overlap"], bad
    b_done = {e["work_id"] for e in run["sink"] if e["pid"] == run["b_pid"] and e["phase"] == "end"}
    assert b_done == set(run["ids"])  # B ran all four, after A had stopped
    assert run["expired"] == {"unstarted": 3, "cancelled": 1, "uncancellable": 0}


def test_control_without_the_lease_watch_a_runs_past_its_lease(db, db_url, spawn, tmp_path) -> None:
    run = partition(db, db_url, spawn, tmp_path / "sink", control=True)
    bad = _a_violations(run)
    assert bad["overlap"] or bad["running"], bad  # A's call still runs while B runs the same item
    run["a"].signal(signal.SIGKILL)

"""Circuit breakers across real executor processes (docs/adr/013-circuit-breakers.md): two
``connector executor`` processes x 16 workers call one HTTP target (a server in this test) for a
pack with a breaker and for a control pack without one, at the same time. The target answers 503
until the test brings it back.

Every claim is logged by a test trigger on ``connector_work_item`` (each move to ``processing``,
at the claim's database time) and every state change of the circuit by a trigger on
``connector_circuit``. While the circuit is not closed — from its first open to its close after
the target recovered — the pack's claims are the half-open probes only: at most
``half_open_probes`` per half-open phase (each phase ends with its first probe's outcome). No
attempt is spent waiting (attempts = claims per item). The control pack's claims in the same
interval, against the same failing target, are far above that bound (so the check can fail).
Then a manual open (the store's ``circuit_set``, what OpenCircuit calls) stops the claims of the
pack's new items until the manual close.
"""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest

from connector.common.store import circuits
from tests.executor import seed
from tests.executor.helpers import states, wait_for

pytestmark = pytest.mark.slow

PROBES = 2
POLICY = {"consecutive_failures": 5, "open_s": 1.0, "half_open_probes": PROBES}
N = 300

LOGS = """
CREATE TABLE test_claim_log (work_id bigint, pack bigint, at timestamptz);
CREATE FUNCTION test_claim_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO test_claim_log VALUES (NEW.work_id, NEW.installed_pack_id, NEW.started_at);
  RETURN NULL;
END $$;
CREATE TRIGGER test_claim_log AFTER UPDATE OF state ON connector_work_item FOR EACH ROW
  WHEN (NEW.state = 'processing' AND OLD.state <> 'processing') EXECUTE FUNCTION test_claim_log();
CREATE TABLE test_circuit_log (state text, forced boolean, at timestamptz);
CREATE FUNCTION test_circuit_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO test_circuit_log VALUES (NEW.state, NEW.forced, clock_timestamp());
  RETURN NULL;
END $$;
CREATE TRIGGER test_circuit_log AFTER UPDATE OF state ON connector_circuit FOR EACH ROW
  WHEN (NEW.state IS DISTINCT FROM OLD.state) EXECUTE FUNCTION test_circuit_log();
"""


class Target:
    """An HTTP target that answers 503 while ``down`` and 200 otherwise (a thread of this test)."""

    def __init__(self) -> None:
        self.down = True
        self.calls = 0
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target.calls += 1
                self.send_response(503 if target.down else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    @property
    def key(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def target() -> Any:
    t = Target()
    yield t
    t.close()


def _work_type(url: str, breaker: bool) -> dict[str, Any]:
    wt: dict[str, Any] = {
        "handler": {"kind": "http", "target": url, "timeout_s": 5},
        "retry": {"max_attempts": 1000, "backoff_base_s": 0.05, "backoff_cap_s": 0.2, "jitter": 0.5},
    }
    if breaker:
        wt["circuit_breaker"] = POLICY
    return wt


def _claims(db: psycopg.Connection, pack: int, after: float, before: float) -> int:
    return int(
        db.execute(
            """SELECT count(*) FROM test_claim_log WHERE pack = %s
                 AND at > to_timestamp(%s) AND at < to_timestamp(%s)""",
            (pack, after, before),
        ).fetchone()[0]  # type: ignore[index]
    )


def _transitions(db: psycopg.Connection) -> list[tuple[str, bool, float]]:
    rows = db.execute(
        "SELECT state, forced, extract(epoch FROM at)::float8 FROM test_circuit_log ORDER BY at"
    )
    return [(str(r[0]), bool(r[1]), float(r[2])) for r in rows.fetchall()]


async def _set(db_url: str, pack: int, key: str, open_: bool) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        async with conn.transaction():
            assert await circuits.circuit_set(conn, pack, key, open_=open_, actor="test", note="proof")


def test_two_processes_claim_only_probes_while_the_circuit_is_open(db, db_url, spawn, target) -> None:
    db.execute(LOGS)
    pack = seed.seed_pack(db, "breaker", {"w": _work_type(target.url, True)})
    control = seed.seed_pack(db, "control", {"w": _work_type(target.url, False)})
    a = spawn(extra_env={"CONNECTOR_EXECUTOR_POLL_INTERVAL_S": "0.2"})
    b = spawn(extra_env={"CONNECTOR_EXECUTOR_POLL_INTERVAL_S": "0.2"})
    a.wait_registered(db)
    b.wait_registered(db)
    ids = seed.seed_items(db, pack, N, circuit_keys=[target.key] * N, circuit=POLICY, max_attempts=1000)
    seed.seed_items(db, control, N, max_attempts=1000)  # the control retries all through the outage
    db.execute("NOTIFY connector_work")
    # The outage lasts until the circuit has opened three times (it opened, probed and re-opened).
    wait_for(
        lambda: db.execute("SELECT opened_count FROM connector_circuit").fetchone()[0] >= 3,  # type: ignore[index]
        60,
        "the circuit re-opened twice",
    )
    target.down = False
    try:
        wait_for(lambda: states(db).get("succeeded", 0) == 2 * N, 120, f"{2 * N} succeeded")
    except AssertionError:
        print("states", states(db), "circuit", db.execute("SELECT * FROM connector_circuit").fetchall())
        print("transitions", _transitions(db)[-10:])
        left = db.execute(
            """SELECT installed_pack_id, state, count(*), min(run_after - now()), max(run_after - now()),
                      max(attempts)
               FROM connector_work_item WHERE state <> 'succeeded' GROUP BY 1, 2"""
        )
        print(left.fetchall())
        print(a.log_tail(), b.log_tail())
        raise
    log = _transitions(db)
    first_open = next(t for s, _, t in log if s == "open")
    closed = [t for s, _, t in log if s == "closed" and t > first_open]
    assert closed, log  # it closed once the target answered again (a probe succeeded)
    close_at = closed[0]
    half_open_phases = sum(1 for s, _, t in log if s == "half_open" and first_open < t < close_at)
    assert half_open_phases >= 2, log
    bound = half_open_phases * PROBES
    got = _claims(db, pack, first_open, close_at)
    assert got <= bound, f"{got} claims while the circuit was not closed (probes allowed: {bound}); {log}"
    # No attempt was spent waiting: every attempt is a logged claim.
    attempts, claims = db.execute(
        """SELECT (SELECT sum(attempts) FROM connector_work_item WHERE work_id = ANY(%(ids)s)),
                  (SELECT count(*) FROM test_claim_log WHERE work_id = ANY(%(ids)s))""",
        {"ids": ids},
    ).fetchone()  # type: ignore[misc]
    assert attempts == claims
    held = a.metric("connector_executor_rate_limited_total") + b.metric(
        "connector_executor_rate_limited_total"
    )
    assert held > 0  # the claims held the target's items back
    # Control: the same target, the same outage, no breaker: claims go on all along.
    ctl = _claims(db, control, first_open, close_at)
    print(f"outage {close_at - first_open:.1f}s: breaker {got} claims (bound {bound}), control {ctl}")
    assert ctl > 5 * max(bound, 10)
    assert db.execute("SELECT state FROM connector_circuit").fetchone()[0] == "closed"  # type: ignore[index]

    # Manual open: the pack's new items wait (deferred, no attempt) until the manual close.
    asyncio.run(_set(db_url, pack, target.key, True))
    opened_at = _transitions(db)[-1][2]
    more = seed.seed_items(db, pack, 50, circuit_keys=[target.key] * 50, circuit=POLICY, max_attempts=1000)
    db.execute("NOTIFY connector_work")
    wait_for(
        lambda: (
            db.execute(
                """SELECT count(*) FROM connector_work_item WHERE work_id = ANY(%s)
                 AND run_after > now() AND attempts = 0""",
                (more,),
            ).fetchone()[0]  # type: ignore[index]
            == 50
        ),
        30,
        "the new items deferred by the forced open",
    )
    asyncio.run(_set(db_url, pack, target.key, False))
    closed_at = _transitions(db)[-1][2]
    assert _claims(db, pack, opened_at, closed_at) == 0
    wait_for(lambda: states(db).get("succeeded", 0) == 2 * N + 50, 60, "the new items succeeded")
    assert a.stop() == 0 and b.stop() == 0

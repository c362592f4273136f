"""Cheap guards that make the contract executable (issue #28 item 6).

* **No scheduler lease on the WorkItem claim path** (seed: "no ``ConnectorSchedulerLease`` predicate
  or lifecycle in the … WorkItem claim path"). Every statement a real WorkItem executor sends while it
  claims, renews, finishes, retries, dead-letters, settles a lane and reclaims an expired lease is
  captured at the psycopg cursor, and each is checked twice: its SQL text never names
  ``connector_scheduler_lease``, and its ``EXPLAIN`` plan (the captured parameters, in a rolled-back
  transaction) reads no such relation — a view or any other indirection over the lease table shows in
  the plan even when the text hides it. Controls, with the same scenario: a lease predicate planted in
  the plain claim statement is reported by both checks; the same predicate behind a view
  (``cutover_test_claim_guard``) is reported by the plan check alone.
* **No provider branch in the runtime** (seed: "must not branch on HubSpot, CRM object names …"):
  no code under ``services/`` or ``libs/`` compares against, matches on, or looks up by a provider
  name or preset name (presets are data: the ``PRESETS`` dictionaries themselves are not branches).
  Control: planted branches (``==``, ``in``, ``match``, ``startswith``, a keyed lookup) are caught.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from connector.common.packs import reconcile, verification
from connector.common.store import work_items

from .conftest import Rig, wait_until

ROOT = Path(__file__).resolve().parents[2]
LEASE_TABLE = "connector_scheduler_lease"
#: Utility statements have no plan (EXPLAIN refuses them); their text is still checked.
UTILITY = ("SET", "RESET", "LISTEN", "UNLISTEN", "NOTIFY", "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT",
           "RELEASE", "VACUUM", "ANALYZE", "SHOW", "DISCARD")  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Statements of the WorkItem claim path
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def captured(exclude: list[Any]) -> Iterator[list[tuple[str, Any]]]:
    """Every (query, params) sent through a psycopg async cursor meanwhile, except on the
    connections in ``exclude`` (the test's own)."""
    seen: list[tuple[str, Any]] = []
    originals = {
        (psycopg.AsyncCursor, "execute"): psycopg.AsyncCursor.execute,
        (psycopg.AsyncCursor, "executemany"): psycopg.AsyncCursor.executemany,
        (psycopg.AsyncServerCursor, "execute"): psycopg.AsyncServerCursor.execute,
    }

    def wrap(cls: type) -> Any:
        original = originals[(cls, "execute")]

        async def recording(self: Any, query: Any, params: Any = None, *args: Any, **kw: Any) -> Any:
            if self.connection not in exclude:
                seen.append((query if isinstance(query, str) else query.as_string(self.connection), params))
            return await original(self, query, params, *args, **kw)

        return recording

    async def recording_many(self: Any, query: Any, params_seq: Any, *args: Any, **kw: Any) -> Any:
        if self.connection not in exclude:
            params_seq = list(params_seq)
            text = query if isinstance(query, str) else query.as_string(self.connection)
            seen.append((text, params_seq[0] if params_seq else None))
        return await originals[(psycopg.AsyncCursor, "executemany")](self, query, params_seq, *args, **kw)

    psycopg.AsyncCursor.execute = wrap(psycopg.AsyncCursor)  # type: ignore[method-assign]
    psycopg.AsyncCursor.executemany = recording_many  # type: ignore[method-assign]
    psycopg.AsyncServerCursor.execute = wrap(psycopg.AsyncServerCursor)  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        for (cls, name), fn in originals.items():
            setattr(cls, name, fn)


async def claim_path_statements(rig: Rig) -> dict[str, Any]:
    """Run a real WorkItem executor over every claim-path transition; its distinct statements."""
    await rig.install(max_attempts=2, lanes={"target_serialization": True})
    modes = ("ok", "ok", "retry_once", "fail", "slow", "ok", "ok")
    await rig.deliver(*modes, object_ids=[f"o{i}" for i in range(len(modes))],
                      targets=["T1", "T1", "T2", "T3", "T4", "T4", "T5"])  # fmt: skip
    # One item held by a holder that died: the executor's reclaim takes it back.
    (held,) = await work_items.claim.work_item_claim_batch(
        rig.conn, [rig.pack], ["default"], [1], owner="dead-holder", lease_s=30
    )
    await rig.conn.execute(
        "UPDATE connector_work_item SET lease_until = clock_timestamp() - interval '1 second'"
        " WHERE work_id = %s",
        (held[0],),
    )
    with captured(exclude=[rig.conn]) as seen:
        wi = await rig.work_item_executor(lease_s=1.5, reclaim_interval_s=0.2)
        await wait_until(
            lambda: rig.scalar(
                "SELECT count(*) = 0 FROM connector_work_item WHERE installed_pack_id = %s"
                " AND state NOT IN ('succeeded', 'dead')",
                (rig.pack,),
            ),
            timeout=60,
            what="every item finished",
        )
        await rig.stop(wi)
    states = dict(
        await rig.rows(
            "SELECT state, count(*) FROM connector_work_item WHERE installed_pack_id = %s GROUP BY 1",
            (rig.pack,),
        )
    )
    assert states == {"succeeded": len(modes) - 1, "dead": 1}, states
    reclaimed = await rig.scalar(
        "SELECT attempts FROM connector_work_item WHERE work_id = %s AND state = 'succeeded'", (held[0],)
    )
    assert reclaimed is not None, "the expired lease was reclaimed and its item finished"
    distinct: dict[str, Any] = {}
    for text, params in seen:
        distinct.setdefault(text, params)
    return distinct


def _relations(plan: Any) -> Iterator[str]:
    if isinstance(plan, dict):
        if "Relation Name" in plan:
            yield str(plan["Relation Name"])
        for v in plan.values():
            yield from _relations(v)
    elif isinstance(plan, list):
        for v in plan:
            yield from _relations(v)


async def lease_mentions(url: str, statements: dict[str, Any]) -> list[tuple[str, str]]:
    """``(check, statement head)`` for every statement whose text or plan touches the lease table."""
    found: list[tuple[str, str]] = []
    async with await psycopg.AsyncConnection.connect(url) as conn:
        for text, params in statements.items():
            head = " ".join(text.split())[:120]
            if LEASE_TABLE in text.lower():
                found.append(("text", head))
            first = text.lstrip().split(None, 1)[0].upper() if text.strip() else ""
            if first in UTILITY:
                continue
            async with conn.transaction(force_rollback=True):
                cur = await conn.execute("EXPLAIN (FORMAT JSON) " + text, params)
                row = await cur.fetchone()
            assert row is not None
            plan = row[0] if not isinstance(row[0], str) else json.loads(row[0])
            if LEASE_TABLE in set(_relations(plan)):
                found.append(("plan", head))
    return found


async def test_no_claim_path_statement_touches_the_scheduler_lease(rig: Rig) -> None:
    statements = await claim_path_statements(rig)
    claims = [
        t for t in statements if "UPDATE connector_work_item w" in t and "SET state = 'processing'" in t
    ]
    assert claims, "the claim statement was captured"
    explained = [t for t in statements if t.lstrip().split(None, 1)[0].upper() not in UTILITY]
    assert len(explained) >= 10, sorted(statements)  # claim, renew, finalize, retry, dead, lanes, reclaim…
    assert await lease_mentions(rig.url, statements) == []


PLANTED = (
    "AND a.cutover_receipt_id IS NOT NULL",
    "AND a.cutover_receipt_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {relation} s"
    " WHERE s.installed_pack_id = a.installed_pack_id AND s.lease_until > clock_timestamp())",
)


@pytest.mark.parametrize("relation", ["connector_scheduler_lease", "cutover_test_claim_guard"])
async def test_a_planted_lease_predicate_is_caught(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, relation: str
) -> None:
    """Control: the claim statement with a scheduler-lease predicate, named (text and plan report it)
    or behind a view (only the plan does)."""
    await rig.conn.execute(
        "CREATE VIEW cutover_test_claim_guard AS SELECT installed_pack_id, lease_until"
        " FROM connector_scheduler_lease"
    )
    old, new = PLANTED
    planted = work_items.claim.WORK_ITEM_CLAIM_PLAIN_BATCH.replace(old, new.format(relation=relation))
    assert planted != work_items.claim.WORK_ITEM_CLAIM_PLAIN_BATCH
    monkeypatch.setattr(work_items.claim, "WORK_ITEM_CLAIM_PLAIN_BATCH", planted)
    statements = await claim_path_statements(rig)
    found = await lease_mentions(rig.url, statements)
    checks = {check for check, _ in found}
    assert checks == ({"text", "plan"} if relation == LEASE_TABLE else {"plan"}), found
    assert all("UPDATE connector_work_item w" in head or "WITH auth" in head for _, head in found), found


# --------------------------------------------------------------------------------------------------
# No provider branch in services/ or libs/
# --------------------------------------------------------------------------------------------------


def provider_names() -> set[str]:
    """Every preset name and the provider it names (``github-sha1`` → ``github``), plus the
    contract's own example; ``standard-webhooks`` is a standard, not a provider, but still a preset."""
    presets = set(verification.PRESETS) | set(reconcile.REDELIVERY_PRESETS)
    presets |= set(getattr(reconcile, "RECONCILE_PRESETS", {}))
    stems = {p.split("-")[0] for p in presets} - {"standard"}
    return {n.lower() for n in presets | stems | {"hubspot"}}


def _names_in(node: ast.AST, pattern: re.Pattern[str]) -> list[str]:
    """Provider names in the string constants directly in ``node`` (a literal, or a tuple/list/set
    of literals)."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [
        m.group(0)
        for item in items
        if isinstance(item, ast.Constant) and isinstance(item.value, str)
        for m in [pattern.search(item.value)]
        if m
    ]


def provider_branches(source: str, filename: str, names: set[str]) -> list[str]:
    """``file:line what`` for every branch on a provider name: a comparison or ``match`` case against
    one, a ``startswith``/``endswith`` of one, or a lookup keyed by one (``x["stripe"]``,
    ``x.get("stripe")``)."""
    pattern = re.compile(
        r"(?<![a-z0-9])(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")(?![a-z0-9])",
        re.IGNORECASE,
    )
    out: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        hits: list[str] = []
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                hits += _names_in(operand, pattern)
        elif isinstance(node, ast.match_case):
            for sub in ast.walk(node.pattern):
                if isinstance(sub, ast.MatchValue):
                    hits += _names_in(sub.value, pattern)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("startswith", "endswith", "get", "__eq__", "pop"):
                for arg in node.args[:1]:
                    hits += _names_in(arg, pattern)
        elif isinstance(node, ast.Subscript):
            hits += _names_in(node.slice, pattern)
        for hit in hits:
            line = node.pattern.lineno if isinstance(node, ast.match_case) else getattr(node, "lineno", 0)
            out.append(f"{filename}:{line} {type(node).__name__} on {hit!r}")
    return out


def test_no_code_under_services_or_libs_branches_on_a_provider() -> None:
    names = provider_names()
    assert {"stripe", "github", "hubspot", "shopify", "svix"} <= names
    files = sorted(p for d in ("services", "libs") for p in (ROOT / d).rglob("*.py"))
    assert len(files) > 100
    found = [
        hit
        for path in files
        for hit in provider_branches(path.read_text(), str(path.relative_to(ROOT)), names)
    ]
    assert found == [], "branch on preset data, never on a provider's name:\n" + "\n".join(found)


PLANTED_BRANCHES = """
PRESETS = {"stripe": {"algorithm": "sha256"}}          # data: allowed
def verify(spec, headers, provider):
    if spec.preset == "stripe":                         # 1
        pass
    if provider in ("github", "gitlab"):                # 2
        pass
    match spec.preset:
        case "shopify-v2": pass                         # 3 (not a preset, but names shopify)
    if headers.get("X-HubSpot-Signature-v3"):           # 4
        pass
    if spec.name.lower().startswith("svix"):            # 5
        pass
    return PRESETS["stripe"]                            # 6
"""


def test_a_planted_provider_branch_is_caught() -> None:
    """Control: six planted branches are found, the preset dictionary is not."""
    found = provider_branches(PLANTED_BRANCHES, "planted.py", provider_names())
    lines = sorted(int(f.split(":")[1].split()[0]) for f in found)
    assert lines == [4, 6, 9, 10, 12, 14], found  # the six planted branches, one each
    assert 2 not in lines, "the PRESETS data dictionary is not a branch"

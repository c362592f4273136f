"""The transition protocol shared by every gate: results and refusals, the lock (pack row, then the
authority row ``FOR UPDATE``: waits for every claim transaction in flight), the authority move with
its notifications, and the receipt that binds a proof (docs/adr/007-cutover.md).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from psycopg import AsyncConnection

from connector.common.core.refusal import Refused
from connector.common.packs.manifest import sha256_hex
from connector.common.store import authority as store
from connector.common.store import migrate, work_items

Conn = AsyncConnection[Any]

log = logging.getLogger("connector.executor.cutover")

#: Longest a transition waits for claim transactions in flight before answering "retry".
LOCK_TIMEOUT = "15s"
#: Cutover and rollback-complete run backfill and coverage checks over a whole generation.
TRANSITION_STATEMENT_TIMEOUT = "600s"
#: How many ids a blocker's message names.
SAMPLE = 10


class CutoverError(Refused):
    """A transition that does not apply. ``reason``: ``not_found`` (pack, generation or authority),
    ``wrong_phase`` (the generation is not in a phase this transition starts from)."""


@dataclass(frozen=True, slots=True)
class Blocker:
    """One reason a gate refuses: a stable ``code``, how many rows/processes, and what to do."""

    code: str
    count: int
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "count": self.count, "message": self.message}


class CutoverBlocked(Exception):
    """The gate's proof found gaps; nothing was changed (fail closed)."""

    def __init__(self, action: str, blockers: list[Blocker]) -> None:
        super().__init__(
            f"{action} blocked: " + "; ".join(f"{b.code} ({b.count}): {b.message}" for b in blockers)
        )
        self.action = action
        self.blockers = blockers


@dataclass(slots=True)
class Transition:
    installed_pack_id: int
    generation: int
    action: str
    claim_path: str
    phase: str
    version: int
    #: False when the generation already was where the transition leads (idempotent repeat).
    changed: bool
    receipt_id: int | None = None
    receipt_kind: str | None = None
    fence_id: int | None = None
    fenced_work_items: int = 0
    proof: dict[str, Any] | None = None
    proof_sha256: str | None = None
    #: Only for dry runs: what would block (a real run raises ``CutoverBlocked`` instead).
    blockers: list[Blocker] = field(default_factory=list)
    dry_run: bool = False


@lru_cache(maxsize=1)
def expected_schema_revision() -> str:
    """The Alembic head this code was built against (the claim schema a receipt binds)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(migrate.alembic_config("")).get_current_head()
    return str(head)


async def generation_resolve(conn: Conn, installed_pack_id: int, generation: int | None) -> int:
    """``generation``, or the pack's active generation when ``None``/0."""
    if generation:
        return generation
    exists, active = await store.pack_active_generation(conn, installed_pack_id)
    if not exists:
        raise CutoverError("not_found", f"pack {installed_pack_id} not found")
    if active is None:
        raise CutoverError("not_found", f"pack {installed_pack_id} has no active generation; name one")
    return active


@dataclass(slots=True)
class Locked:
    """A generation locked for a transition (inside the caller's transaction)."""

    pack_name: str
    authority: dict[str, Any]
    lock_wait_ms: float
    params: dict[str, Any]

    @property
    def pack(self) -> int:
        return int(self.params["pack"])

    @property
    def generation(self) -> int:
        return int(self.params["generation"])


async def lock(conn: Conn, pack: int, generation: int, *, long: bool = False) -> Locked:
    """Inside the caller's transaction: pack row, then authority row, ``FOR UPDATE``."""
    await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    if long:
        await conn.execute(f"SET LOCAL statement_timeout = '{TRANSITION_STATEMENT_TIMEOUT}'")
    params = {"pack": pack, "generation": generation}
    t0 = time.monotonic()
    pack_row = await store.pack_lock(conn, params)
    if pack_row is None:
        raise CutoverError("not_found", f"pack {pack} not found")
    authority = await store.claim_authority_lock(conn, params)
    waited = (time.monotonic() - t0) * 1000.0
    if authority is None:
        raise CutoverError(
            "not_found", f"pack {pack_row['name']!r} generation {generation} has no claim authority"
        )
    return Locked(str(pack_row["name"]), authority, round(waited, 3), params)


def unchanged(pack: int, generation: int, action: str, authority: dict[str, Any]) -> Transition:
    return Transition(
        installed_pack_id=pack,
        generation=generation,
        action=action,
        claim_path=str(authority["claim_path"]),
        phase=str(authority["phase"]),
        version=int(authority["version"]),
        changed=False,
        receipt_id=authority["cutover_receipt_id"],
        receipt_kind=authority["receipt_kind"],
        fence_id=authority["rollback_fence_id"],
    )


def wrong_phase(locked: Locked, generation: int, action: str, expected: str) -> CutoverError:
    a = locked.authority
    return CutoverError(
        "wrong_phase",
        f"{action}: pack {locked.pack_name!r} generation {generation} is {a['claim_path']}/{a['phase']};"
        f" {action} starts from {expected}",
    )


async def lock_from(
    conn: Conn,
    pack: int,
    generation: int,
    action: str,
    *,
    start: tuple[str, ...],
    expected: str,
    done: str | None,
    refused_as: str | None = None,
    long: bool = False,
) -> Locked | Transition:
    """``lock``, then the check every transition starts with: a generation already in phase ``done``
    is an idempotent repeat (its ``unchanged`` Transition is returned), one not in a ``start`` phase
    is refused ``wrong_phase`` (named ``refused_as``, default ``action``; ``expected`` says where the
    transition starts from)."""
    locked = await lock(conn, pack, generation, long=long)
    phase = locked.authority["phase"]
    if done is not None and phase == done:
        return unchanged(pack, generation, action, locked.authority)
    if phase not in start:
        raise wrong_phase(locked, generation, refused_as or action, expected)
    return locked


def blocked(locked: Locked, action: str, blockers: list[Blocker], dry_run: bool, **kw: Any) -> Transition:
    """A gate whose proof found ``blockers``: a dry run's answer (where the generation stays, what
    blocks), else ``CutoverBlocked`` (nothing changed)."""
    if not dry_run:
        raise CutoverBlocked(action, blockers)
    a = locked.authority
    return Transition(
        locked.pack, locked.generation, action, str(a["claim_path"]), str(a["phase"]), int(a["version"]),
        False, blockers=blockers, dry_run=True, **kw,
    )  # fmt: skip


def previous(authority: dict[str, Any]) -> dict[str, Any]:
    """The ``previous`` section of a receipt's proof: where the generation came from."""
    return {
        "claim_path": authority["claim_path"],
        "phase": authority["phase"],
        "authority_version": authority["version"],
        "admitting_receipt_id": authority["cutover_receipt_id"],
    }


#: ``move``'s default fence: the authority keeps the one it has.
KEEP: Any = object()


async def move(
    conn: Conn,
    locked: Locked,
    action: str,
    *,
    claim_path: str,
    phase: str,
    actor: str,
    receipt: tuple[str, dict[str, Any]] | None = None,
    fence_id: int | None = KEEP,
    fenced_work_items: int = 0,
    dry_run: bool = False,
) -> Transition:
    """The last step of every transition, inside its locked transaction: with ``receipt`` (kind,
    proof), write the receipt binding the proof; then move the authority (under that receipt, or the
    one admitting now) and answer the Transition (a dry run: where it would be, rolled back, and no
    receipt or fence id). ``announce`` logs it after the commit."""
    a = locked.authority
    if receipt is None:
        receipt_id, kind, proof, digest = a["cutover_receipt_id"], a["receipt_kind"], None, None
    else:
        kind, proof = receipt
        receipt_id, digest = await write_receipt(
            conn, locked, kind=kind, claim_path=claim_path, proof=proof, actor=actor
        )
    fence = a["rollback_fence_id"] if fence_id is KEEP else fence_id
    row = await set_authority(
        conn, locked, claim_path=claim_path, phase=phase, receipt_id=receipt_id, fence_id=fence
    )
    return Transition(
        locked.pack, locked.generation, action, row["claim_path"], row["phase"], row["version"], not dry_run,
        receipt_id=None if dry_run else receipt_id, receipt_kind=kind, fence_id=None if dry_run else fence,
        fenced_work_items=fenced_work_items, proof=proof, proof_sha256=digest, dry_run=dry_run,
    )  # fmt: skip


def announce(t: Transition, message: str, actor: str, **extra: Any) -> Transition:
    """One WARNING line for a committed transition (none for a dry run or an idempotent repeat)."""
    if t.changed:
        fields = {"installed_pack_id": t.installed_pack_id, "generation": t.generation, "actor": actor}
        if t.proof is not None:
            fields["receipt_id"] = t.receipt_id
        log.warning(message, extra={**fields, **extra})
    return t


async def set_authority(
    conn: Conn,
    locked: Locked,
    *,
    claim_path: str,
    phase: str,
    receipt_id: int | None,
    fence_id: int | None,
) -> dict[str, Any]:
    """Move the authority and wake every cache and claimer (delivered at commit)."""
    row = await store.claim_authority_set(
        conn,
        {
            **locked.params,
            "claim_path": claim_path,
            "phase": phase,
            "receipt_id": receipt_id,
            "fence_id": fence_id,
        },
    )
    await store.authority_notify(conn)
    await work_items.finalize.work_notify(conn, "authority")
    return row


async def schema_proof(conn: Conn, blockers: list[Blocker]) -> dict[str, Any]:
    """The claim schema the receipt binds: the database's revision must be the code's head."""
    found = await store.alembic_revision(conn)
    expected = expected_schema_revision()
    if found != expected:
        blockers.append(
            Blocker(
                "claim_schema_mismatch",
                1,
                f"database schema revision {found!r} is not the code's head {expected!r}: run"
                " `connector db upgrade` (or deploy the matching release) first",
            )
        )
    return {"alembic_revision": found, "expected": expected}


async def write_receipt(
    conn: Conn,
    locked: Locked,
    *,
    kind: str,
    claim_path: str,
    proof: dict[str, Any],
    actor: str,
) -> tuple[int, str]:
    """The immutable receipt binding ``proof``; ``(receipt id, proof digest)``."""
    digest = sha256_hex(proof)
    receipt_id = await store.cutover_receipt_insert(
        conn,
        pack=locked.pack,
        generation=locked.generation,
        kind=kind,
        claim_path=claim_path,
        proof=proof,
        proof_sha256=digest,
        actor=actor,
    )
    return receipt_id, digest


async def db_now(conn: Conn) -> str:
    return await store.database_now(conn)

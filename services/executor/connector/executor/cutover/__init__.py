"""Cutover and rollback of one pack generation's claim path: the seed's gates 1 to 7 (docs/cutover.md
has the phases, transitions and refusals; docs/adr/007-cutover.md the decisions).

The contract: every transition is one transaction that locks the pack row, then the generation's
``connector_claim_authority`` row ``FOR UPDATE`` (``authority.lock``). Both claim paths' claim
statements join that row ``FOR SHARE`` and admit only in their own active phase, so holding the lock
proves "zero active claim transactions" of the path being stopped (the wait is recorded in the
proof), and every claim transaction that starts after the commit sees the new phase. A transition
whose proof finds a gap changes nothing and raises ``CutoverBlocked`` (fail closed); a dry run
returns the blockers and rolls back.

Wings: ``authority`` (results, the lock, the authority move, receipts), ``proofs`` (what each gate
reads and refuses), ``forward`` (gate 1 quiesce; gates 2, 3, 5 cutover), ``rollback`` (gate 4 and
abort). Statements: ``connector.common.store`` (authority, legacy, work_items, processes).
"""

from connector.executor.cutover.authority import (
    Blocker,
    CutoverBlocked,
    CutoverError,
    Transition,
    expected_schema_revision,
    generation_resolve,
)
from connector.executor.cutover.forward import cutover_complete, legacy_quiesce
from connector.executor.cutover.rollback import (
    legacy_reconcile,
    rollback_begin,
    rollback_complete,
    transition_abort,
)

__all__ = [
    "Blocker",
    "CutoverBlocked",
    "CutoverError",
    "Transition",
    "cutover_complete",
    "expected_schema_revision",
    "generation_resolve",
    "legacy_quiesce",
    "legacy_reconcile",
    "rollback_begin",
    "rollback_complete",
    "transition_abort",
]

"""The legacy Event claim path (``connector executor --claim-path event``): the rollback bridge.

It claims ``connector_event`` rows instead of WorkItems, for **one** pack generation, and only while
that generation's claim authority admits it (``legacy_event``/``legacy_active``, set by a rollback
receipt); a process started for a generation that does not refuses to start (the CLI exits 2).
docs/cutover.md has the rules, docs/adr/007-cutover.md the decisions.

Wings: ``outcomes`` (outcome receipts: projection and operator resolution), ``executor`` (the claim
loop and execution), ``service`` (wiring), ``cli``. Statements: ``connector.common.store.legacy``.
"""

from connector.executor.legacy.cli import cli
from connector.executor.legacy.executor import (
    AMBIGUOUS_FAILURE_CLASSES,
    LegacyConfig,
    LegacyExecutor,
    LegacyNotAdmitted,
)
from connector.executor.legacy.outcomes import (
    LegacyOutcomeError,
    ProjectionReport,
    Resolution,
    legacy_outcome_project,
    legacy_outcome_resolve,
    outcome_digest,
)
from connector.executor.legacy.service import SERVICE, LegacyService, pack_generation_resolve, service_scope

__all__ = [
    "AMBIGUOUS_FAILURE_CLASSES",
    "SERVICE",
    "LegacyConfig",
    "LegacyExecutor",
    "LegacyNotAdmitted",
    "LegacyOutcomeError",
    "LegacyService",
    "ProjectionReport",
    "Resolution",
    "cli",
    "legacy_outcome_project",
    "legacy_outcome_resolve",
    "outcome_digest",
    "pack_generation_resolve",
    "service_scope",
]

"""Tests only: injected bugs for the controls of tests/executor/test_actions.py and others.

Put this directory first on ``PYTHONPATH`` of a child process (``connector executor``):

* ``CONNECTOR_TEST_IGNORE_PAUSE=1``: the claim statement admits the generations of paused packs (the
  pause filter removed from both claim statements) and discovery reports no group as paused —
  what a claim path without the pause check would do;
* ``CONNECTOR_TEST_UNFENCED_CANCEL=1``: the admin API's cancel statement without its fence (no lease
  token, no state condition), and half a second between the call's checks and that statement, so
  that claims land inside the window on a busy machine too (without it the race is too narrow for
  the control to meet reliably).

* ``CONNECTOR_TEST_ADMISSION_IGNORES_PHASE=1``: the executor's claim admission round names every
  generation's admitting receipt whatever its phase (tests/cutover/test_live_gate4.py);
* ``CONNECTOR_TEST_LEGACY_IGNORES_WORK_ITEM_STATE=1``: the legacy executor's work plan takes every
  WorkItem for a fenced one, so it runs work types that finished on the WorkItem path
  (tests/cutover/test_live_paths.py).

* ``CONNECTOR_TEST_LEGACY_CRASH_BEFORE_PROJECTION=1``: the legacy executor is SIGKILLed between an
  Event's committed finalize (state + outcome receipts) and that Event's projection
  (tests/cutover/test_processes.py; this was a fault point read from the environment by the
  executor itself).

* ``CONNECTOR_TEST_DEBOUNCE_NO_LATE=1``: the claim statement without the debounce key's
  ``last_claimed_id`` rule: a retry of an execution that a newer one of its key has overtaken runs
  again instead of being coalesced into the newer one (tests/executor/test_debounce_processes.py).

The proofs must then see the violation they exist to catch.
"""

from __future__ import annotations

import os

if os.environ.get("CONNECTOR_TEST_IGNORE_PAUSE") == "1":
    from connector.common.store import work_items

    _FILTER = "\n                 AND NOT (a.paused_queue_classes && ARRAY['*', g.qc])"
    for _name in ("WORK_ITEM_CLAIM_BATCH", "WORK_ITEM_CLAIM_PLAIN_BATCH", "WORK_ITEM_CLAIM_RATE_BATCH"):
        _q = getattr(work_items.claim, _name)
        assert _FILTER in _q, f"{_name} changed: update the control"
        setattr(work_items.claim, _name, _q.replace(_FILTER, ""))
    work_items.claim.WORK_ITEM_READY_GROUPS = work_items.claim.WORK_ITEM_READY_GROUPS.replace(
        "EXISTS (SELECT 1 FROM connector_pause p", "false AND EXISTS (SELECT 1 FROM connector_pause p"
    )

if os.environ.get("CONNECTOR_TEST_UNFENCED_CANCEL") == "1":
    import asyncio as _asyncio

    from connector.common.store import work_items

    work_items.admin.WORK_ITEM_CANCEL = (
        work_items.admin.WORK_ITEM_CANCEL.split("WHERE")[0]
        + "WHERE w.work_id = %(id)s\nRETURNING w.work_id\n"
    )
    _cancel = work_items.admin.work_item_cancel

    async def _late_cancel(*args, **kwargs):  # type: ignore[no-untyped-def]
        await _asyncio.sleep(0.5)
        return await _cancel(*args, **kwargs)

    work_items.admin.work_item_cancel = _late_cancel

if os.environ.get("CONNECTOR_TEST_DEBOUNCE_NO_LATE") == "1":
    from connector.common.store import work_items

    _RUN = "k.newest >= k.last_claimed_id AND c.work_id = k.newest AS run"
    _LATE = "WHERE k.newest < k.last_claimed_id OR k.newest IN"
    _OLD = "k.newest < k.last_claimed_id"
    assert (
        _RUN in work_items.claim.WORK_ITEM_CLAIM_BATCH and _LATE in work_items.claim.WORK_ITEM_CLAIM_BATCH
    ), "the claim statement changed: update the control"
    work_items.claim.WORK_ITEM_CLAIM_BATCH = (
        work_items.claim.WORK_ITEM_CLAIM_BATCH.replace(_RUN, "c.work_id = k.newest AS run")
        .replace(_LATE, "WHERE k.newest IN")
        .replace(
            "CASE WHEN k.newest < k.last_claimed_id THEN k.last_claimed_id ELSE k.newest END", "k.newest"
        )
        .replace("CASE WHEN k.newest < k.last_claimed_id THEN k.newest + 1 ELSE k.newest END", "k.newest")
    )

if os.environ.get("CONNECTOR_TEST_OLD_IDENTITY") == "1":
    # Identity before issue #26: tokens ``lease_token + 1`` (repeated by a new primary that lost the
    # old one's tail) and the idempotency key ``<event_id>:<work_type>`` (ids reissued likewise).
    from connector.common.store import tokens as _tk
    from connector.common.store.work_items import claim as _cl
    from connector.executor import handlers as _h

    _NEXT = _tk.token_next("w.lease_token")
    for _name in ("WORK_ITEM_CLAIM_BATCH", "WORK_ITEM_CLAIM_PLAIN_BATCH", "WORK_ITEM_CLAIM_RATE_BATCH"):
        _q = getattr(_cl, _name)
        assert _NEXT in _q, f"{_name} changed: update the control"
        setattr(_cl, _name, _q.replace(_NEXT, "w.lease_token + 1"))
    _h.HandlerContext.idempotency_key = property(  # type: ignore[method-assign,assignment]
        lambda self: f"{self.event_id}:{self.work_type}"
    )

if os.environ.get("CONNECTOR_TEST_NO_LEASE_WATCH") == "1":
    # Before issue #26 item 5: nothing stops a call when renewals hang (the deadline never passes).
    from connector.executor.work.inflight import InFlight as _InFlight

    _InFlight.deadline = property(lambda self: float("inf"))  # type: ignore[method-assign,assignment]

if os.environ.get("CONNECTOR_TEST_ADMISSION_IGNORES_PHASE") == "1":
    # tests/cutover/test_live_gate4.py: the executor's admission round names every generation's
    # admitting receipt whatever its phase, so the process never drops a generation being rolled back.
    from connector.common.store import processes as _processes

    _PHASE = "WHERE a.claim_path = 'work_item' AND a.phase = 'work_item_active' AND a.cutover_receipt_id"
    assert _PHASE in _processes.PROCESS_ADMIT, "PROCESS_ADMIT changed: update the control"
    _processes.PROCESS_ADMIT = _processes.PROCESS_ADMIT.replace(_PHASE, "WHERE a.cutover_receipt_id")

if os.environ.get("CONNECTOR_TEST_LEGACY_IGNORES_WORK_ITEM_STATE") == "1":
    # tests/cutover/test_live_paths.py: the legacy executor's work plan reports every existing WorkItem
    # as fenced, so it also runs the work types of its event that finished on the WorkItem path.
    from connector.common.store import legacy as _legacy

    _STATE = "w.state AS work_state"
    assert _STATE in _legacy.EVENT_LEGACY_WORK_PLAN, "EVENT_LEGACY_WORK_PLAN changed: update the control"
    _legacy.EVENT_LEGACY_WORK_PLAN = _legacy.EVENT_LEGACY_WORK_PLAN.replace(
        _STATE, "CASE WHEN w.state IS NOT NULL THEN 'awaiting_legacy_outcome' END AS work_state"
    )

if os.environ.get("CONNECTOR_TEST_LEGACY_CRASH_BEFORE_PROJECTION") == "1":
    # tests/cutover/test_processes.py: the legacy executor dies (SIGKILL) right after an Event's
    # finalize committed its state and outcome receipts, before it projects them (the projection a
    # successor must repair). The start-up and periodic projections (by generation) run as usual.
    import signal as _signal

    from connector.executor.legacy import executor as _legacy_executor

    _project = _legacy_executor.legacy_outcome_project

    async def _crash_before_projection(conn, **kw):  # type: ignore[no-untyped-def]
        if "event_ids" in kw:
            os.kill(os.getpid(), _signal.SIGKILL)
        return await _project(conn, **kw)

    _legacy_executor.legacy_outcome_project = _crash_before_projection  # type: ignore[assignment]

"""Every statement on ``connector_work_item`` (ADR 005): the claim path first — claim, renew, finalize,
release, reclaim — then the reads and transitions of the sampler, the admin API, the cutover gates
and the legacy-outcome projection, and last their creation (the materializer's multi-row insert).

Joins held here (their driving table is the WorkItem): the claimed batch's event facts and payloads
(``work_item_event_batch``: ``connector_event`` + ``connector_ingress_receipt`` by primary key); the
admin API's dead letters and WorkItem with their event and receipt (``work_item_list_dead``,
``work_item_get``, built from the aliased select lists ``WORK_ITEM_SELECT_COLUMNS``,
``events.EVENT_SELECT_COLUMNS``, ``receipts.admin.RECEIPT_SELECT_COLUMNS``), the replay checks' item,
event and receipt (``work_item_replay_candidates``), and its queue and lane statistics driven from
the pack and generation rows (``work_item_stats_*``, ``work_item_lanes_walk``).

The WorkItem row is the sole distributed execution authority. Rules every claim-path statement
here follows:

* **Claim** is one statement: per (pack, queue class) group a candidate read of the partial ready
  index, due rows in claim order (``vocabulary.claim_rank``: the due time less the priority head start,
  docs/adr/014-priorities.md) ``ORDER BY claim_rank, work_id LIMIT n FOR UPDATE SKIP LOCKED``
  (never waits on a row), then a
  primary-key update of exactly those rows that sets ``processing``, ``lease_token + 1`` (strictly
  increasing per row), the owner and ``lease_until`` from the *database* clock. The update re-checks
  no state: the candidates are locked by this statement with their conditions re-evaluated on the
  newest row version (READ COMMITTED EvalPlanQual) and stay locked until commit; a state predicate
  there would let the planner drive the update from the ready index, whose row estimate comes from
  statistics taken when the backlog was small (a walk of the whole backlog per claim). The statement joins
  ``connector_claim_authority`` and locks the authority rows ``FOR SHARE``: it claims only where the
  WorkItem path is the active owner with a cutover receipt, and an authority change (an ``UPDATE`` of
  that row) waits for claim transactions in flight, so every later claim sees the new phase. Anything
  else fails closed (no rows). A paused pack or queue class (``paused_queue_classes`` of those
  authority rows, ``store.pauses``) drops out of the admitted generations the same way: the pause
  updates the rows, so it waits for the claims in flight and every later claim sees it. A group
  with no admitted generation (paused, or not WorkItem-owned) is cut off before its index scan by
  ``cardinality(ag.gens) > 0``, a one-time filter: the generation is not in the ready index, so
  without it the scan would read (and discard) every ready row of the group.
* **Renew, complete, retry, dead, release** are batched and fenced row by row: ``work_id = id AND
  lease_token = token AND state = 'processing'``. The hot two (renew, complete) look the token up
  by position instead of joining ``unnest(ids, tokens)`` (a prepared statement's generic plan cannot
  size the unnest and picks a nested-loop join, which is quadratic in the batch size): ``ids`` is
  sorted and unique, so ``width_bucket(work_id, ids)`` — a binary search — is the row's position
  and ``tokens[width_bucket(...)]`` its token. (``array_position``, the linear search used before,
  cost ~2.5 us per row at 256 ids, a seventh of the complete: docs/benchmarks.md, "The fenced
  lookup".) A stale holder's write matches zero rows; the
  caller counts it and abandons the item. Arrays are passed sorted by ``work_id`` so batched
  finalizes lock rows in one global order (DESIGN §8 trap 1).
* **Reclaim** of an expired lease re-checks state, token and expiry (``lease_until <
  clock_timestamp()``) in the same statement that moves the row to ``retry`` or, when attempts are
  exhausted, ``dead`` — a row that was finished or re-claimed in between is left alone.
* Lane members (source or target lane key) are finalized, released and reclaimed inside one
  transaction that first takes the lanes' advisory locks (``lane_lock_batch``) and finally settles
  them (``lane_settle_batch``), per ADR 003. Lanes never appear in the claim statement.
* State lists are inlined literals and ``now()`` (statement start) is used in candidate reads, while
  leases use ``clock_timestamp()`` (DESIGN §8 trap 5). A new ``run_after`` (retry, reclaim) is
  ``now()`` + delay, so the rows of one batch share it and keep their ``work_id`` order.
* The claim and the ready-groups read are prepared (``prepare=True``). The by-id statements (renew,
  complete, fail, reclaim) and the reclaim candidate read are sent unprepared (``BY_ID_PREPARE``): a
  prepared statement's generic plan is built once per connection, and one built while the table was
  nearly empty and unanalyzed (a fresh deployment, autovacuum off) walked a whole index for
  ``work_id = ANY(ids)``, a cost that grows with every item finished since the last vacuum. A
  custom plan is made for the table as it is; planning costs ~0.1 ms per batch.
"""

from connector.common.store.work_items import admin, claim, finalize, insert, legacy, stats

__all__ = ["admin", "claim", "finalize", "insert", "legacy", "stats"]

"""Every statement on ``connector_ingress_receipt`` (DESIGN §2: the ingress inserts, the
materializer owns the routing columns, retention deletes retired deliveries in store/deliveries.py).

Rules: one named constant per statement, noun first, with one function of the same name. The ingress
insert is one multi-row statement per group commit (``receipt_insert_batch``, docs/adr/002); routing
writes are fenced by ``claim_token`` and batched through ``unnest`` with binary arrays (ADR 004);
state literals are inlined so plans use the partial indexes (DESIGN §8 trap 5). Plans are asserted
by tests/ingress/test_plans.py and tests/materializer/test_plans.py.

Joins held here: a receipt replay's check of its events and its namespace's active route
(``receipt_replay_check``), the claimant count of the admin's receipt statistics
(``receipt_stats``: ``connector_process``).
"""

from connector.common.store.receipts import admin, find, insert, routing

__all__ = ["admin", "find", "insert", "routing"]

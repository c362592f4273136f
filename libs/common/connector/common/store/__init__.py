"""The store: every SQL statement on the runtime's tables, one module per table family.

The rule (DESIGN §2):

* **One module per table family.** Every statement on those tables lives there and nowhere else
  (migrations, ``schema.py`` and tests aside). A read that joins other families (a dead letter with
  its event and receipt) lives with the family of its driving table; each module's docstring names
  the joins it holds.
* **Named noun first, one function each.** A statement is a module constant named after what it
  does, table noun first (``WORK_ITEM_CLAIM_BATCH``), with exactly one function of the same name in
  lower case (``work_item_claim_batch``) that executes it. Related operations sort together.
* **Services hold actors and wiring and call the store.** They never hold SQL text on these tables;
  which service package may call which *writer* (DESIGN's sole-writer table) is enforced by
  ``tests/test_import_contract.py``.

Modules: ``receipts`` (connector_ingress_receipt), ``events`` (connector_event facts),
``work_items`` (connector_work_item; the claim path, ADR 005), ``lanes`` (lane locks and settle,
ADR 003), ``authority`` (claim authority, cutover receipts, rollback fences, scheduler lease, ADR
007), ``legacy`` (legacy Event-path claims and legacy outcome receipts), ``packs`` (installed packs,
generations, routes), ``processes`` (connector_process).
"""

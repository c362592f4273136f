"""The store layer's import contract (DESIGN §2), checked on the source with ``ast`` (nothing runs):

(a) **Sole writers.** Every function of ``connector.common.store`` that writes (its statement, or a
    store function it calls, holds ``INSERT INTO`` / ``UPDATE`` / ``DELETE FROM`` on a connector
    table) is listed in ``WRITERS`` with the roles that may call it; a role's modules may reference
    only the writers listed for it. A new writer must be placed in the table.
(b) **SQL only in the store.** No module of ``libs/`` or ``services/`` outside the store
    (migrations and ``schema.py`` aside) holds SQL text on a connector table. Modules not moved yet
    are allowlisted, each with a reason; an allowlisted module without SQL fails the test, so the
    list can only shrink. ``EXEMPT`` names what stays outside by design (the upkeep's maintenance
    on tables: catalog reads, VACUUM/ANALYZE), checked to read nothing but catalogs.
(c) **Layering.** The services never import one another (the executor does not import the
    materializer), the store imports no service, and no connector.* modules import each other in
    a circle (lazy imports count; type-only ``TYPE_CHECKING`` imports do not). Within the
    executor's ``work/`` package type-only imports count too: an actor names the narrow door it
    needs (``work/doors.py``), never the engine that owns it.

The scanners are tested on planted sources (controls), so a scanner that finds nothing cannot pass.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from connector.common.store import schema

ROOT = Path(__file__).resolve().parents[1]
COMMON = ROOT / "libs/common/connector/common"
STORE = COMMON / "store"
EXECUTOR = ROOT / "services/executor/connector/executor"

TABLES = sorted(schema.metadata.tables)
_TABLE = re.compile(r"\b(" + "|".join(map(re.escape, TABLES)) + r")\b")
_VERB = re.compile(r"\b(SELECT|INSERT\s+INTO|UPDATE|DELETE\s+FROM|FROM|JOIN|RETURNING)\b")
_WRITE = re.compile(
    r"\b(INSERT\s+INTO\s+(" + "|".join(TABLES) + r")\b|(?<!FOR )UPDATE\s+(" + "|".join(TABLES) + r")\b"
    r"|DELETE\s+FROM\s+(" + "|".join(TABLES) + r")\b)"
)

# --------------------------------------------------------------------------------------------------
# Roles: which modules act for which component of DESIGN §2's ownership table.
# --------------------------------------------------------------------------------------------------

INGRESS = "ingress"
MATERIALIZER = "materializer"
EXECUTOR_ROLE = "executor"
ADMIN = "admin"
MAINTENANCE = "maintenance"  # retention and upkeep jobs run by every service (ADR 008, ADR 009)
ANY = frozenset({INGRESS, MATERIALIZER, EXECUTOR_ROLE, ADMIN, MAINTENANCE})


def _role_of(path: Path) -> str | None:
    rel = path.relative_to(ROOT).as_posix()
    if rel.startswith("services/ingress/"):
        return INGRESS
    if rel.startswith("services/materializer/"):
        return MATERIALIZER
    if rel.startswith("services/executor/"):
        inner = path.relative_to(EXECUTOR).as_posix()
        # The admin API and the cutover gates it runs (DESIGN §2: admin owns replay transitions,
        # cutover/rollback receipts and fences, pack install).
        if inner.startswith(("admin/", "cutover")):
            return ADMIN
        # Legacy outcome receipts are reconciled (projected, resolved) as the admin's writes: the
        # admin API and the cutover run them; the legacy executor triggers the projection through it.
        if inner == "legacy/outcomes.py":
            return ADMIN
        return EXECUTOR_ROLE
    if rel.startswith("libs/cli/"):
        return ADMIN
    # libs/common is grouped by owner (docs/adr/015-rooms-by-owner.md): the folder says who acts.
    owner = rel.removeprefix("libs/common/connector/common/").split("/", 1)[0]
    return COMMON_OWNERS.get(owner)


#: The owner of each folder of libs/common/connector/common that acts for one role: the
#: materializer's domain (the cutover's gate 3 runs its backfill), the maintenance jobs every service
#: runs, pack install (an admin action). ``core`` and ``store`` act for nobody: the store holds the
#: writers, core the infrastructure.
COMMON_OWNERS: dict[str, str] = {"delivery": MATERIALIZER, "maintenance": MAINTENANCE, "packs": ADMIN}


# --------------------------------------------------------------------------------------------------
# (a) DESIGN §2's sole-writer table, as store writer functions.
# --------------------------------------------------------------------------------------------------

WRITERS: dict[str, frozenset[str]] = {
    # ingress: receipt insert
    "receipt_insert_batch": frozenset({INGRESS}),
    # ingress: the reconciler (it runs in the ingress process: it admits missing deliveries through
    # the ingress' own receipt insert, docs/adr/016-reconciliation.md) keeps a route's watermark and
    # pass checkpoint, takes on-demand runs and writes their results; admin: asks for a run
    "reconcile_state_ensure": frozenset({INGRESS}),
    "reconcile_state_checkpoint": frozenset({INGRESS}),
    "reconcile_state_finish": frozenset({INGRESS}),
    "reconcile_state_fail": frozenset({INGRESS}),
    "reconcile_run_claim": frozenset({INGRESS}),
    "reconcile_run_finish": frozenset({INGRESS}),
    "reconcile_run_delete_old": frozenset({INGRESS}),
    "reconcile_run_insert": frozenset({ADMIN}),
    # materializer: receipt routing state, event rows, WorkItem creation (lanes settle their members)
    "receipt_claim_routable": frozenset({MATERIALIZER}),
    "receipt_mark_materialized_batch": frozenset({MATERIALIZER}),
    "receipt_mark_failed_batch": frozenset({MATERIALIZER}),
    "receipt_mark_retry_batch": frozenset({MATERIALIZER}),
    "receipt_release_batch": frozenset({MATERIALIZER}),
    "event_insert_batch": frozenset({MATERIALIZER}),
    "work_item_insert_batch": frozenset({MATERIALIZER}),
    # materializer: the rate-limit key rows of the WorkItems it inserts (the claim spends their budget)
    "rate_limit_declare": frozenset({MATERIALIZER}),
    "concurrency_declare": frozenset({MATERIALIZER}),
    # materializer: debounce key rows (locked before the insert) and parking of a key's live item
    "debounce_declare": frozenset({MATERIALIZER}),
    "debounce_schedule": frozenset({MATERIALIZER}),
    # materializer: the circuit rows of the WorkItems it inserts (docs/adr/013-circuit-breakers.md)
    "circuit_declare": frozenset({MATERIALIZER}),
    # executor: outcomes fed to the circuits with finalize / reclaim; admin: manual open / close
    "circuit_record": frozenset({EXECUTOR_ROLE}),
    "circuit_set": frozenset({ADMIN}),
    # executor: concurrency slots given back with finalize / reclaim, and their periodic check
    "slots_release": frozenset({EXECUTOR_ROLE}),
    "concurrency_check": frozenset({EXECUTOR_ROLE, MAINTENANCE}),
    "flow_keys_retire": frozenset({EXECUTOR_ROLE, MAINTENANCE}),
    "rate_limit_retire": frozenset({EXECUTOR_ROLE, MAINTENANCE}),
    "concurrency_retire": frozenset({EXECUTOR_ROLE, MAINTENANCE}),
    "debounce_retire": frozenset({EXECUTOR_ROLE, MAINTENANCE}),
    # executor: WorkItem claim / lease / renew / finalize / retry / dead, reclaim
    "work_item_claim_batch": frozenset({EXECUTOR_ROLE}),
    "work_item_claim_plain_batch": frozenset({EXECUTOR_ROLE}),
    "work_item_claim_circuit_batch": frozenset({EXECUTOR_ROLE}),
    "work_item_claim_rate_batch": frozenset({EXECUTOR_ROLE}),
    "work_item_renew_lease_batch": frozenset({EXECUTOR_ROLE}),
    "work_item_complete_batch": frozenset({EXECUTOR_ROLE}),
    "work_item_fail_batch": frozenset({EXECUTOR_ROLE}),
    "work_item_retry_batch": frozenset({EXECUTOR_ROLE}),
    "work_item_dead_batch": frozenset({EXECUTOR_ROLE}),
    "work_item_release_batch": frozenset({EXECUTOR_ROLE}),
    "work_item_finalize": frozenset({EXECUTOR_ROLE}),
    "work_item_reclaim_expired": frozenset({EXECUTOR_ROLE}),
    # executor: legacy Event claims in compatibility mode, the scheduler lease
    "event_legacy_claim_batch": frozenset({EXECUTOR_ROLE}),
    "event_legacy_renew_lease_batch": frozenset({EXECUTOR_ROLE}),
    "event_legacy_reclaim_expired": frozenset({EXECUTOR_ROLE}),
    "event_legacy_finalize": frozenset({EXECUTOR_ROLE}),
    "scheduler_lease_acquire": frozenset({EXECUTOR_ROLE}),
    "scheduler_lease_release": frozenset({EXECUTOR_ROLE}),
    # lane facts change with every membership change: materialize, finalize, reclaim, replay, fence
    "lane_settle_batch": frozenset({MATERIALIZER, EXECUTOR_ROLE, ADMIN}),
    "lanes_change": frozenset({MATERIALIZER, EXECUTOR_ROLE, ADMIN}),
    "lane_repair": frozenset({EXECUTOR_ROLE, MAINTENANCE}),
    # admin: pack install and activation (connector.common.packs.install: a new generation, its routes
    # and its install receipt + claim authority row)
    "pack_insert": frozenset({ADMIN}),
    "pack_generation_insert": frozenset({ADMIN}),
    "route_insert_batch": frozenset({ADMIN}),
    "claim_authority_insert": frozenset({ADMIN}),
    "pack_generation_retire_active": frozenset({ADMIN}),
    "pack_generation_set_active": frozenset({ADMIN}),
    "pack_set_active_generation": frozenset({ADMIN}),
    # admin: cutover/rollback receipts and fences (the gates), legacy outcome reconciliation
    "claim_authority_set": frozenset({ADMIN}),
    "cutover_receipt_insert": frozenset({ADMIN}),
    "scheduler_lease_revoke": frozenset({ADMIN}),
    "rollback_fence_insert": frozenset({ADMIN}),
    "rollback_fence_resolve": frozenset({ADMIN}),
    "work_item_rollback_fence": frozenset({ADMIN}),
    "event_owner_switch_to_work_item": frozenset({ADMIN}),
    "legacy_outcome_receipt_insert": frozenset({ADMIN}),
    "legacy_outcome_receipt_mark_projected": frozenset({ADMIN}),
    "event_legacy_set_state": frozenset({ADMIN}),
    "work_item_legacy_reconcile": frozenset({ADMIN}),
    "work_item_legacy_quarantine": frozenset({ADMIN}),
    "work_item_legacy_mirror_insert": frozenset({ADMIN}),
    # every service process registers itself (connector.common.core.process_registry)
    "process_register": ANY,
    "process_heartbeat": ANY,
    "process_deregister": ANY,
    "process_prune_stale": ANY,
    # a WorkItem executor's claim admission (connector.executor.work.admission; docs/cutover.md gate 4)
    "process_admit": frozenset({EXECUTOR_ROLE}),
    # retention (ADR 009): retired deliveries and expired admin request ids
    "work_item_delete_retired": frozenset({MAINTENANCE}),
    "event_delete_retired": frozenset({MAINTENANCE}),
    "receipt_delete_retired": frozenset({MAINTENANCE}),
    "admin_request_delete_expired": frozenset({MAINTENANCE}),
    # admin: AIP-155 request ids stored with the mutation they answer
    "admin_request_insert": frozenset({ADMIN}),
    # admin: replay transitions (a dead WorkItem to the active generation, a failed receipt back to
    # the materializer)
    "work_item_replay_batch": frozenset({ADMIN}),
    "receipt_replay": frozenset({ADMIN}),
    # admin: operator actions (admin/actions.py): cancel one WorkItem, pause / resume a pack or
    # queue class (the pause rows and their projection onto the claim authority rows)
    "work_item_cancel": frozenset({ADMIN}),
    # admin: a circuit closed by an operator makes the items it held due now
    "work_item_circuit_release": frozenset({ADMIN}),
    # admin: a cancelled live debounce item hands its key to the newest parked one (docs/packs.md#debounce)
    "debounce_unpark_newest": frozenset({ADMIN}),
    "pause_insert": frozenset({ADMIN}),
    "pause_delete": frozenset({ADMIN}),
    "pause_project": frozenset({ADMIN}),
    # figures (docs/metrics.md "Figures without Prometheus"): every ingress and executor process adds
    # its figures (the maintenance job); the leading executor's sampler writes the gauges, its job
    # seals closed periods and deletes old rows
    "figures_flush": frozenset({MAINTENANCE}),
    "figures_sample": frozenset({EXECUTOR_ROLE}),
    "figures_seal": frozenset({MAINTENANCE}),
    "figures_retire": frozenset({MAINTENANCE}),
}

# Store functions that are not writers although they mention a write (none yet); kept explicit.
NOT_WRITERS: frozenset[str] = frozenset()


def _py_files(*dirs: Path) -> Iterator[Path]:
    for d in dirs:
        for path in sorted(d.rglob("*.py")):
            if "_pb2" in path.name or "/migrations/" in path.as_posix():
                continue
            yield path


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


#: Modules under store/ that hold no statements on rows: the schema and its vocabularies, the
#: migrations and their runner.
STORE_NOT_STATEMENTS = ("schema", "vocabulary", "migrate", "migrations")


def _store_modules() -> dict[str, Path]:
    """The store's statement modules by their dotted name under ``connector.common.store``
    (``work_items.claim``); package ``__init__`` files hold no statements."""
    out: dict[str, Path] = {}
    for p in sorted(STORE.rglob("*.py")):
        parts = p.relative_to(STORE).with_suffix("").parts
        if p.stem == "__init__" or parts[0] in STORE_NOT_STATEMENTS:
            continue
        out[".".join(parts)] = p
    return out


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level string constants (f-strings: their literal parts)."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            text = _literal_text(node.value)
            if text is not None:
                out[node.targets[0].id] = text
    return out


def _literal_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal_text(node.left), _literal_text(node.right)
        if left is not None or right is not None:
            return (left or "") + (right or "")
    return None


def store_writers() -> dict[str, set[str]]:
    """Writer functions of every store module (``{module: {function}}``), to a fixpoint over calls
    between store functions."""
    funcs: dict[str, dict[str, set[str]]] = {}  # module -> function -> names it references
    consts: dict[str, dict[str, str]] = {}
    imported: dict[str, dict[str, str]] = {}  # module -> local name -> "module.function"
    for mod, path in _store_modules().items():
        tree = _parse(path)
        consts[mod] = _constants(tree)
        imported[mod] = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("connector.common.store."):
                src = (node.module or "").removeprefix("connector.common.store.")
                for alias in node.names:
                    imported[mod][alias.asname or alias.name] = f"{src}.{alias.name}"
        funcs[mod] = {}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs[mod][node.name] = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    writers: set[str] = set()
    for mod, fs in funcs.items():
        for name, refs in fs.items():
            if any(_WRITE.search(consts[mod].get(r, "")) for r in refs):
                writers.add(f"{mod}.{name}")
    changed = True
    while changed:
        changed = False
        for mod, fs in funcs.items():
            for name, refs in fs.items():
                key = f"{mod}.{name}"
                if key in writers:
                    continue
                targets = {f"{mod}.{r}" for r in refs if r in fs} | {
                    imported[mod][r] for r in refs if r in imported[mod]
                }
                if targets & writers:
                    writers.add(key)
                    changed = True
    out: dict[str, set[str]] = {}
    for key in writers:
        mod, name = key.rsplit(".", 1)
        if not name.startswith("_"):
            out.setdefault(mod, set()).add(name)
    return out


def store_references(tree: ast.Module) -> set[tuple[str, str]]:
    """``(store module, name)`` pairs a module references, the module by its dotted name under the
    store (``work_items.claim``): ``from connector.common.store.M import f``, and a module imported
    from the store (``from connector.common.store import M``, ``from connector.common.store.P import M``,
    ``import connector.common.store.M as A``) followed by an attribute chain (``M.f``, ``P.M.f``)."""
    modules = set(_store_modules())
    refs: set[tuple[str, str]] = set()
    module_aliases: dict[str, str] = {}  # local name -> dotted store path (a module or a package)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if mod == "connector.common.store" or mod.startswith("connector.common.store."):
                base = mod.removeprefix("connector.common.store").lstrip(".")
                for alias in node.names:
                    dotted = f"{base}.{alias.name}" if base else alias.name
                    if base in modules:
                        refs.add((base, alias.name))
                    else:
                        module_aliases[alias.asname or alias.name] = dotted
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("connector.common.store.") and alias.asname:
                    module_aliases[alias.asname] = alias.name.removeprefix("connector.common.store.")
    for node in ast.walk(tree):
        chain: list[str] = []
        cur: ast.AST = node
        while isinstance(cur, ast.Attribute):
            chain.append(cur.attr)
            cur = cur.value
        if not chain or not isinstance(cur, ast.Name) or cur.id not in module_aliases:
            continue
        path = module_aliases[cur.id].split(".") + chain[::-1]
        for i in range(len(path) - 1, 0, -1):
            if ".".join(path[:i]) in modules:
                refs.add((".".join(path[:i]), path[i]))
                break
    return refs


def writer_violations(
    files: Iterable[Path], writers: dict[str, set[str]], role_of: Callable[[Path], str | None] = _role_of
) -> list[str]:
    out: list[str] = []
    for path in files:
        role = role_of(path)
        if role is None:
            continue
        for mod, name in sorted(store_references(_parse(path))):
            if name in writers.get(mod, set()) and role not in WRITERS.get(name, frozenset()):
                out.append(f"{path.name} ({role}) calls store.{mod}.{name}")
    return out


def test_every_store_writer_is_in_the_sole_writer_table() -> None:
    writers = store_writers()
    found = {name for names in writers.values() for name in names} - NOT_WRITERS
    assert "work_item_claim_batch" in found and "receipt_insert_batch" in found, "the scanner finds writers"
    unlisted = sorted(found - set(WRITERS))
    assert not unlisted, f"store writers missing from WRITERS (say which role may call them): {unlisted}"
    gone = sorted(set(WRITERS) - found)
    assert not gone, f"WRITERS lists functions that are not store writers (any more): {gone}"


def test_each_role_calls_only_its_own_writers() -> None:
    files = list(_py_files(ROOT / "services", ROOT / "libs/cli", COMMON))
    files = [f for f in files if STORE not in f.parents]
    assert not writer_violations(files, store_writers())


def test_writer_scanner_control(tmp_path: Path) -> None:
    """A planted ingress module that claims WorkItems is reported (the check can fail); the same
    call from the executor's role is not."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from connector.common.store import work_items\n"
        "from connector.common.store.lanes import lane_settle_batch\n\n"
        "async def f(c):\n    await work_items.claim.work_item_claim_batch(c)\n"
    )
    writers = store_writers()
    got = writer_violations([planted], writers, role_of=lambda _: INGRESS)
    assert got == [
        "planted.py (ingress) calls store.lanes.lane_settle_batch",
        "planted.py (ingress) calls store.work_items.claim.work_item_claim_batch",
    ]
    assert writer_violations([planted], writers, role_of=lambda _: EXECUTOR_ROLE) == []


# --------------------------------------------------------------------------------------------------
# (b) SQL text on connector tables only in the store.
# --------------------------------------------------------------------------------------------------

# Modules that still hold statements, each with why and who moves them. The test fails when one of
# them no longer does (delete its line): the list only shrinks.
ALLOWLIST: dict[str, str] = {
    # Empty: every statement on a connector table is in the store (the admin API's were the last).
}


def test_writer_scanner_reads_every_import_form(tmp_path: Path) -> None:
    """A writer reached through a submodule import, a from-import of the function or a module
    alias is reported as well (control: the same names that are not writers are not)."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import connector.common.store.work_items.finalize as fin\n"
        "from connector.common.store.work_items import claim\n"
        "from connector.common.store.work_items.insert import work_item_insert_batch\n\n"
        "async def f(c):\n"
        "    await claim.work_item_claim_plain_batch(c)\n"
        "    await fin.work_item_complete_batch(c)\n"
        "    await work_item_insert_batch(c)\n"
        "    await claim.work_item_ready_groups(c)\n"
    )
    got = writer_violations([planted], store_writers(), role_of=lambda _: INGRESS)
    assert got == [
        "planted.py (ingress) calls store.work_items.claim.work_item_claim_plain_batch",
        "planted.py (ingress) calls store.work_items.finalize.work_item_complete_batch",
        "planted.py (ingress) calls store.work_items.insert.work_item_insert_batch",
    ]


def test_common_folders_name_their_owner() -> None:
    """The owner of a libs/common module is its folder's (a new module in ``delivery/`` acts for
    the materializer without being named anywhere); ``core`` and ``store`` act for nobody."""
    assert _role_of(COMMON / "delivery" / "new.py") == MATERIALIZER
    assert _role_of(COMMON / "maintenance" / "new.py") == MAINTENANCE
    assert _role_of(COMMON / "packs" / "install.py") == ADMIN
    assert _role_of(COMMON / "core" / "db.py") is None
    assert _role_of(COMMON / "store" / "work_items" / "claim.py") is None
    folders = {p.name for p in COMMON.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == {*COMMON_OWNERS, "core", "store"}, f"a new folder needs an owner: {folders}"


def _docstring_nodes(tree: ast.Module) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def sql_strings(source: str) -> list[str]:
    """String literals (not docstrings) that read like SQL on a connector table."""
    tree = ast.parse(source)
    docs = _docstring_nodes(tree)
    docs |= {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found: list[str] = []
    for node in ast.walk(tree):
        text: str | None = None
        if isinstance(node, ast.JoinedStr):
            text = _literal_text(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value
        if text and _TABLE.search(text) and _VERB.search(text):
            found.append(" ".join(text.split())[:80])
    return found


def _sql_modules() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in _py_files(ROOT / "libs", ROOT / "services"):
        if STORE in path.parents or path == COMMON / "schema.py":
            continue
        found = sql_strings(path.read_text())
        if found:
            out[path.relative_to(ROOT).as_posix()] = found
    return out


def test_no_sql_on_connector_tables_outside_the_store() -> None:
    found = _sql_modules()
    unexpected = {m: s[:2] for m, s in found.items() if m not in ALLOWLIST}
    assert not unexpected, f"SQL outside connector.common.store: {unexpected}"


def test_the_allowlist_only_names_modules_that_still_hold_sql() -> None:
    found = _sql_modules()
    stale = sorted(m for m in ALLOWLIST if m not in found)
    assert not stale, f"these modules hold no SQL any more; delete them from ALLOWLIST: {stale}"


# Modules outside the store whose SQL stays outside it by design, each with why. Their SQL must read
# only catalogs (``pg_*``) and hold no statement on a connector table's rows; the reason is printed
# when that no longer holds.
EXEMPT: dict[str, str] = {
    "libs/common/connector/common/maintenance/upkeep.py": (
        "maintenance on tables, not statements on their rows: catalog reads (pg_class, "
        "pg_stat_user_tables, server settings), VACUUM/ANALYZE of a table by identifier and "
        "session settings (ADR 008)"
    ),
}

_MAINTENANCE_SQL = re.compile(r"^\s*(SELECT|VACUUM|ANALYZE|SET)\b")
_RELATION = re.compile(r"\b(?:FROM|JOIN)\s+([A-Za-z_][A-Za-z0-9_.]*)")


def maintenance_problems(source: str) -> tuple[int, list[str]]:
    """``(SQL strings found, problems)``: a relation other than a catalog, or a statement on a
    connector table's rows."""
    tree = ast.parse(source)
    docs = _docstring_nodes(tree)
    statements = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
        if _MAINTENANCE_SQL.match(n.value)
    ]
    problems = [
        f"reads {rel}" for text in statements for rel in _RELATION.findall(text) if not rel.startswith("pg_")
    ]
    problems += [f"statement on rows: {text}" for text in sql_strings(source)]
    return len(statements), problems


@pytest.mark.parametrize("module", sorted(EXEMPT))
def test_exempt_modules_hold_only_maintenance_sql(module: str) -> None:
    found, problems = maintenance_problems((ROOT / module).read_text())
    assert found, f"{module} holds no SQL any more; delete it from EXEMPT"
    assert not problems, f"{module} is exempt because it does {EXEMPT[module]}; but: {problems}"


def test_maintenance_scanner_control() -> None:
    """A catalog read and a VACUUM pass; a read of a connector table's rows does not."""
    good = (
        'A = "SELECT relname FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid"\n'
        'B = "VACUUM {}"\n'
    )
    assert maintenance_problems(good) == (2, [])
    bad = good + "C = \"SELECT count(*) FROM connector_work_item WHERE state = 'dead'\"\n"
    found, problems = maintenance_problems(bad)
    assert found == 3 and problems and problems[0] == "reads connector_work_item"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("X = \"SELECT work_id FROM connector_work_item WHERE state = 'dead'\"\n", 1),
        ('def f(t):\n    return f"UPDATE connector_event SET x = 1 WHERE {t}"\n', 1),
        ('"""Module doc: SELECT * FROM connector_work_item is described here."""\n', 0),
        ('TABLES = ("connector_work_item", "connector_process")\n', 0),
        ('MSG = "vacuum connector_work_item regularly"\n', 0),
    ],
)
def test_sql_scanner_control(source: str, expected: int) -> None:
    """A planted statement is found; docstrings, bare table names and prose are not."""
    assert len(sql_strings(source)) == expected


# --------------------------------------------------------------------------------------------------
# (c) Layering
# --------------------------------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


@pytest.mark.parametrize("service", ["ingress", "materializer", "executor"])
def test_services_do_not_import_each_other(service: str) -> None:
    others = {"ingress", "materializer", "executor"} - {service}
    bad = []
    for path in _py_files(ROOT / "services" / service):
        for name in _imports(path):
            if any(name == f"connector.{o}" or name.startswith(f"connector.{o}.") for o in others):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad


def test_the_store_imports_no_service() -> None:
    bad = [
        f"{p.relative_to(ROOT)} imports {n}"
        for p in _py_files(STORE)
        for n in _imports(p)
        if n.startswith(
            ("connector.ingress", "connector.materializer", "connector.executor", "connector.cli")
        )
    ]
    assert not bad


# The operator console (libs/cli/connector/console, docs/console.md) is a client of the admin API:
# every view and action goes through the same RPCs, roles, audit lines and request ids as the CLI.
# It may not reach the database by any other door: no store, no database driver or SQL toolkit, no
# service package (the executor's admin code included).
CONSOLE = ROOT / "libs/cli/connector/console"
CONSOLE_FORBIDDEN = (
    "connector.common.store",
    "connector.common.core.db",
    "connector.common.core.testdb",
    "connector.executor",
    "connector.ingress",
    "connector.materializer",
    "psycopg",
    "psycopg_pool",
    "sqlalchemy",
    "asyncpg",
)


def console_violations(files: Iterable[Path]) -> list[str]:
    return sorted(
        f"{p.name} imports {n}"
        for p in files
        for n in _imports(p)
        if any(n == f or n.startswith(f + ".") for f in CONSOLE_FORBIDDEN)
    )


def test_the_console_reaches_the_runtime_only_through_the_admin_api() -> None:
    files = list(_py_files(CONSOLE))
    assert len(files) >= 8, "the scan sees the console's modules"
    assert not console_violations(files)
    assert not [m for m in _sql_modules() if m.startswith("libs/cli/connector/console/")], (
        "SQL in the console"
    )


def test_console_scanner_control(tmp_path: Path) -> None:
    """A planted console module reading the store or the database directly is reported."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import psycopg\nfrom connector.common.store import work_items\n"
        "from connector.executor.admin import servicer\nfrom connector.v1 import admin_service_pb2\n"
    )
    assert console_violations([planted]) == [
        "planted.py imports connector.common.store",
        "planted.py imports connector.executor.admin",
        "planted.py imports psycopg",
    ]


# No import cycles among connector.* modules: every import counts (lazy ones inside functions too,
# they run), except type-only imports under ``if TYPE_CHECKING:``, which never run.
SOURCE_ROOTS = tuple(
    ROOT / d
    for d in ("libs/common", "libs/cli", "services/ingress", "services/materializer", "services/executor")
)


def _module_name(path: Path, roots: Iterable[Path]) -> str:
    root = next(r for r in roots if r in path.parents)
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            ids |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return ids


def module_graph(
    files: Iterable[Path], roots: Iterable[Path] = SOURCE_ROOTS, *, type_only: bool = False
) -> dict[str, set[str]]:
    """``{module: modules it imports}`` over ``files`` (edges to modules outside them dropped);
    ``type_only``: imports under ``if TYPE_CHECKING:`` count too."""
    roots = tuple(roots)
    paths = {_module_name(p, roots): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = _parse(path)
        skip = set() if type_only else _type_checking_nodes(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    known = [
                        ".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in paths
                    ]
                    targets.update(known[:1])
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([base] if base else [])])
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in paths:
                        targets.add(sub)
                    elif base in paths:
                        targets.add(base)
        graph[name] = targets - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_cycles_among_connector_modules() -> None:
    graph = module_graph(_py_files(*SOURCE_ROOTS))
    assert "connector.common.store.work_items.insert" in graph["connector.common.delivery.materialization"], (
        "scanner sees edges"
    )
    assert not import_cycles(graph)


WORK = EXECUTOR / "work"


def test_no_import_cycles_among_the_executor_actors_even_type_only() -> None:
    """The engine wires the actors; an actor sees only its door (``work/doors.py``), so nothing in
    ``work/`` refers back to the engine, not even for a type annotation."""
    graph = module_graph(_py_files(WORK), type_only=True)
    assert "connector.executor.work.claimer" in graph["connector.executor.work.engine"], "scanner sees edges"
    assert not import_cycles(graph)


def test_import_cycle_scanner_control(tmp_path: Path) -> None:
    """A cycle closed by a lazy import inside a function (and one through a relative import) is
    found; a back edge under ``if TYPE_CHECKING:`` is not a cycle, unless type-only imports count."""
    pkg = tmp_path / "connector" / "demo"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from connector.demo import b\n")
    (pkg / "b.py").write_text("def f():\n    from connector.demo.a import g\n")
    (pkg / "c.py").write_text("from . import d\n")
    (pkg / "d.py").write_text("import connector.demo.c\n")
    (pkg / "e.py").write_text("from connector.demo import f\n")
    (pkg / "f.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from connector.demo.e import x\n"
    )
    graph = module_graph(sorted(pkg.glob("*.py")), roots=[tmp_path])
    assert import_cycles(graph) == [
        ["connector.demo.a", "connector.demo.b"],
        ["connector.demo.c", "connector.demo.d"],
    ]
    # Counting type-only imports (the executor's work/ package), the back edge closes a cycle.
    graph = module_graph(sorted(pkg.glob("*.py")), roots=[tmp_path], type_only=True)
    assert ["connector.demo.e", "connector.demo.f"] in import_cycles(graph)

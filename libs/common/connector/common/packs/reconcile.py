"""A route's delivery guarantees beyond the webhook itself (docs/reconcile.md): its **redelivery
contract** (does the sender retry an answer that is not a durable acceptance?) and its optional
**reconciliation** against the sender's own record of what it sent.

Both are data. ``REDELIVERY_PRESETS`` and ``RECONCILE_PRESETS`` are ordinary dicts, like the
verification presets (connector.common.verification): each entry cites the sender's public
documentation it was read from, and nothing downstream knows a provider. The reconciler
(connector.ingress.reconcile) interprets any ``ReconcileSpec`` the same way.

The contract of a route (``effective_redelivery``): the route's own ``redelivery``, else the
redelivery preset named like its verification preset, else ``none`` — the runtime never assumes that
a 5xx or 429 answer will be retried (connector-root-architecture-contract, "IngressReceipt").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from connector.common.packs.verification import SecretRef

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> Any:
    """``90``, ``"90s"``, ``"30m"``, ``"4h"``, ``"3d"`` → seconds (float); anything else is left for
    the field's own validation to refuse."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        m = _DURATION_RE.match(value)
        if m is None:
            raise ValueError(f"{value!r} is not a duration (e.g. 90s, 30m, 4h, 3d, or seconds)")
        return float(m.group(1)) * _UNIT_S[m.group(2)]
    return value


#: Seconds, written as a number or a duration (``90s``, ``30m``, ``4h``, ``3d``).
Duration = Annotated[float, BeforeValidator(parse_duration)]

#: The longest a sender keeps its record (window) or retries (a year is far beyond any known one).
MAX_HORIZON_S = 366 * 86400.0


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# --------------------------------------------------------------------------------------------------
# Redelivery contract
# --------------------------------------------------------------------------------------------------

RedeliveryMode = Literal["provider_retries", "none", "manual"]

#: Redelivery contracts of known senders, read from their public documentation. ``for``: how long
#: the sender keeps retrying (provider_retries) or keeps a delivery it can be asked to send again
#: (manual).
REDELIVERY_PRESETS: dict[str, dict[str, Any]] = {
    # https://docs.stripe.com/webhooks#retries: "In live mode, Stripe attempts to deliver a given
    # event to your webhook endpoint for up to 3 days with an exponential back off."
    "stripe": {"mode": "provider_retries", "for_s": 3 * 86400.0},
    # https://docs.github.com/en/webhooks/using-webhooks/handling-failed-webhook-deliveries: "GitHub
    # does not automatically redeliver failed deliveries"; the deliveries of the past 3 days can be
    # listed and redelivered (REST: .../hooks/{hook_id}/deliveries, .../deliveries/{id}/attempts).
    "github": {"mode": "manual", "for_s": 3 * 86400.0},
    # https://shopify.dev/changelog/updates-to-webhook-retry-mechanism (effective 2024-09-10):
    # "retried a total of 8 times over 4 hours" (the older 19 retries over 48 hours no longer hold).
    "shopify": {"mode": "provider_retries", "for_s": 4 * 3600.0},
    # https://docs.svix.com/retries: attempts immediately, then after 5 s, 5 min, 30 min, 2 h, 5 h,
    # 10 h, 10 h: the last one about 27 h 35 min after the first.
    "svix": {"mode": "provider_retries", "for_s": 5 + 300 + 1800 + 7200 + 18000 + 36000 + 36000.0},
}  # fmt: skip


class RedeliverySpec(_Model):
    """What the sender does with an answer that is not a durable acceptance (a 503 while the
    database is down, a 429, a shed connection): ``provider_retries`` (it retries for ``for``),
    ``none`` (it never sends it again), ``manual`` (someone, or a reconciliation in ``redeliver``
    mode, must ask it to, within ``for``). ``preset`` fills defaults that explicit fields override."""

    preset: str | None = None
    mode: RedeliveryMode | None = None
    for_s: Duration | None = Field(default=None, alias="for", gt=0, le=MAX_HORIZON_S)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str):  # ``redelivery: none``
            return {"mode": data}
        return data


def redelivery_errors(spec: RedeliverySpec) -> list[str]:
    if spec.preset is not None and spec.preset not in REDELIVERY_PRESETS:
        return [f"unknown preset {spec.preset!r}; known: {sorted(REDELIVERY_PRESETS)}"]
    resolved = resolve_redelivery(spec)
    if resolved["mode"] is None:
        return ["set a mode (provider_retries, none, manual) or a preset"]
    if resolved["mode"] == "provider_retries" and resolved.get("for_s") is None:
        return ["provider_retries needs `for` (how long the sender retries, e.g. 3d)"]
    return []


def resolve_redelivery(spec: RedeliverySpec) -> dict[str, Any]:
    """Preset defaults overridden by the fields the route sets: ``{"mode", "for_s"}``."""
    out: dict[str, Any] = {"mode": None, "for_s": None}
    out.update(REDELIVERY_PRESETS.get(spec.preset or "", {}))
    for key in ("mode", "for_s"):
        value = getattr(spec, key)
        if value is not None:
            out[key] = value
    return out


def effective_redelivery(route: Mapping[str, Any]) -> dict[str, Any]:
    """A route's contract from its stored config (``RouteSpec`` dumped as JSON): its own
    ``redelivery``, else the redelivery preset named like its verification preset, else ``none``."""
    declared = route.get("redelivery")
    if isinstance(declared, Mapping):
        try:
            spec = RedeliverySpec.model_validate(declared)
        except ValueError:
            spec = None
        if spec is not None and not redelivery_errors(spec):
            return resolve_redelivery(spec)
    verification = route.get("verification")
    preset = verification.get("preset") if isinstance(verification, Mapping) else None
    if isinstance(preset, str) and preset in REDELIVERY_PRESETS:
        return dict(REDELIVERY_PRESETS[preset])
    return {"mode": "none", "for_s": None}


# --------------------------------------------------------------------------------------------------
# Expected traffic (silence)
# --------------------------------------------------------------------------------------------------

#: The windows an expectation may be declared over (each is one alert rule: PromQL ranges are fixed).
EXPECT_WINDOWS = ("1h", "6h", "1d")


class ExpectSpec(_Model):
    """At least ``at_least`` deliveries per ``per`` (``1h``, ``6h`` or ``1d``): fewer raises
    ``ConnectorRouteSilent``. Without it, the alert learns the route's own rate (docs/reconcile.md)."""

    at_least: int = Field(ge=1, le=100_000_000)
    per: Literal["1h", "6h", "1d"] = "1h"


# --------------------------------------------------------------------------------------------------
# Reconciliation against the sender's record
# --------------------------------------------------------------------------------------------------

#: Names a list request may refer to: the pass's bounds and the page cursor.
LIST_NAMES = ("since", "until", "cursor")
#: A header template's only name: the referenced secret's value.
SECRET_NAME = "secret"  # noqa: S105 - the placeholder's name, not a secret
#: Headers that carry credentials: only from a secret reference, never a constant in a manifest.
CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie", "x-api-key")
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
_TEMPLATE_REF_RE = re.compile(r"\{([^{}]*)\}")


class HeaderValue(_Model):
    """A request header of a reconciliation: a constant without secrets (``value``), or a secret
    reference (``secret``) rendered through ``template`` (``{secret}`` is its value, e.g.
    ``"Bearer {secret}"``). Credentials are never written into a manifest."""

    value: str | None = None
    secret: SecretRef | None = None
    template: str = "{secret}"

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"value": data}
        return data

    @model_validator(mode="after")
    def _one(self) -> HeaderValue:
        if (self.value is None) == (self.secret is None):
            raise ValueError("give exactly one of value, secret")
        if self.secret is not None and _refs(self.template) != [SECRET_NAME]:
            raise ValueError("a secret header's template has exactly one {secret}, e.g. 'Bearer {secret}'")
        return self


class RequestSpec(_Model):
    """One HTTP request to the sender's API: ``url`` and ``query`` values are templates (``{since}``,
    ``{until}``, ``{cursor}`` for the list; ``{/pointer}`` into the item for a per-item request); a
    query parameter that renders empty is left out (the first page has no cursor)."""

    method: Literal["GET", "POST"] = "GET"
    url: str
    query: dict[str, str] = {}
    headers: dict[str, HeaderValue] = {}


class FetchSpec(RequestSpec):
    """A per-item request whose answer holds the body (``body``: a pointer into it)."""

    body: str = ""


class ItemSpec(_Model):
    """Where each listed item keeps what the reconciler needs (JSON pointers into the item)."""

    #: The delivery id: the same value the route extracts from the webhook (its idempotency).
    id: str
    #: When it occurred (Unix seconds or RFC 3339); items outside the pass's bounds are skipped.
    occurred_at: str
    #: Headers the webhook would have carried (name → pointer), so the route's own extraction
    #: (event kind, delivery id, correlation ids) reads a reconciled copy as it reads the webhook.
    headers: dict[str, str] = {}
    #: The body: a pointer into the item (``""``: the item itself), or ``fetch`` per item.
    body: str | None = None
    fetch: FetchSpec | None = None


class PagingSpec(_Model):
    """How the next page is asked for: exactly one of ``cursor`` (a pointer into the page's last
    item, the next request's ``{cursor}``; ``has_more`` a pointer to the document's flag), ``next``
    (a pointer into the document: the next page's URL, or its ``{cursor}``) or ``link`` (the
    ``Link`` response header's relation, e.g. ``next``)."""

    cursor: str | None = None
    has_more: str | None = None
    next: str | None = None
    link: str | None = None

    @model_validator(mode="after")
    def _one(self) -> PagingSpec:
        given = [k for k in ("cursor", "next", "link") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of cursor, next, link")
        if self.has_more is not None and self.cursor is None:
            raise ValueError("has_more goes with cursor")
        return self


class ReconcileSpec(_Model):
    """Reconciliation of one route against the sender's list of what it sent (docs/reconcile.md).

    Every ``interval`` one pass lists the sender's items that occurred in ``[since, until)``
    (``since``: the route's watermark, at most ``window`` back; ``until``: now minus ``lag``), looks
    up which delivery ids have no receipt, and either admits each through the ingress' own receipt
    path (``mode: pull``) or asks the sender to deliver it again (``mode: redeliver``)."""

    mode: Literal["pull", "redeliver"]
    interval: Duration = Field(default=300.0, ge=1, le=MAX_HORIZON_S)
    #: How far back the sender keeps its record (a pass never asks for older).
    window: Duration = Field(gt=0, le=MAX_HORIZON_S)
    #: How long before now a pass ends, so deliveries in flight land first.
    lag: Duration = Field(default=60.0, ge=0, le=86400)
    list: RequestSpec
    #: How ``{since}`` / ``{until}`` are written: Unix seconds, or RFC 3339 (UTC).
    time_format: Literal["unix", "rfc3339"] = "unix"
    #: The sender's order: with ``newest_first`` paging stops at the first item older than ``since``.
    order: Literal["newest_first", "oldest_first"] = "newest_first"
    #: Pointer to the array of items in a page (``""``: the page is the array).
    items: str = ""
    item: ItemSpec
    paging: PagingSpec
    #: The request that asks the sender to deliver one item again (``mode: redeliver``).
    redeliver: RequestSpec | None = None
    #: Bounds of a pass: page size in bytes, pages, one request's time, a 429's ``Retry-After``.
    max_page_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024)
    max_pages: int = Field(default=10_000, ge=1, le=1_000_000)
    timeout: Duration = Field(default=30.0, gt=0, le=600)
    max_retry_after: Duration = Field(default=60.0, ge=0, le=3600)


def _refs(template: str) -> list[str]:
    return _TEMPLATE_REF_RE.findall(template.replace("{{", "").replace("}}", ""))


def _pointer_errors(label: str, pointer: str | None) -> list[str]:
    if pointer is None or pointer == "" or pointer.startswith("/"):
        return []
    return [f"{label}: a JSON pointer starts with '/' ('' is the whole document)"]


def _url_errors(label: str, url: str) -> list[str]:
    # The scheme and host are literal (a template may fill the path and query only): credentials
    # are sent to the host the manifest names, never to one a response chose.
    head = url.split("{", 1)[0]
    try:
        parts = urlsplit(head)
    except ValueError:
        return [f"{label}: not a URL"]
    if parts.scheme not in ("https", "http") or not parts.hostname or "/" not in url[len(parts.scheme) + 3 :]:
        return [
            f"{label}: give an absolute https URL with a literal host and path, e.g. https://api.example.com/v1/events"
        ]
    if parts.scheme == "http" and parts.hostname not in _LOOPBACK:
        return [f"{label}: http is accepted for loopback hosts only (credentials travel with it); use https"]
    return []


def _request_errors(label: str, req: RequestSpec, names: tuple[str, ...], pointers: bool) -> list[str]:
    problems = _url_errors(f"{label}.url", req.url)
    for where, template in [("url", req.url), *((f"query.{k}", v) for k, v in req.query.items())]:
        for ref in _refs(template):
            if ref.startswith("/") and pointers:
                continue
            if ref not in names:
                allowed = [*names, "/pointer into the item"] if pointers else list(names)
                problems.append(f"{label}.{where}: {{{ref}}} is not known here; known: {allowed}")
    for name, header in req.headers.items():
        if header.value is not None and name.lower() in CREDENTIAL_HEADERS:
            problems.append(
                f"{label}.headers.{name}: a credential header takes a secret reference "
                "({secret: {env: NAME}, template: 'Bearer {secret}'}), never a value in the manifest"
            )
        if header.value is not None and _refs(header.value):
            problems.append(f"{label}.headers.{name}: a constant header has no {{...}} references")
    return problems


def reconcile_errors(spec: ReconcileSpec, route: Mapping[str, Any]) -> list[str]:
    """Problems of a route's ``reconcile`` that its fields alone cannot show (empty when usable)."""
    problems: list[str] = []
    extract = route.get("extract") if isinstance(route.get("extract"), Mapping) else {}
    if not route.get("idempotency_header") and "delivery_id" not in (extract or {}):
        problems.append(
            "the route needs a delivery id (idempotency_header or extract.delivery_id): without it a "
            "webhook and its reconciled copy cannot be recognised as one delivery"
        )
    problems += _request_errors("list", spec.list, LIST_NAMES, pointers=False)
    if "{cursor}" in spec.list.url + "".join(spec.list.query.values()) and spec.paging.link is not None:
        problems.append("list: {cursor} is not filled with paging.link (the Link header gives the whole URL)")
    if spec.paging.cursor is not None and "{cursor}" not in "".join(spec.list.query.values()) + spec.list.url:
        problems.append("paging.cursor: needs {cursor} in the list request's query or url")
    for label, pointer in (
        ("items", spec.items),
        ("item.id", spec.item.id),
        ("item.occurred_at", spec.item.occurred_at),
        ("item.body", spec.item.body),
        ("paging.cursor", spec.paging.cursor),
        ("paging.has_more", spec.paging.has_more),
        ("paging.next", spec.paging.next),
        *((f"item.headers.{k}", v) for k, v in spec.item.headers.items()),
    ):
        problems += _pointer_errors(label, pointer)
    if spec.item.id == "":
        problems.append("item.id: point at the delivery id inside the item")
    if spec.mode == "pull":
        if (spec.item.body is None) == (spec.item.fetch is None):
            problems.append("mode pull needs exactly one of item.body (a pointer) and item.fetch (a request)")
        if spec.item.fetch is not None:
            problems += _request_errors("item.fetch", spec.item.fetch, (), pointers=True)
            problems += _pointer_errors("item.fetch.body", spec.item.fetch.body)
    else:
        if spec.redeliver is None:
            problems.append(
                "mode redeliver needs redeliver (the request that asks the sender to send an item again)"
            )
        else:
            problems += _request_errors("redeliver", spec.redeliver, (), pointers=True)
    if spec.interval >= spec.window / 2:
        problems.append(
            f"interval ({spec.interval:.0f} s) must be shorter than half the window ({spec.window:.0f} s): "
            "a pass must come round well before the sender forgets"
        )
    return problems

"""The sender's API as a route's ``reconcile`` spec describes it (connector.common.reconcile): list
requests page by page, per-item fetches and redeliver requests, every fault a class from a fixed
vocabulary (``FAULTS``).

Nothing here knows a provider: URLs, queries and headers are the spec's templates, items are found by
JSON pointers, paging is a cursor from the last item, a ``next`` field, or the ``Link`` header.
Credentials come from secret references and go only to the host the manifest names (a ``next`` URL
or ``Link`` on another host is refused). Errors and logs name the fault class, the HTTP status and the
page number, never a URL's query, a header value or a body.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote, urlsplit

import aiohttp

from connector.common.packs.extraction import instant_seconds
from connector.common.packs.jsonvalues import pointer_tokens, resolve_tokens, scalar_text
from connector.common.packs.reconcile import HeaderValue, ReconcileSpec, RequestSpec
from connector.common.packs.verification import SecretUnavailable, load_secret

# Fault classes (metric label ``class``, log ``error_class``, the run's ``error``).
HTTP_5XX: Final = "http_5xx"
RATE_LIMITED: Final = "rate_limited"
TIMEOUT: Final = "timeout"
CONNECT: Final = "connect"
UNAUTHORIZED: Final = "unauthorized"
HTTP_4XX: Final = "http_4xx"
MALFORMED_JSON: Final = "malformed_json"
ITEM_WITHOUT_ID: Final = "item_without_id"
ITEM_WITHOUT_TIME: Final = "item_without_time"
CURSOR_LOOP: Final = "cursor_loop"
PAGE_TOO_LARGE: Final = "page_too_large"
TOO_MANY_PAGES: Final = "too_many_pages"
FOREIGN_URL: Final = "foreign_url"
SECRET_UNAVAILABLE: Final = "secret_unavailable"  # noqa: S105 - a fault class, not a secret
BODY_MISSING: Final = "body_missing"
FAULTS: Final = (
    HTTP_5XX, RATE_LIMITED, TIMEOUT, CONNECT, UNAUTHORIZED, HTTP_4XX, MALFORMED_JSON, ITEM_WITHOUT_ID,
    ITEM_WITHOUT_TIME, CURSOR_LOOP, PAGE_TOO_LARGE, TOO_MANY_PAGES, FOREIGN_URL, SECRET_UNAVAILABLE,
    BODY_MISSING,
)  # fmt: skip

#: Retries of one request after a 5xx, a timeout or a refused connection (then the pass fails).
TRANSIENT_RETRIES: Final = 2
#: 429s of one request honoured (each waits its ``Retry-After``, bounded by the spec).
RATE_LIMIT_RETRIES: Final = 3

_REF_RE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
_LINK_RE = re.compile(r"<([^>]*)>\s*((?:;\s*[^;,]*)*)")


class ProviderError(Exception):
    """A pass cannot go on: ``error_class`` from ``FAULTS``; ``detail`` is safe to log (status,
    page number, sizes: never a URL query, a header value, a body or a secret)."""

    def __init__(self, error_class: str, detail: str) -> None:
        super().__init__(f"{error_class}: {detail}")
        self.error_class = error_class
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Item:
    """One listed item: its delivery id, when it occurred, the item as listed."""

    id: str
    occurred_at: float
    raw: Any


@dataclass(frozen=True, slots=True)
class Page:
    number: int
    items: list[Item]
    #: What asks for the next page (a cursor or a URL; ``None``: this was the last page).
    next: str | None
    #: The page reached items older than the pass's ``since`` (a newest-first list ends here).
    exhausted: bool


def render(template: str, value_of: Callable[[str], str | None], encode: Callable[[str], str]) -> str:
    """A template with each ``{ref}`` replaced by ``encode(value_of(ref))`` (empty when no value)."""

    def piece(m: re.Match[str]) -> str:
        whole = m.group(0)
        if whole == "{{":
            return "{"
        if whole == "}}":
            return "}"
        value = value_of(m.group(1))
        return encode(value) if value else ""

    return _REF_RE.sub(piece, template)


def _item_value(raw: Any) -> Callable[[str], str | None]:
    def value_of(ref: str) -> str | None:
        return scalar_text(resolve_tokens(raw, pointer_tokens(ref))) if ref.startswith("/") else None

    return value_of


def _const(value: str) -> Callable[[str], str | None]:
    """A reference resolver that gives ``value`` for every name (a secret header's ``{secret}``)."""
    return lambda _ref: value


def _path_quote(value: str) -> str:
    return quote(value, safe="")


def _same(value: str) -> str:
    return value


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


class Provider:
    """One route's sender API for one pass (secrets loaded when it is made: a rotated file takes
    effect at the next pass)."""

    def __init__(self, spec: ReconcileSpec, session: aiohttp.ClientSession) -> None:
        self.spec = spec
        self.session = session
        self.origin = _origin(spec.list.url)
        self.host = self.origin[1]
        #: Names of the secret references the requests use (the receipts' verification label).
        self.key_refs: list[str] = []
        self._secrets: dict[int, str] = {}
        for req in (spec.list, spec.item.fetch, spec.redeliver):
            for header in req.headers.values() if req is not None else ():
                self._load(header)
        #: 429s honoured during this pass (each also counted by the caller's metrics).
        self.rate_limited = 0

    def _load(self, header: HeaderValue) -> None:
        if header.secret is None or id(header) in self._secrets:
            return
        try:
            key = load_secret(header.secret)
        except SecretUnavailable as exc:
            raise ProviderError(SECRET_UNAVAILABLE, str(exc)) from None
        self._secrets[id(header)] = key.key.decode("utf-8", "replace")
        if key.name not in self.key_refs:
            self.key_refs.append(key.name)

    def _headers(self, req: RequestSpec) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, header in req.headers.items():
            if header.value is not None:
                out[name] = header.value
            else:
                out[name] = render(header.template, _const(self._secrets[id(header)]), _same)
        return out

    # -- requests ------------------------------------------------------------------------------

    async def _send(
        self, req: RequestSpec, url: str, query: dict[str, str] | None, what: str
    ) -> tuple[bytes, Mapping[str, str]]:
        """One request with its retries; the body (bounded) and the response headers."""
        headers = self._headers(req)
        timeout = aiohttp.ClientTimeout(total=self.spec.timeout)
        transient = rate_limited = 0
        limit = self.spec.max_page_bytes
        while True:
            try:
                async with self.session.request(
                    req.method, url, params=query, headers=headers, timeout=timeout, allow_redirects=False
                ) as resp:
                    status = resp.status
                    if 200 <= status < 300:
                        declared = resp.content_length
                        if declared is not None and declared > limit:
                            raise ProviderError(PAGE_TOO_LARGE, f"{what}: {declared} bytes > {limit}")
                        body = await resp.content.read(limit + 1)
                        if len(body) > limit:
                            raise ProviderError(PAGE_TOO_LARGE, f"{what}: more than {limit} bytes")
                        return body, resp.headers
                    retry_after = resp.headers.get("Retry-After")
            except ProviderError:
                raise
            except TimeoutError:
                fault, status, retry_after = TIMEOUT, 0, None
            except aiohttp.ClientError:
                fault, status, retry_after = CONNECT, 0, None
            else:
                fault = _status_fault(status)
            if fault == RATE_LIMITED:
                wait = _retry_after_s(retry_after)
                rate_limited += 1
                self.rate_limited += 1
                if rate_limited > RATE_LIMIT_RETRIES or wait is None or wait > self.spec.max_retry_after:
                    raise ProviderError(
                        RATE_LIMITED, f"{what}: HTTP 429 (Retry-After {retry_after or 'absent'})"
                    )
                await asyncio.sleep(wait)
                continue
            if fault in (HTTP_5XX, TIMEOUT, CONNECT) and transient < TRANSIENT_RETRIES:
                transient += 1
                await asyncio.sleep(0.2 * transient)
                continue
            raise ProviderError(fault, f"{what}: HTTP {status}" if status else what)

    async def _json(
        self, req: RequestSpec, url: str, query: dict[str, str] | None, what: str
    ) -> tuple[Any, Mapping[str, str]]:
        body, headers = await self._send(req, url, query, what)
        try:
            if len(body) >= 128 * 1024:  # parsing a large page would hold the ingress' event loop
                doc = await asyncio.to_thread(json.loads, body)
            else:
                doc = json.loads(body)
        except (ValueError, RecursionError):
            raise ProviderError(MALFORMED_JSON, f"{what}: the answer is not JSON") from None
        return doc, headers

    # -- the list --------------------------------------------------------------------------------

    def _list_request(self, since: float, until: float, cursor: str | None) -> tuple[str, dict[str, str]]:
        spec = self.spec
        values = {
            "since": _format_time(since, spec.time_format),
            "until": _format_time(until, spec.time_format),
            "cursor": cursor or "",
        }
        url = render(spec.list.url, values.get, _path_quote)
        query = {}
        for name, template in spec.list.query.items():
            value = render(template, values.get, _same)
            if value:
                query[name] = value
        return url, query

    async def pages(self, since: float, until: float, resume: str | None = None) -> AsyncIterator[Page]:
        """The items that occurred in ``[since, until)``, page by page; ``resume``: the ``next`` of
        the last page a previous (interrupted) pass finished."""
        spec = self.spec
        seen: set[str] = set()
        nxt = resume
        number = 0
        items_ptr = pointer_tokens(spec.items)
        id_ptr = pointer_tokens(spec.item.id)
        at_ptr = pointer_tokens(spec.item.occurred_at)
        while True:
            number += 1
            if number > spec.max_pages:
                raise ProviderError(TOO_MANY_PAGES, f"more than {spec.max_pages} pages in one pass")
            if nxt is not None and nxt.startswith(("https://", "http://")):
                if _origin(nxt) != self.origin:  # a checkpoint written by another spec
                    raise ProviderError(FOREIGN_URL, f"page {number}: the resumed page is on another host")
                url, query = nxt, None
            else:
                url, query = self._list_request(since, until, nxt)
            doc, headers = await self._json(spec.list, url, query, f"page {number}")
            raw_items = resolve_tokens(doc, items_ptr)
            if not isinstance(raw_items, list):
                raise ProviderError(
                    MALFORMED_JSON, f"page {number}: no item list at {spec.items or '(the page)'}"
                )
            items: list[Item] = []
            exhausted = False
            for index, raw in enumerate(raw_items):
                ident = scalar_text(resolve_tokens(raw, id_ptr))
                if ident is None:
                    raise ProviderError(
                        ITEM_WITHOUT_ID, f"page {number}, item {index}: no id at {spec.item.id}"
                    )
                at = instant_seconds(scalar_text(resolve_tokens(raw, at_ptr)))
                if at is None:
                    raise ProviderError(
                        ITEM_WITHOUT_TIME, f"page {number}, item {index}: no time at {spec.item.occurred_at}"
                    )
                if at < since:
                    exhausted = exhausted or spec.order == "newest_first"
                    continue
                if at >= until:
                    if spec.order == "oldest_first":
                        exhausted = True
                    continue
                items.append(Item(ident, at, raw))
            nxt = None if exhausted or not raw_items else self._next(doc, headers, raw_items, number)
            if nxt is not None and nxt.startswith(("https://", "http://")) and _origin(nxt) != self.origin:
                # A URL the sender gave is followed only on the list's own scheme, host and port (the
                # list's credentials go with it); refused before this page counts, so no checkpoint
                # ever holds it.
                raise ProviderError(FOREIGN_URL, f"page {number}: the sender's next page is on another host")
            if nxt is not None:
                if nxt in seen:
                    raise ProviderError(CURSOR_LOOP, f"page {number}: the sender repeated a cursor")
                seen.add(nxt)
            yield Page(number, items, nxt, exhausted)
            if nxt is None:
                return

    def _next(self, doc: Any, headers: Mapping[str, str], raw_items: list[Any], number: int) -> str | None:
        paging = self.spec.paging
        if paging.cursor is not None:
            if (
                paging.has_more is not None
                and resolve_tokens(doc, pointer_tokens(paging.has_more)) is not True
            ):
                return None
            return scalar_text(resolve_tokens(raw_items[-1], pointer_tokens(paging.cursor)))
        if paging.next is not None:
            value = scalar_text(resolve_tokens(doc, pointer_tokens(paging.next)))
            if value and value.startswith("/"):  # a path on the list's host
                scheme, host, port = self.origin
                value = f"{scheme}://{host}{f':{port}' if port else ''}{value}"
            return value or None
        for link in headers.getall("Link", []) if hasattr(headers, "getall") else [headers.get("Link", "")]:
            for url, params in _LINK_RE.findall(link or ""):
                rels = re.findall(r'rel\s*=\s*"?([^";,]+)"?', params)
                if any(paging.link in r.split() for r in rels):
                    return url
        return None

    # -- per item --------------------------------------------------------------------------------

    async def body_of(self, item: Item) -> bytes:
        """The item's body as the webhook would have carried it (JSON text)."""
        spec = self.spec.item
        if spec.fetch is None:
            value = resolve_tokens(item.raw, pointer_tokens(spec.body or ""))
        else:
            url = render(spec.fetch.url, _item_value(item.raw), _path_quote)
            query = {
                k: v for k, t in spec.fetch.query.items() if (v := render(t, _item_value(item.raw), _same))
            }
            doc, _ = await self._json(spec.fetch, url, query or None, f"item {item.id[:64]}")
            value = resolve_tokens(doc, pointer_tokens(spec.fetch.body))
        if value is None:
            raise ProviderError(BODY_MISSING, "an item has no body at the configured pointer")
        if isinstance(value, str):
            return value.encode()
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()

    async def redeliver(self, item: Item) -> None:
        req = self.spec.redeliver
        assert req is not None
        url = render(req.url, _item_value(item.raw), _path_quote)
        query = {k: v for k, t in req.query.items() if (v := render(t, _item_value(item.raw), _same))}
        await self._send(req, url, query or None, "redeliver")


def _status_fault(status: int) -> str:
    if status == 429:
        return RATE_LIMITED
    if status in (401, 403):
        return UNAUTHORIZED
    if status >= 500:
        return HTTP_5XX
    return HTTP_4XX


def _retry_after_s(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` (delta seconds or an HTTP date); ``None`` when absent or bad."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _format_time(seconds: float, fmt: str) -> str:
    if fmt == "unix":
        return str(int(seconds))
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(seconds)))

"""Server-side sessions: the browser holds only a random session id (HttpOnly, SameSite=Strict,
Secure under TLS); the admin token it logged in with stays in this process's memory, never in a
cookie, a page, a log line or a URL.

A session ends after ``idle_s`` without a request, after ``max_age_s`` in any case, at logout, or
when the console restarts (log in again). Each session has its own CSRF token (synchronizer token
pattern) that every state-changing request must carry. The map is keyed by the SHA-256 of the
session id, so the ids themselves are not kept.

One-time login links (``connector up`` prints one): a random nonce bound to a token, valid once and
for ``link_ttl_s``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field


def _key(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode()).digest()


@dataclass(slots=True)
class Caller:
    """Who a session acts as, as the admin API reported it (GetCaller)."""

    key_id: str
    roles: frozenset[str]
    allowed_methods: frozenset[str]
    may_see_payload: bool

    def may(self, method: str) -> bool:
        return method in self.allowed_methods


@dataclass(slots=True)
class Session:
    token: str = field(repr=False)
    caller: Caller
    csrf: str = field(repr=False)
    created: float
    last_seen: float
    #: One-line outcomes of actions, shown once on the next page (Post/Redirect/Get).
    flash: list[tuple[str, str]] = field(default_factory=list)


class SessionStore:
    def __init__(
        self,
        *,
        idle_s: float = 1800.0,
        max_age_s: float = 12 * 3600.0,
        link_ttl_s: float = 600.0,
        max_sessions: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_s = idle_s
        self.max_age_s = max_age_s
        self.link_ttl_s = link_ttl_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._sessions: dict[bytes, Session] = {}
        self._links: dict[bytes, tuple[str, float]] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, token: str, caller: Caller) -> tuple[str, Session]:
        self._sweep()
        if len(self._sessions) >= self.max_sessions:  # bounded: evict the least recently used
            oldest = min(self._sessions, key=lambda k: self._sessions[k].last_seen)
            del self._sessions[oldest]
        now = self._clock()
        session_id = secrets.token_urlsafe(32)
        session = Session(token, caller, secrets.token_urlsafe(32), now, now)
        self._sessions[_key(session_id)] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of a cookie value (touching it), or None (unknown, idle or too old)."""
        if not session_id or len(session_id) > 128:
            return None
        key = _key(session_id)
        session = self._sessions.get(key)
        if session is None:
            return None
        now = self._clock()
        if now - session.last_seen > self.idle_s or now - session.created > self.max_age_s:
            del self._sessions[key]
            return None
        session.last_seen = now
        return session

    def delete(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(_key(session_id), None)

    def _sweep(self) -> None:
        now = self._clock()
        for key in [
            k
            for k, s in self._sessions.items()
            if now - s.last_seen > self.idle_s or now - s.created > self.max_age_s
        ]:
            del self._sessions[key]
        for key in [k for k, (_, t) in self._links.items() if now - t > self.link_ttl_s]:
            del self._links[key]

    # One-time login links ---------------------------------------------------------------------

    def link(self, token: str) -> str:
        self._sweep()
        nonce = secrets.token_urlsafe(32)
        self._links[_key(nonce)] = (token, self._clock())
        return nonce

    def redeem(self, nonce: str) -> str | None:
        """The token of a login link, once; None when unknown, used or expired."""
        if not nonce or len(nonce) > 128:
            return None
        entry = self._links.pop(_key(nonce), None)
        if entry is None or self._clock() - entry[1] > self.link_ttl_s:
            return None
        return entry[0]


def csrf_ok(session: Session, presented: str | None) -> bool:
    return bool(presented) and hmac.compare_digest(session.csrf.encode(), (presented or "").encode())

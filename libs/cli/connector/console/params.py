"""Query and form input: every value a page reads goes through here and is either valid or a 400
that names the field and the rule (never echoing the value). The admin API's input stage applies
underneath; this layer keeps the console from sending what it knows is wrong and from ever turning
bad input into a 5xx."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

MAX_TEXT = 1024
INT64_MAX = 2**63 - 1
_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class BadInput(web.HTTPBadRequest):
    def __init__(self, field: str, rule: str) -> None:
        super().__init__(text=f"invalid {field}: {rule}")
        self.field = field


def _clean(value: str, field: str, max_len: int) -> str:
    if len(value) > max_len:
        raise BadInput(field, f"at most {max_len} characters")
    if "\x00" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise BadInput(field, "contains a character that cannot be stored (NUL or a lone surrogate)")
    return value.strip()


class Params:
    """Typed reads of ``request.query`` or a posted form. Absent or empty means "not given"."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = values

    def raw(self, name: str) -> str:
        value = self._values.get(name)
        return value if isinstance(value, str) else ""

    def text(self, name: str, *, max_len: int = MAX_TEXT) -> str:
        return _clean(self.raw(name), name, max_len)

    def integer(self, name: str, *, minimum: int = 0, maximum: int = INT64_MAX) -> int | None:
        text = self.text(name, max_len=24)
        if not text:
            return None
        if not text.lstrip("-").isdigit():
            raise BadInput(name, "not a whole number")
        value = int(text)
        if value < minimum or value > maximum:
            raise BadInput(name, f"must be between {minimum} and {maximum}")
        return value

    def reason(self, name: str = "reason") -> str:
        """An operator's reason for an action: required, kept with the change and in the audit log."""
        reason = self.text(name, max_len=500)
        if not reason:
            raise BadInput(name, "required: say why (kept with the change and in the audit log)")
        return reason

    def choice(self, name: str, options: Iterable[str]) -> str:
        text = self.text(name, max_len=64)
        allowed = tuple(options)
        if text and text not in allowed:
            raise BadInput(name, f"one of {', '.join(allowed)}")
        return text

    def ids(self, name: str, *, limit: int = 1000) -> list[int]:
        getall = getattr(self._values, "getall", None)
        values = getall(name, []) if getall is not None else []
        if len(values) > limit:
            raise BadInput(name, f"at most {limit} selected")
        out: list[int] = []
        for value in values:
            if not isinstance(value, str) or not value.isdigit() or not 0 < int(value) <= INT64_MAX:
                raise BadInput(name, "positive whole numbers")
            out.append(int(value))
        return sorted(set(out))

    def since(self, name: str) -> datetime | None:
        """A relative age (``90s``, ``15m``, ``2h``, ``7d``) or an ISO-8601 instant."""
        text = self.text(name, max_len=40)
        if not text:
            return None
        unit = _DURATION.get(text[-1:])
        if unit is not None and text[:-1].isdigit():
            seconds = int(text[:-1]) * unit
            if seconds > 3650 * 86400:
                raise BadInput(name, "at most 3650 days back")
            return datetime.now(UTC) - timedelta(seconds=seconds)
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise BadInput(name, "an age such as 2h or 7d, or a time such as 2026-12-01T10:00:00Z") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        if not datetime(1, 1, 2, tzinfo=UTC) <= moment <= datetime(9999, 12, 30, tzinfo=UTC):
            raise BadInput(name, "out of range")
        return moment

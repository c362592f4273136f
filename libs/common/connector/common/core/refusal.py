"""``Refused``: the one shape of a domain refusal (a machine-readable ``reason`` and a message safe to
show an operator). The pack store, the cutover gates and the legacy outcome resolution raise their own
subclasses; the admin API maps each ``reason`` to a gRPC status and ``ErrorInfo`` reason."""

from __future__ import annotations


class Refused(Exception):
    """An operation that does not apply; nothing was changed."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

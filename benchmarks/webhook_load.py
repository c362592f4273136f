"""Signed webhook requests on a raw keep-alive connection: the inner loop shared by the load
generators of the ingress and end-to-end benchmarks (Standard Webhooks v1 signature)."""

from __future__ import annotations

import asyncio
import base64
import hmac


def signed_request(
    path: bytes, host: str, port: int, key: bytes, msg_id: bytes, ts: bytes, body: bytes
) -> bytes:
    """One HTTP/1.1 POST with ``webhook-id``/``webhook-timestamp``/``webhook-signature`` headers."""
    sig = base64.b64encode(hmac.digest(key, msg_id + b"." + ts + b"." + body, "sha256"))
    return (
        b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nwebhook-id: %s\r\nwebhook-timestamp: %s\r\n"
        b"webhook-signature: v1,%s\r\n\r\n%s"
    ) % (path, host.encode(), port, len(body), msg_id, ts, sig, body)


async def read_status(reader: asyncio.StreamReader) -> int:
    """Read one response (head and body) and return its status code."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return int(head[9:12])

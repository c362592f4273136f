"""The smoke stack's HTTP work handler (deploy/smoke/docker-compose.smoke.yml, service `receiver`).

The smoke pack's work type POSTs every WorkItem here (connector.executor.handlers.http). Each call
is recorded (work id, attempt, lease token, idempotency key, the caller's address, the answer) —
never the payload. A first attempt (``X-Connector-Attempt: 1``) of a delivery whose JSON payload
has ``"hold": true`` is held until ``POST /release`` (or HOLD_MAX_S, then 503 so it retries): the
smoke kills the executor holding such calls and checks every one completes elsewhere.

    POST /work      the handler endpoint (200 = success)
    POST /release   answer every held call (and every later first attempt) at once
    GET  /calls     the record, JSON
    GET  /healthz   200

Standard library only; runs with the connector image's interpreter.
"""

from __future__ import annotations

import base64
import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOLD_MAX_S = 12.0
LOCK = threading.Lock()
CALLS: list[dict[str, object]] = []
RELEASED = threading.Event()


def _holds(document: dict[str, object]) -> bool:
    raw = document.get("payload_base64")
    if not isinstance(raw, str):
        return False
    try:
        payload = json.loads(base64.b64decode(raw))
    except ValueError:
        return False
    return isinstance(payload, dict) and payload.get("hold") is True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self, status: int, body: bytes = b"", content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._answer(200, b"ok", "text/plain")
        elif self.path == "/calls":
            with LOCK:
                body = json.dumps({"released": RELEASED.is_set(), "calls": CALLS}).encode()
            self._answer(200, body)
        else:
            self._answer(404)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path == "/release":
            RELEASED.set()
            self._answer(200, b"{}")
            return
        if self.path != "/work":
            self._answer(404)
            return
        document = json.loads(raw)
        attempt = int(self.headers.get("X-Connector-Attempt") or 0)
        call: dict[str, object] = {
            "work_id": int(self.headers.get("X-Connector-Work-Id") or 0),
            "attempt": attempt,
            "lease_token": int(self.headers.get("X-Connector-Lease-Token") or 0),
            "idempotency_key": self.headers.get("Idempotency-Key"),
            "peer": self.client_address[0],
            "held": attempt == 1 and _holds(document),
            "started": time.time(),
            "status": None,
        }
        with LOCK:
            CALLS.append(call)
        status = 200
        if call["held"] and not RELEASED.wait(HOLD_MAX_S):
            status = 503
        try:
            self._answer(status, b"{}")
            outcome = status
        except OSError:  # the caller is gone (its executor was killed)
            outcome = "caller_gone"
        with LOCK:
            call["status"] = outcome
            call["finished"] = time.time()

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    server = ThreadingHTTPServer(("0.0.0.0", 8000), Handler)  # inside its container
    server.daemon_threads = True
    # PID 1 of its container: without a handler SIGTERM would be ignored until the stop timeout.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


if __name__ == "__main__":
    main()

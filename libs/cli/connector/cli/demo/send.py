"""``connector demo send``: signed deliveries to the demo route of a running ``connector up``.

Each delivery is a real HTTP POST to the ingress (``/v1/webhooks/demo/events``), signed with the
demo's Standard Webhooks secret (``CONNECTOR_DATA_DIR/demo-webhook-secret``, written by
``connector up``). ``--fail`` asks the demo's ``deliver`` handler to fail every attempt the item
gets, so it ends in the dead-letter queue; a replay then succeeds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from connector.cli import demo
from connector.common.core import settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fail",
        action="store_true",
        help=f"make the delivery's 'deliver' work item fail all {demo.DELIVER_MAX_ATTEMPTS} attempts"
        " (it becomes a dead letter; a replay succeeds)",
    )
    parser.add_argument(
        "--count", type=_count, default=1, help="how many deliveries to send (default 1, at most 10000)"
    )
    parser.add_argument(
        "--url",
        help="the demo route's URL (default: http://CONNECTOR_INGRESS_HTTP_HOST:PORT/v1/webhooks/demo/events)",
    )
    parser.add_argument(
        "--secret-file",
        help="the demo's Standard Webhooks secret (default: CONNECTOR_DATA_DIR/demo-webhook-secret)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per delivery")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"must be 1 to 10000: {text!r}")
    return value


def default_url() -> str:
    cfg = settings.load(settings.IngressSettings)
    host = "127.0.0.1" if cfg.http_host in ("0.0.0.0", "::", "") else cfg.http_host
    return f"http://{host}:{cfg.http_port}/v1/webhooks/{demo.NAMESPACE}/{demo.ROUTE_KEY}"


def default_secret_file() -> Path:
    return Path(settings.load(settings.DatabaseSettings).data_dir) / demo.SECRET_FILE


class SendError(Exception):
    """A delivery could not be sent or was refused (one line for the user)."""


def send_one(url: str, key: str, *, fail: bool, timeout_s: float = 10.0) -> dict[str, object]:
    if not url.startswith(("http://", "https://")):
        raise SendError(f"--url must be an http:// or https:// URL, not {url!r}")
    msg_id = f"msg_{uuid.uuid4().hex}"
    payload = demo.body(uuid.uuid4().hex[:12], fail_attempts=demo.DELIVER_MAX_ATTEMPTS if fail else 0)
    request = urllib.request.Request(  # noqa: S310 (http or https, checked above)
        url, data=payload, headers=demo.headers(key, msg_id, int(time.time()), payload), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310
            status, text = resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace").strip()
        raise SendError(f"{url} answered HTTP {exc.code}: {_reason(detail)}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SendError(
            f"cannot reach {url} ({reason}): is `connector up` running? (--url, or"
            " CONNECTOR_INGRESS_HTTP_PORT as `connector up` had it; `. .data/env` sets it)"
        ) from None
    answer = json.loads(text) if text.startswith("{") else {}
    return {
        "status": status,
        "receipt_id": answer.get("receipt_id"),
        "duplicate": answer.get("duplicate"),
        "delivery_id": msg_id,
        "fail": fail,
    }


def _reason(detail: str) -> str:
    try:
        doc = json.loads(detail)
    except ValueError:
        return detail[:200] or "(no body)"
    if isinstance(doc, dict):
        return str(doc.get("reason") or doc.get("error") or doc)[:200]
    return detail[:200]


def cli(args: argparse.Namespace) -> int:
    url = args.url or default_url()
    secret_path = Path(args.secret_file) if args.secret_file else default_secret_file()
    try:
        key = secret_path.read_text().strip()
    except OSError as exc:
        print(
            f"error: cannot read the demo secret {secret_path} ({exc.strerror}): run `connector up` first,"
            " or set CONNECTOR_DATA_DIR / --secret-file to the data folder it uses",
            file=sys.stderr,
        )
        return 1
    sent: list[dict[str, object]] = []
    for _ in range(args.count):
        try:
            result = send_one(url, key, fail=args.fail)
        except SendError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        sent.append(result)
        if args.json:
            print(json.dumps(result, sort_keys=True))
        else:
            note = f" (its 'deliver' item fails {demo.DELIVER_MAX_ATTEMPTS} times)" if args.fail else ""
            print(
                f"sent {result['delivery_id']}: HTTP {result['status']}, receipt {result['receipt_id']}"
                f"{' (duplicate)' if result['duplicate'] else ''}{note}"
            )
    if not args.json and sent:
        last = sent[-1]
        print(f"follow it:   connector admin trace {last['receipt_id']}")
        if args.fail:
            print("dead letters (a few seconds later):   connector admin dlq list --pack demo")
    return 0

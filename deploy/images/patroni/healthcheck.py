"""Container health of a Patroni node: Patroni's REST API answers GET /health with 200 while its
PostgreSQL runs (leader or replica). Exit 0 = healthy. Standard library only."""

import sys
import urllib.request

try:
    with urllib.request.urlopen("http://127.0.0.1:8008/health", timeout=3) as resp:  # noqa: S310
        sys.exit(0 if resp.status == 200 else 1)
except OSError as exc:
    print(f"patroni-healthcheck: {exc}", file=sys.stderr)
    sys.exit(1)

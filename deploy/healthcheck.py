#!/usr/bin/env python3
"""Container health probe (installed as ``connector-healthcheck`` in the image).

  connector-healthcheck http URL            healthy when GET URL answers 2xx
  connector-healthcheck grpc HOST:PORT [S]  healthy when grpc.health.v1 Check(S) is SERVING
                                            (S = service name, default "" = the whole server)

Exit 0 when healthy, 1 otherwise; prints one line. Standard library + grpcio only, 2 s timeout.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

TIMEOUT_S = 2.0


def check_http(url: str) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:  # noqa: S310 - probe of our own URL
            return 200 <= resp.status < 300, f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except OSError as exc:
        return False, type(exc).__name__


def check_grpc(target: str, service: str = "") -> tuple[bool, str]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S
            )
        except grpc.RpcError as exc:
            return False, f"gRPC {exc.code().name}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, status


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "http":
        ok, detail = check_http(argv[1])
    elif len(argv) in (2, 3) and argv[0] == "grpc":
        ok, detail = check_grpc(*argv[1:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(("healthy: " if ok else "unhealthy: ") + detail)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``connector admin``: operator commands over the admin gRPC API (docs/admin.md).

    connector admin dlq list|show|replay      dead letters: list, inspect, replay (one, many, by filter)
    connector admin dlq legacy                dead letters of the legacy Event path (legacy generations)
    connector admin receipts failed|replay    receipts whose routing failed
    connector admin stats                     queue depth, ready age, in-flight, rates, receipts
    connector admin lanes blocked             lanes held by a dead, retrying or fenced head
    connector admin packs list|apply|activate pack generations
    connector admin cutover status            claim path, phase, receipts, fences per generation
    connector admin cutover quiesce|cutover|rollback|abort|reconcile|resolve   gates (docs/cutover.md)
    connector admin processes                 registered service processes, heartbeat age, stale
    connector admin cancel|pause|resume       discard a work item; pause/resume a pack or queue class
    connector admin find                      deliveries by provider id, key, correlation id, filter
    connector admin trace                     one delivery's chain and why each WorkItem waits

Target ``CONNECTOR_ADMIN_ADDRESS`` (default 127.0.0.1:50053) or ``--address``; bearer token from
``CONNECTOR_ADMIN_TOKEN`` or ``--token-file``; TLS with ``--tls-ca-file`` (+ ``--tls-cert-file`` /
``--tls-key-file`` for mTLS). Tables by default, ``--json`` for scripts. A failed call prints
``error: <CODE> <reason>: <message>`` on stderr and exits 1 (2 for usage errors, 130 on Ctrl-C).
"""

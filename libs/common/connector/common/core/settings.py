"""Configuration: environment variables with the ``CONNECTOR_`` prefix (pydantic-settings).

Every default works for a local run. Each service has its own section (its own env prefix) and its
own database pool size, so that ingress never waits behind background work. Secrets are
``SecretStr`` and never printed. ``load()`` fails fast with one readable message listing every
problem.
"""

from __future__ import annotations

from typing import Literal, TypeVar
from urllib.parse import parse_qsl

import psycopg
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class SettingsError(SystemExit):
    """Raised at start-up when configuration is invalid; the message names each bad variable."""


class DatabaseSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CONNECTOR_", extra="ignore")

    #: libpq URL (``postgresql://user@host:5432/db``). Unset: ``connector up`` starts an embedded
    #: PostgreSQL in ``CONNECTOR_DATA_DIR``.
    database_url: SecretStr | None = None
    data_dir: str = ".data"
    #: Statement timeout applied to every pooled connection (milliseconds, 0 = none).
    statement_timeout_ms: int = Field(default=30_000, ge=0)
    #: ``jit = off`` on every pooled connection (a startup option, like the statement timeout). The
    #: services send short OLTP statements; a big one whose estimated cost passes
    #: ``jit_above_cost`` (the flow claim at a backlog of 1M rows) paid 0.2-2.6 s of JIT compilation
    #: per execution for a 3 ms statement. ``false`` leaves the server's setting (docs/deploy.md).
    disable_jit: bool = True
    #: How long a service waits at start for its pool's first connections before it gives up with
    #: "database unavailable" (seconds).
    connect_timeout_s: float = Field(default=10.0, gt=0)

    #: libpq parameters added to every connection unless the URL sets them (docs/deploy.md
    #: "Failover"): a dead or silent server is noticed within seconds instead of the kernel's ~2 h
    #: (keepalives) or ~15 min (unacknowledged data). 0 = not added (libpq's default: none).
    #: Seconds per host to establish a connection (a multi-host URL tries the next host after it).
    db_connect_timeout_s: int = Field(default=3, ge=0)
    #: TCP keepalives on idle connections: first probe after ``idle`` s, then every ``interval`` s,
    #: dropped after ``count`` unanswered probes.
    db_keepalives_idle_s: int = Field(default=5, ge=0)
    db_keepalives_interval_s: int = Field(default=2, ge=0)
    db_keepalives_count: int = Field(default=3, ge=0)
    #: Milliseconds sent data may stay unacknowledged before the connection is dropped (a statement
    #: sent to a server that went silent fails after this instead of waiting for ever).
    db_tcp_user_timeout_ms: int = Field(default=6_000, ge=0)
    #: Longest wait between a pool's attempts to replace a lost connection (seconds). psycopg_pool
    #: waits 1 s, then doubles (2, 4, 8, 16, 32 s ...): after ~20 s without a writable server (a
    #: Patroni promotion) its next attempt came up to 50 s after the new primary took writes. 0 =
    #: psycopg_pool's own backoff, uncapped.
    db_reconnect_max_delay_s: float = Field(default=2.0, ge=0)
    #: ``lock_timeout`` of every pooled connection (milliseconds, 0 = none): a statement waiting on
    #: a lock fails with SQLSTATE 55P03 after this, below the statement timeout.
    lock_timeout_ms: int = Field(default=10_000, ge=0)
    #: A pooled connection whose server refuses writes (SQLSTATE 25006: a standby, an old primary
    #: fenced or back as a standby) is closed at once and the idle pool drained; false keeps it.
    evict_read_only: bool = True
    #: How often each service's ``ServerWatch`` asks which server its pool reaches (seconds; 0 = no
    #: watch): a change (system identifier, timeline, address, recovery) drains the idle pool and
    #: re-establishes LISTEN sessions (docs/deploy.md "Failover").
    server_watch_interval_s: float = Field(default=2.0, ge=0)

    @field_validator("database_url")
    @classmethod
    def _scheme(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None or not v.get_secret_value().strip():
            return None
        raw = v.get_secret_value().strip()
        if raw.startswith("postgresql+psycopg://"):
            raw = raw.replace("postgresql+psycopg://", "postgresql://", 1)
        return SecretStr(check_libpq_url(raw))

    def url(self) -> str:
        if self.database_url is None:
            raise SettingsError(
                "error: CONNECTOR_DATABASE_URL is not set: set it to postgresql://user:password@host:5432/db"
                " (while `connector up` runs, its banner shows the embedded database's URL and"
                " `. .data/env` sets it)"
            )
        return self.database_url.get_secret_value()

    def network_params(self) -> dict[str, str]:
        """The connection parameters this process adds unless the URL sets them (0 = not added)."""
        out = {"keepalives": "1"}
        for key, value in (
            ("connect_timeout", self.db_connect_timeout_s),
            ("keepalives_idle", self.db_keepalives_idle_s),
            ("keepalives_interval", self.db_keepalives_interval_s),
            ("keepalives_count", self.db_keepalives_count),
            ("tcp_user_timeout", self.db_tcp_user_timeout_ms),
        ):
            if value:
                out[key] = str(value)
        return out

    def conninfo(self, url: str | None = None) -> str:
        """The libpq connection string of ``url`` (default: ``CONNECTOR_DATABASE_URL``) with
        ``network_params()`` added where it does not set them. Every pool and every direct
        connection of a service or command opens with this (docs/deploy.md "Failover")."""
        params = psycopg.conninfo.conninfo_to_dict(url or self.url())
        for key, value in self.network_params().items():
            params.setdefault(key, value)
        return psycopg.conninfo.make_conninfo("", **params)


#: What the settings say about a URL libpq would not take as meant.
LIBPQ_FORMS = (
    "write postgresql://user:password@host1:5432,host2:5432/db?target_session_attrs=read-write"
    " (libpq's multi-host URL) or the key=value form host=host1,host2 port=5432,5432 dbname=db"
)


def check_libpq_url(raw: str) -> str:
    """``raw`` when libpq parses it as meant: a ``postgresql://`` / ``postgres://`` URL (multi-host
    included) or the ``key=value`` form. Refused with one line: another scheme, a string libpq cannot
    parse, and SQLAlchemy's ``?host=h:p&host=h:p`` multi-host form (libpq would read ``h:p`` as a
    host name and fail at connect time). The message never repeats the string (it may hold a
    password)."""
    is_url = "://" in raw.split("=", 1)[0] or raw.startswith(("postgresql://", "postgres://"))
    if is_url and not raw.startswith(("postgresql://", "postgres://")):
        raise ValueError(f"must be a postgresql:// URL: {LIBPQ_FORMS}")
    if not is_url and "=" not in raw:
        raise ValueError(f"must be a postgresql:// URL or libpq key=value string: {LIBPQ_FORMS}")
    if is_url and "?" in raw:
        query = parse_qsl(raw.split("?", 1)[1], keep_blank_values=True)
        hosts = [v for k, v in query if k == "host"]
        if len(hosts) > 1 or any(":" in h and not h.startswith("/") for h in hosts):
            raise ValueError(
                "the SQLAlchemy form ?host=h:p&host=h:p is not libpq's (it would fail to connect):"
                f" {LIBPQ_FORMS}"
            )
    try:
        psycopg.conninfo.conninfo_to_dict(raw)
    except psycopg.ProgrammingError:
        raise ValueError(f"libpq cannot parse it: {LIBPQ_FORMS}") from None
    return raw


class LogSettings(BaseSettings):
    """Logging of every ``connector`` command (``connector.common.core.logs``). Unset values take the
    command's default: the services log JSON at INFO without per-delivery lines; ``connector up``
    logs text at INFO with one line per accepted delivery."""

    model_config = SettingsConfigDict(env_prefix="CONNECTOR_LOG_", extra="ignore")

    #: ``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``.
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] | None = None
    #: ``json`` (one object per line, for log collectors) or ``text`` (one readable line).
    format: Literal["json", "text"] | None = None
    #: One INFO line per accepted (and duplicate) delivery at the ingress. Off by default in the
    #: services (a per-item line on the hot path); refusals, routing failures, dead letters,
    #: replays and cancels have their own lines either way (rate-limited per reason).
    deliveries: bool | None = None

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, v: object) -> object:
        return (v.strip().upper() or None) if isinstance(v, str) else v

    @field_validator("format", mode="before")
    @classmethod
    def _lower(cls, v: object) -> object:
        return (v.strip().lower() or None) if isinstance(v, str) else v


class PoolSettings(BaseSettings):
    pool_min_size: int = Field(default=2, ge=1)
    pool_max_size: int = Field(default=8, ge=1)
    #: Seconds a request waits for a pooled connection before the service answers "busy".
    pool_timeout_s: float = Field(default=2.0, gt=0)


class UpkeepSettings(PoolSettings):
    """Queue-table VACUUM/ANALYZE by the service itself (connector.common.maintenance.upkeep, ADR 008)."""

    #: ``auto``: only while autovacuum is off for a table; ``on``: always; ``off``: never.
    upkeep_mode: Literal["auto", "on", "off"] = "auto"
    upkeep_interval_s: float = Field(default=2.0, gt=0)
    #: VACUUM when dead row versions exceed rows + fraction x live rows.
    upkeep_vacuum_dead_rows: int = Field(default=20_000, ge=0)
    upkeep_vacuum_dead_fraction: float = Field(default=0.05, ge=0)
    #: ANALYZE when rows changed since the last analyze exceed rows + fraction x live rows.
    upkeep_analyze_rows: int = Field(default=100_000, ge=0)
    upkeep_analyze_fraction: float = Field(default=0.50, ge=0)


class IngressSettings(PoolSettings):
    model_config = SettingsConfigDict(env_prefix="CONNECTOR_INGRESS_", extra="ignore")

    #: Worker processes sharing the HTTP and gRPC ports (SO_REUSEPORT); 1 = this process serves.
    processes: int = Field(default=1, ge=1, le=64)
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8080, ge=0, le=65535)
    #: Bind addresses of the gRPC and metrics listeners (``0.0.0.0`` in containers).
    grpc_host: str = "127.0.0.1"
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=9101, ge=0, le=65535)
    #: Largest accepted request body in bytes (413 above it; for a compressed body, the inflated size).
    max_body_bytes: int = Field(default=1_048_576, ge=1)
    #: HTTP edge defences (docs/ingress.md, "Defences"). A new connection whose request headers are
    #: not complete this many seconds after it connected is closed.
    http_header_timeout_s: float = Field(default=10.0, gt=0)
    #: A request body not complete this many seconds after its headers is answered 408 (and closed).
    http_body_timeout_s: float = Field(default=30.0, gt=0)
    #: A kept-alive connection whose next request headers are not complete this long after the
    #: previous answer is closed (nginx's default; at the cap the longest-waiting one is shed anyway).
    http_keepalive_timeout_s: float = Field(default=75.0, gt=0)
    #: Open HTTP connections at most (0: half the soft descriptor limit, at most 10,000). Past it the
    #: connection waiting longest for a request is closed first (see the docs for the order).
    http_max_connections: int = Field(default=0, ge=0)
    #: Listen backlog (lowered so that a full backlog fits in the descriptors over the cap).
    http_backlog: int = Field(default=1024, ge=1)
    #: A proxy in front sets ``X-Forwarded-For``: refusal log lines name its first hop as the peer
    #: (off: the socket's address; a sender can forge the header when nothing in front replaces it).
    http_trust_forwarded_for: bool = False
    #: Group commit: the longest a delivery waits for companions before its batch commits.
    group_commit_max_wait_ms: float = Field(default=0.0, ge=0)
    group_commit_max_batch: int = Field(default=256, ge=1)
    #: Group commit: writer tasks committing batches in parallel (each holds one pooled connection).
    group_commit_writers: int = Field(default=2, ge=1)
    #: Deliveries waiting for a commit before new ones are refused at once (503 + Retry-After).
    group_commit_max_queue: int = Field(default=8_192, ge=1)
    #: Per-namespace admission limit: deliveries in flight (not yet committed) before 429.
    namespace_max_inflight: int = Field(default=2_000, ge=1)
    retry_after_s: int = Field(default=5, ge=1)
    #: A delivery whose receipt is not committed this many seconds after it joined the commit queue
    #: is answered 503 + Retry-After (gRPC UNAVAILABLE) at once, while it waits: a provider never
    #: waits longer on a hung or silent database (GitHub gives up at 10 s). 0 = no deadline.
    commit_deadline_s: float = Field(default=5.0, ge=0, le=60)
    #: ``synchronous_commit`` of the receipt batch's transaction (``SET LOCAL``): ``remote_write``,
    #: ``on`` or ``remote_apply`` ack a delivery only once its receipt is on a synchronous standby
    #: (when the server names one in ``synchronous_standby_names``), so a failover loses no acked
    #: delivery; ``local`` / ``off`` do not wait for one. Unset: the server's (role's) setting.
    #: With a level that needs a standby, ``/readyz`` and ``connector_db_synchronous_standby_ready``
    #: say whether the server can honour it (docs/deploy.md "Failover").
    synchronous_commit: Literal["local", "remote_write", "on", "remote_apply", "off"] | None = None
    #: Statement timeout of the ingress pool (ms); a receipt insert slower than this answers 503.
    statement_timeout_ms: int = Field(default=5_000, ge=0)
    #: Fallback refresh of the route table (it also refreshes on NOTIFY ``connector_packs``).
    routes_refresh_s: float = Field(default=30.0, gt=0)
    #: Reconciliation (docs/reconcile.md): whether this process may lead the passes of routes that
    #: declare ``reconcile`` (one leader across all ingress processes), and how often it checks
    #: which are due and whether an operator asked for a run.
    reconcile_enabled: bool = True
    reconcile_tick_s: float = Field(default=5.0, gt=0, le=300)
    #: Public URL prefix providers call (``https://hooks.example.com``), for ``{uri}`` in signatures.
    public_base_url: str | None = None
    #: Seconds in-flight requests get to finish on shutdown.
    shutdown_grace_s: float = Field(default=10.0, ge=0)
    #: How often this process adds its figures (answers, ack latency) to the cluster's per-minute
    #: rollups (docs/metrics.md "Figures without Prometheus"): one statement per interval, never one
    #: per delivery; 0 = not at all.
    figures_flush_s: float = Field(default=10.0, ge=0, le=60)


class MaterializerSettings(UpkeepSettings):
    model_config = SettingsConfigDict(env_prefix="CONNECTOR_MATERIALIZER_", extra="ignore")

    #: Bind addresses of the gRPC and metrics listeners (``0.0.0.0`` in containers).
    grpc_host: str = "127.0.0.1"
    grpc_port: int = Field(default=50052, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=9102, ge=0, le=65535)
    batch_size: int = Field(default=256, ge=1)
    lease_s: float = Field(default=30.0, gt=0)
    poll_interval_s: float = Field(default=1.0, gt=0)
    max_attempts: int = Field(default=10, ge=1)
    backoff_base_s: float = Field(default=1.0, gt=0)
    backoff_cap_s: float = Field(default=300.0, gt=0)
    #: Routing workers in this process (each claims and writes its own batches).
    concurrency: int = Field(default=2, ge=1, le=64)
    #: Longest a fresh receipt waits for the commit horizon (earlier receipt ids still committing).
    horizon_wait_s: float = Field(default=5.0, ge=0)
    #: Longest a lane receipt waits for an earlier receipt of its namespace routed by another batch.
    order_wait_max_s: float = Field(default=5.0, ge=0)
    #: Fallback reload of the route cache (it also reloads on NOTIFY ``connector_packs``).
    routes_refresh_s: float = Field(default=30.0, gt=0)


class ExecutorSettings(UpkeepSettings):
    model_config = SettingsConfigDict(env_prefix="CONNECTOR_EXECUTOR_", extra="ignore")

    #: Bind addresses of the gRPC and metrics listeners (``0.0.0.0`` in containers).
    grpc_host: str = "127.0.0.1"
    grpc_port: int = Field(default=50053, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=9103, ge=0, le=65535)
    #: Claimed items that may run at once in this process (never the number of scanners: one claim
    #: loop per process).
    workers: int = Field(default=16, ge=1)
    claim_batch: int = Field(default=64, ge=1)
    lease_s: float = Field(default=30.0, gt=0)
    #: How much of a lease this process does not use (seconds; -1 = one renewal interval, lease_s / 3):
    #: a handler is started, and an async one kept running, only while the lease as last confirmed
    #: by the database — measured on the monotonic clock from before the claim or renewal was sent —
    #: minus this margin lasts. It covers a renewal confirmed by a primary that then failed over and
    #: lost it (the one before is at most an interval older) and clock skew between servers
    #: (docs/executor.md, "When renewals fail").
    lease_margin_s: float = Field(default=-1.0, ge=-1)
    poll_interval_s: float = Field(default=0.5, gt=0)
    shutdown_grace_s: float = Field(default=10.0, ge=0)
    #: Claim path of this process: ``work_item`` (default) or ``event`` (legacy compatibility mode).
    claim_path: str = "work_item"
    #: Items claimed ahead of free workers (admission window = workers + prefetch); -1 = claim_batch.
    prefetch: int = Field(default=-1, ge=-1)
    #: How often each executor looks for expired leases (with +-20% jitter).
    reclaim_interval_s: float = Field(default=5.0, gt=0)
    #: Weighted fair sharing: ``queue_class=weight,...`` and ``pack_name_or_id=weight,...`` (default 1).
    queue_class_weights: str = ""
    pack_weights: str = ""
    #: Per-pack admission budget (claimed items held at once; 0 = the whole window) and overrides
    #: ``pack_name_or_id=n,...``.
    pack_max_inflight: int = Field(default=0, ge=0)
    pack_budgets: str = ""
    #: Threads for synchronous python handlers (0 = workers).
    handler_threads: int = Field(default=0, ge=0)
    #: Queue depth / oldest-ready / blocked-lane sampling for metrics (0 disables).
    stats_interval_s: float = Field(default=15.0, ge=0)
    #: Retention (connector.common.maintenance.retention, ADR 009): retired deliveries (receipt, events, all
    #: WorkItems succeeded) accepted longer ago than this are deleted; 0 = keep forever. Must exceed
    #: the providers' redelivery windows (a redelivery of a deleted delivery is a new delivery).
    retention_delivered_s: float = Field(default=604_800.0, ge=0)
    #: Admin request ids (AIP-155 de-duplication window) older than this are deleted; 0 = keep forever.
    retention_admin_requests_s: float = Field(default=86_400.0, ge=0)
    retention_interval_s: float = Field(default=60.0, gt=0)
    #: Rate-limit and concurrency key rows no WorkItem needs (every item of the key succeeded or
    #: deleted), whose budget is full / with no slot taken, and at least this old, are deleted by the
    #: reclaimer's periodic check (``flow.flow_keys_retire``); 0 = keep them forever.
    flow_key_idle_s: float = Field(default=3_600.0, ge=0)
    #: Receipts per sweep chunk (one transaction each).
    retention_batch: int = Field(default=1_000, ge=1, le=100_000)
    #: How often this process adds its figures (executions, latencies) to the cluster's per-minute
    #: rollups (docs/metrics.md "Figures without Prometheus"): one statement per interval, never one
    #: per item; 0 = not at all (nor does it lead the gauge samples, sealing and retention).
    figures_flush_s: float = Field(default=10.0, ge=0, le=60)
    #: Five-minute figures rows are kept this long (minute rows: at most 6 hours).
    figures_retention_s: float = Field(default=604_800.0, ge=86_400)

    @model_validator(mode="after")
    def _margin_inside_the_lease(self) -> ExecutorSettings:
        if self.lease_margin_s >= self.lease_s:
            raise ValueError(
                f"CONNECTOR_EXECUTOR_LEASE_MARGIN_S ({self.lease_margin_s}) must be less than"
                f" CONNECTOR_EXECUTOR_LEASE_S ({self.lease_s}): set -1 for one renewal interval"
            )
        return self


class AdminSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CONNECTOR_ADMIN_", extra="ignore")

    #: ``token=role[,role...];token2=role`` — bearer tokens mapped to roles. Never logged.
    tokens: SecretStr = SecretStr("")
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    #: Target for the CLI (``connector admin …``).
    address: str = "127.0.0.1:50053"
    #: The CLI's bearer token, or a file holding it (``connector up`` writes one to
    #: ``CONNECTOR_DATA_DIR/admin-token``); ``--token-file`` wins over both, the file over the token.
    token: SecretStr = SecretStr("")
    token_file: str | None = None
    #: HMAC key of page tokens (at least 32 characters; the same on every replica behind one load
    #: balancer). Unset: derived from ``tokens``; no tokens either: a random key per process
    #: (docs/admin.md, "Page tokens"). Never logged.
    page_token_key: SecretStr = SecretStr("")

    @field_validator("page_token_key")
    @classmethod
    def _key_length(cls, v: SecretStr) -> SecretStr:
        if v.get_secret_value() and len(v.get_secret_value()) < 32:
            raise ValueError("must be at least 32 characters (e.g. `openssl rand -hex 32`)")
        return v


class ConsoleSettings(BaseSettings):
    """The operator console (``connector console``, docs/console.md): a web client of the admin API."""

    model_config = SettingsConfigDict(env_prefix="CONNECTOR_CONSOLE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8090, ge=0, le=65535)
    #: The admin API it calls (default: ``CONNECTOR_ADMIN_ADDRESS``).
    admin_address: str = ""
    #: TLS to the admin API: the CA that signed its certificate; a client certificate for mTLS.
    admin_tls_ca_file: str | None = None
    admin_tls_cert_file: str | None = None
    admin_tls_key_file: str | None = None
    #: Serve HTTPS (both or neither). Session cookies are then ``Secure``.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    #: Mark session cookies ``Secure`` although the console serves plain HTTP (a TLS proxy in front).
    secure_cookies: bool = False
    #: A session ends after this long without a request, and after ``session_max_age_s`` in any case.
    session_idle_s: float = Field(default=1800.0, gt=0)
    session_max_age_s: float = Field(default=43200.0, gt=0)
    #: Link to a tracing UI from a delivery's trace id, e.g. ``https://tempo.internal/trace/{trace_id}``.
    trace_url_template: str = ""
    #: Seconds an admin call may take before the page answers 503.
    admin_timeout_s: float = Field(default=10.0, gt=0)


S = TypeVar("S", bound=BaseSettings)


def load(cls: type[S]) -> S:
    """Instantiate a settings class, turning validation errors into one clear start-up message."""
    try:
        return cls()
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix", "")).upper()
        lines = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {prefix}{field.upper()}: {err['msg']}")
        raise SettingsError("invalid configuration:\n" + "\n".join(lines)) from None

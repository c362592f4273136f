"""deploy/: the compose file against the Compose Specification schema, and its agreement with the code.

Docker is not available where tests run, so nothing here builds or starts containers. What is
checked instead: the compose file validates against the Compose Specification JSON schema (vendored
in tests/data, see its NOTICE), every command it runs is a real ``connector`` subcommand, every
``CONNECTOR_*`` variable it sets is read by the code, ports agree with the settings' defaults, the
executor can be scaled, the Dockerfile's entrypoint is the console script, and the container health
probe works against real HTTP and gRPC servers.
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
from connector.common import settings

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


def test_dockerfile_base_and_install() -> None:
    instructions = dockerfile_instructions()
    bases = [rest.split()[0] for kw, rest in instructions if kw == "FROM"]
    assert bases and all(b == "python:3.11-slim" for b in bases), bases
    runs = " ".join(rest for kw, rest in instructions if kw == "RUN")
    assert re.search(r"pip install -c constraints\.txt \.(\s|$)", runs), "install with the constraints"
    copied = " ".join(rest for kw, rest in instructions if kw == "COPY")
    # Every source root of the distribution is copied (pyproject's package-dir mapping).
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for source in package_dirs.values():
        top = source.split("/")[0]
        assert re.search(rf"\b{top}\b", copied), f"{top}/ is not copied into the image"
    for needed in ("pyproject.toml", "constraints.txt", "README.md", "deploy/healthcheck.py"):
        assert needed in copied


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

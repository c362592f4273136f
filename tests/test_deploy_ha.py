"""deploy/docker-compose.ha.yml (the compose `ha` profile), the Patroni and etcd images, and what
docs/deploy.md says about them, checked statically.

Nothing here starts containers: `./dev smoke --ha` (scripts/compose_smoke_ha.py) runs the profile for
real and kills the Patroni leader under load. What is checked here: the overlay validates against the
Compose Specification schema; merged onto the main file (the way compose merges: mappings merged,
scalars and lists replaced; where docker-compose is installed its own `config` must agree), every
connector container gets the libpq multi-host URL that names both Patroni nodes by the names they are
reachable by, with target_session_attrs=read-write, and the settings and libpq parse it; every service
waits for both nodes; the Patroni configuration asks for synchronous replication and its timings are
consistent; the images the overlay names are the ones the smoke builds; CI's smoke stays the single-node
one; and docs/deploy.md names the same files, commands, URL and settings, including the Kubernetes
examples (CloudNativePG with required synchronous replication and its `-rw` service; Patroni).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import psycopg.conninfo
import pytest
import yaml

from connector.common.core import db, settings
from tests.test_deploy import CONNECTOR_SERVICES, env_of, interpolate, known_env_names

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
HA = DEPLOY / "docker-compose.ha.yml"
PATRONI = DEPLOY / "images" / "patroni"
ETCD = DEPLOY / "images" / "etcd"
DOCS = ROOT / "docs" / "deploy.md"
SCHEMA = Path(__file__).parent / "data" / "compose-spec.json"
#: Patroni member -> compose service (pg1 keeps the main file's `postgres`: every service waits for it).
NODES = {"pg1": "postgres", "pg2": "pg2"}
HA_SERVICES = {"etcd", "postgres", "pg2"}


# --- helpers ------------------------------------------------------------------------------------------


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def merge(base: Any, over: Any) -> Any:
    """Compose's merge of an override file for the keys these files use: mappings merged key by key,
    everything else (scalars, lists such as healthcheck.test, profiles) replaced by the override."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(over)


@pytest.fixture(scope="module")
def overlay() -> dict[str, Any]:
    return load(HA)


@pytest.fixture(scope="module")
def merged(overlay: dict[str, Any]) -> dict[str, Any]:
    data = merge(load(DEPLOY / "docker-compose.yml"), overlay)
    return {k: v for k, v in data.items() if not k.startswith("x-")}


@pytest.fixture(scope="module")
def patroni() -> dict[str, Any]:
    return load(PATRONI / "patroni.yml")


@pytest.fixture(scope="module")
def docs() -> str:
    return DOCS.read_text()


def ha_url_problems(url: str, merged: dict[str, Any]) -> list[str]:
    """What is wrong with ``url`` as the HA database URL of ``merged`` (empty: nothing)."""
    parts = psycopg.conninfo.conninfo_to_dict(url)
    problems = []
    hosts = str(parts.get("host", "")).split(",")
    ports = str(parts.get("port", "")).split(",")
    if len(hosts) != 2 or len(ports) != len(hosts):
        problems.append(f"not one host:port per Patroni node: {parts.get('host')} / {parts.get('port')}")
    if parts.get("target_session_attrs") != "read-write":
        problems.append(f"target_session_attrs is {parts.get('target_session_attrs')!r}, not read-write")
    for member, service in NODES.items():
        node = merged["services"][service]
        names = {service, *(((node.get("networks") or {}).get("default") or {}).get("aliases") or [])}
        if member not in names:
            problems.append(f"{member} is not a name of service {service} ({sorted(names)})")
        if f"{member}:5432" not in [f"{h}:{p}" for h, p in zip(hosts, ports, strict=False)]:
            problems.append(f"the URL does not name {member}:5432")
        if env_of(node).get("PATRONI_POSTGRESQL_CONNECT_ADDRESS") != f"{member}:5432":
            problems.append(f"{service} does not advertise itself as {member}:5432")
    return problems


# --- the overlay --------------------------------------------------------------------------------------


def test_overlay_validates_against_the_compose_spec(overlay: dict[str, Any]) -> None:
    validator = jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))
    errors = sorted(validator.iter_errors(overlay), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)
    broken = copy.deepcopy(overlay)
    broken["services"]["pg2"]["profile"] = ["ha"]  # control: a misspelt key is refused
    assert list(validator.iter_errors(broken))


def test_ha_services_carry_the_ha_profile_and_the_main_file_none(overlay: dict[str, Any]) -> None:
    assert HA_SERVICES <= set(overlay["services"])
    for name in HA_SERVICES:
        assert overlay["services"][name]["profiles"] == ["ha"], name
    main = load(DEPLOY / "docker-compose.yml")
    assert not any("profiles" in svc for svc in main["services"].values()), "the default stack changed"
    # The overlay adds only the HA services; it changes the connector services' database and waits.
    assert set(overlay["services"]) - set(main["services"]) == HA_SERVICES - {"postgres"}
    for name in ("migrate", *CONNECTOR_SERVICES):
        assert set(overlay["services"][name]) <= {"environment", "depends_on"}, name


def test_every_connector_container_gets_the_multi_host_url(
    merged: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    urls = {
        name: env_of(merged["services"][name])["CONNECTOR_DATABASE_URL"]
        for name in ("migrate", *CONNECTOR_SERVICES)
    }
    assert len(set(urls.values())) == 1, urls
    url = urls["migrate"]
    assert ha_url_problems(url, merged) == []
    # The settings take it, and the connection string every pool opens with keeps both hosts and the
    # read-write requirement, with the network bounds added (connect timeout, keepalives).
    monkeypatch.setenv("CONNECTOR_DATABASE_URL", url)
    database = settings.load(settings.DatabaseSettings)
    conninfo = psycopg.conninfo.conninfo_to_dict(
        db.conninfo_with(database.conninfo(), application_name="test", statement_timeout_ms=1000)
    )
    assert (conninfo["host"], conninfo["port"]) == ("pg1,pg2", "5432,5432")
    assert conninfo["target_session_attrs"] == "read-write"
    assert conninfo["connect_timeout"] and conninfo["keepalives"] == "1"
    assert conninfo["user"] == "connector" and conninfo["dbname"] == "connector"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://connector:connector@pg1:5432/connector?target_session_attrs=read-write",
        "postgresql://connector:connector@pg1:5432,pg2:5432/connector",
        "postgresql://connector:connector@pg1:5432,pg3:5432/connector?target_session_attrs=read-write",
        "postgresql://connector:connector@pg1:5432,pg2:5432/connector?target_session_attrs=any",
    ],
    ids=["one-host", "no-target-session-attrs", "unknown-node", "any-session"],
)
def test_url_check_can_fail(url: str, merged: dict[str, Any]) -> None:
    assert ha_url_problems(url, merged)


def test_connector_variables_are_read_by_the_code(overlay: dict[str, Any]) -> None:
    known = known_env_names()
    for name, svc in overlay["services"].items():
        unknown = {k for k in env_of(svc) if k.startswith("CONNECTOR_")} - known
        assert not unknown, f"{name} sets variables nothing reads: {sorted(unknown)}"


def test_everything_waits_for_both_nodes(merged: dict[str, Any]) -> None:
    for name in ("migrate", *CONNECTOR_SERVICES):
        depends = merged["services"][name]["depends_on"]
        for service in NODES.values():
            assert depends[service]["condition"] == "service_healthy", (name, service)
        if name != "migrate":
            assert depends["migrate"]["condition"] == "service_completed_successfully", name
    for service in NODES.values():
        node = merged["services"][service]
        assert node["depends_on"] == {"etcd": {"condition": "service_healthy"}}
        assert node["healthcheck"]["test"] == ["CMD", "python3", "/usr/local/bin/patroni-healthcheck"]
        assert interpolate(node["image"]) == "localhost/connector-patroni:15"
    # Each node its own data volume, mounted where patroni.yml puts the data directory.
    volumes = [merged["services"][s]["volumes"][0].split(":") for s in NODES.values()]
    assert len({v[0] for v in volumes}) == 2 and {v[1] for v in volumes} == {"/var/lib/postgresql/data"}
    assert {v[0] for v in volumes} | {"etcddata"} <= set(merged["volumes"])


def test_docker_compose_merges_it_the_same_way(merged: dict[str, Any]) -> None:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose not installed (./dev smoke installs it)")
    out = subprocess.run(
        [
            "docker-compose",
            "-f",
            "docker-compose.yml",
            "-f",
            "docker-compose.ha.yml",
            "--profile",
            "ha",
            "config",
        ],
        cwd=DEPLOY,
        capture_output=True,
        check=True,
        text=True,
        env={"PATH": "/usr/bin:/bin:/usr/local/bin"},
    ).stdout
    theirs = yaml.safe_load(out)["services"]
    for name in ("migrate", *CONNECTOR_SERVICES):
        assert theirs[name]["environment"]["CONNECTOR_DATABASE_URL"] == interpolate(
            merged["services"][name]["environment"]["CONNECTOR_DATABASE_URL"]
        )
        assert theirs[name]["depends_on"] == merged["services"][name]["depends_on"], name
    for name in HA_SERVICES:
        assert theirs[name]["profiles"] == ["ha"]
        assert theirs[name]["image"] == interpolate(merged["services"][name]["image"])


def test_the_ingress_acks_only_what_the_standby_has(
    merged: dict[str, Any], patroni: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    level = env_of(merged["services"]["ingress"])["CONNECTOR_INGRESS_SYNCHRONOUS_COMMIT"]
    assert level in ("remote_write", "on", "remote_apply")
    monkeypatch.setenv("CONNECTOR_INGRESS_SYNCHRONOUS_COMMIT", level)
    assert settings.load(settings.IngressSettings).synchronous_commit == level
    # ... and the server names a synchronous standby for it to wait for.
    assert patroni["bootstrap"]["dcs"]["synchronous_mode"] is True


# --- Patroni and etcd ---------------------------------------------------------------------------------


def test_patroni_asks_for_synchronous_replication(patroni: dict[str, Any]) -> None:
    dcs = patroni["bootstrap"]["dcs"]
    assert dcs["synchronous_mode"] is True
    # Not strict with two nodes: the survivor of a failure must accept writes (docs say why).
    assert dcs["synchronous_mode_strict"] is False
    assert dcs["postgresql"]["parameters"]["synchronous_commit"] == "on"
    assert dcs["postgresql"]["use_pg_rewind"] is True
    # Patroni's own rule: loop_wait + 2 * retry_timeout <= ttl.
    assert dcs["loop_wait"] + 2 * dcs["retry_timeout"] <= dcs["ttl"]


def test_patroni_configuration_agrees_with_the_compose_file(
    patroni: dict[str, Any], merged: dict[str, Any]
) -> None:
    etcd = env_of(merged["services"]["etcd"])
    assert f"http://{patroni['etcd3']['hosts']}" == etcd["ETCD_ADVERTISE_CLIENT_URLS"]
    url = psycopg.conninfo.conninfo_to_dict(env_of(merged["services"]["migrate"])["CONNECTOR_DATABASE_URL"])
    pg = patroni["postgresql"]
    assert pg["authentication"]["superuser"]["username"] == url["user"]
    assert pg["listen"].endswith(":5432") and pg["data_dir"].startswith("/var/lib/postgresql/data/")
    assert patroni["restapi"]["listen"].endswith(":8008")
    # The database the services use is the one the post-bootstrap script creates.
    script = (PATRONI / "post-bootstrap.sh").read_text()
    assert f"CREATE DATABASE {url['dbname']}" in script
    dockerfile = (PATRONI / "Dockerfile").read_text()
    assert f"COPY post-bootstrap.sh {patroni['bootstrap']['post_bootstrap']}" in dockerfile
    assert "COPY patroni.yml /etc/patroni/patroni.yml" in dockerfile
    assert "COPY healthcheck.py /usr/local/bin/patroni-healthcheck" in dockerfile
    version = re.search(r"postgresql-(\d+)", dockerfile)
    assert version and pg["bin_dir"] == f"/usr/lib/postgresql/{version.group(1)}/bin"
    for name in ("PATRONI_SUPERUSER_PASSWORD", "PATRONI_REPLICATION_PASSWORD", "PATRONI_NAME"):
        for service in NODES.values():
            assert name in env_of(merged["services"][service]), (service, name)
    # pg_hba lets the replication user and the connector user in over TCP with a password.
    assert "host replication replicator all scram-sha-256" in pg["pg_hba"]
    assert pg["authentication"]["replication"]["username"] == "replicator"


def test_images_are_built_from_debian_packages_by_the_ha_smoke(merged: dict[str, Any]) -> None:
    script = (ROOT / "scripts" / "compose-smoke.sh").read_text()
    for service, folder in (("postgres", "patroni"), ("etcd", "etcd")):
        image = interpolate(merged["services"][service]["image"])
        assert f"-t {image} deploy/images/{folder}" in script, image
        assert merged["services"][service]["build"]["context"] == f"images/{folder}"
    assert "apt-get install" in (PATRONI / "Dockerfile").read_text()
    assert "patroni" in (PATRONI / "Dockerfile").read_text()
    assert "etcd-server" in (ETCD / "Dockerfile").read_text()
    assert "scripts/compose_smoke_ha.py" in script


def test_ci_runs_the_single_node_smoke_only() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./dev smoke" in ci and "--ha" not in ci


# --- docs ---------------------------------------------------------------------------------------------


def yaml_blocks(text: str) -> list[Any]:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S)]


def test_docs_name_the_profile_the_url_and_the_smoke(docs: str, merged: dict[str, Any]) -> None:
    for text in (
        "deploy/docker-compose.ha.yml",
        "--profile ha",
        "./dev smoke --ha",
        "synchronous_mode: true",
        "target_session_attrs=read-write",
        "CONNECTOR_INGRESS_SYNCHRONOUS_COMMIT=on",
        "deploy/images/patroni",
        "deploy/images/etcd",
    ):
        assert text in docs, text
    url = interpolate(env_of(merged["services"]["migrate"])["CONNECTOR_DATABASE_URL"]).replace(
        "connector:connector@", "connector@"
    )
    assert url in docs, url


def test_docs_kubernetes_examples_require_synchronous_replication(docs: str) -> None:
    blocks = yaml_blocks(docs)
    clusters = [b for b in blocks if isinstance(b, dict) and b.get("kind") == "Cluster"]
    assert clusters, "no CloudNativePG Cluster example in docs/deploy.md"
    (cluster,) = clusters
    assert cluster["apiVersion"] == "postgresql.cnpg.io/v1"
    sync = cluster["spec"]["postgresql"]["synchronous"]
    assert sync["dataDurability"] == "required" and sync["number"] >= 1
    assert cluster["spec"]["instances"] >= sync["number"] + 1
    name = cluster["metadata"]["name"]
    # The connector's URL goes to the cluster's read-write service.
    assert f"@{name}-rw." in docs or f"@{name}-rw:" in docs
    patroni = [b for b in blocks if isinstance(b, dict) and "synchronous_mode" in json.dumps(b)]
    assert patroni, "no Patroni example in docs/deploy.md"
    assert any(
        (b.get("bootstrap", {}).get("dcs", {}) or b).get("synchronous_mode_strict") is True for b in patroni
    ), "the Kubernetes Patroni example should be strict (three nodes)"


def test_secret_template_shows_the_documented_failover_urls(docs: str) -> None:
    template = (DEPLOY / "kubernetes" / "secrets.example.yaml").read_text()
    urls = re.findall(r"postgresql://\S+target_session_attrs=read-write", template)
    assert len(urls) == 2
    for url in urls:
        assert url.replace("REPLACE_ME", "PASSWORD") in docs, url
        parts = psycopg.conninfo.conninfo_to_dict(url)
        assert parts["dbname"] == "connector" and parts["target_session_attrs"] == "read-write"

"""Optional TLS and mTLS of the admin API, from AdminSettings, with certificates made by openssl here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import grpc
import pytest

from connector.common.core.settings import AdminSettings, SettingsError
from connector.executor.admin import server_credentials
from connector.v1 import admin_service_pb2 as pb
from connector.v1 import admin_service_pb2_grpc

from .conftest import VIEW, Admin, start_admin


def _openssl(*args: str, cwd: Path) -> None:
    assert shutil.which("openssl"), "the openssl CLI is needed to make test certificates"
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _issue(dir_: Path, name: str, ext: str) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=dir_,
    )  # fmt: skip
    (dir_ / f"{name}.ext").write_text(ext)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext", cwd=dir_,
    )  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=connector-test-ca", cwd=d,
    )  # fmt: skip
    _issue(d, "server", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _issue(d, "client", "extendedKeyUsage=clientAuth\n")
    return d


def _settings(certs: Path, *, mtls: bool) -> AdminSettings:
    return AdminSettings(
        tls_cert_file=str(certs / "server.pem"),
        tls_key_file=str(certs / "server.key"),
        tls_client_ca_file=str(certs / "ca.pem") if mtls else None,
    )


async def _stats(channel: grpc.aio.Channel) -> pb.GetQueueStatsResponse:
    stub = admin_service_pb2_grpc.AdminServiceStub(channel)
    return await stub.GetQueueStats(pb.GetQueueStatsRequest(), metadata=Admin.md(VIEW), timeout=5)


async def test_tls(db_url: str, certs: Path) -> None:
    creds = server_credentials(_settings(certs, mtls=False))
    assert creds is not None
    running = await start_admin(db_url, credentials=creds)
    target = f"127.0.0.1:{running.server.port}"
    try:
        tls = grpc.ssl_channel_credentials(root_certificates=(certs / "ca.pem").read_bytes())
        async with grpc.aio.secure_channel(target, tls) as channel:
            assert isinstance(await _stats(channel), pb.GetQueueStatsResponse)
        async with grpc.aio.insecure_channel(target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _stats(channel)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await running.stop()


async def test_mtls_requires_a_client_certificate(db_url: str, certs: Path) -> None:
    running = await start_admin(db_url, credentials=server_credentials(_settings(certs, mtls=True)))
    target = f"127.0.0.1:{running.server.port}"
    ca = (certs / "ca.pem").read_bytes()
    try:
        with_cert = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=(certs / "client.key").read_bytes(),
            certificate_chain=(certs / "client.pem").read_bytes(),
        )
        async with grpc.aio.secure_channel(target, with_cert) as channel:
            assert isinstance(await _stats(channel), pb.GetQueueStatsResponse)
        async with grpc.aio.secure_channel(
            target, grpc.ssl_channel_credentials(root_certificates=ca)
        ) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _stats(channel)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await running.stop()


def test_plaintext_when_nothing_is_configured() -> None:
    assert server_credentials(AdminSettings()) is None


def test_tls_settings_errors(certs: Path, tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="go together"):
        server_credentials(AdminSettings(tls_cert_file=str(certs / "server.pem")))
    with pytest.raises(SettingsError, match="needs TLS_CERT_FILE"):
        server_credentials(AdminSettings(tls_client_ca_file=str(certs / "ca.pem")))
    with pytest.raises(SettingsError, match="cannot read"):
        server_credentials(
            AdminSettings(tls_cert_file=str(tmp_path / "missing.pem"), tls_key_file=str(certs / "server.key"))
        )


async def test_cli_over_mtls(
    db_url: str, certs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    from connector.cli import main as cli_main

    running = await start_admin(db_url, credentials=server_credentials(_settings(certs, mtls=True)))
    monkeypatch.setenv("CONNECTOR_ADMIN_ADDRESS", f"127.0.0.1:{running.server.port}")
    monkeypatch.setenv("CONNECTOR_ADMIN_TOKEN", VIEW)
    tls = ["--tls-ca-file", str(certs / "ca.pem")]
    client = ["--tls-cert-file", str(certs / "client.pem"), "--tls-key-file", str(certs / "client.key")]
    try:
        code = await asyncio.to_thread(cli_main.main, ["admin", "stats", "--json", *tls, *client])
        out, _ = capsys.readouterr()
        assert code == 0 and out.startswith("{")
        code = await asyncio.to_thread(cli_main.main, ["admin", "stats", "--timeout", "3", *tls])
        _, err = capsys.readouterr()
        assert code == 1 and err.startswith("error: UNAVAILABLE")
    finally:
        await running.stop()

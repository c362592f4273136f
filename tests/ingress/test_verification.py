"""The generic verifier against the providers' own signing code and published test vectors.

No database here: a route's verification spec is resolved and compiled exactly as the route table
does, then fed headers and raw bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import standardwebhooks
import stripe
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from connector.common.packs.verification import (
    PRESETS,
    SecretUnavailable,
    VerificationSpec,
    check_spec,
    load_secret,
    resolve,
)
from connector.ingress import verify
from connector.ingress.verify import HmacVerifier, Rejected

from .conftest import SECRETS


def compile_spec(spec: dict[str, Any]) -> HmacVerifier:
    parsed = VerificationSpec.model_validate(spec)
    assert check_spec(parsed) == []
    cfg = resolve(parsed)
    return HmacVerifier(cfg, [load_secret(ref) for ref in cfg["secrets"]])


def run(
    verifier: HmacVerifier,
    headers: dict[str, str] | list[tuple[str, str]],
    body: bytes,
    *,
    now: float | None = None,
    method: str = "POST",
    uri: str = "https://hooks.example.com/v1/webhooks/shop/x",
) -> str:
    items = headers.items() if isinstance(headers, dict) else headers
    return verifier.verify(CIMultiDict(items), body, method, lambda: uri, time.time() if now is None else now)


def rejected(verifier: HmacVerifier, headers: Any, body: bytes, **kw: Any) -> str:
    with pytest.raises(Rejected) as info:
        run(verifier, headers, body, **kw)
    return info.value.reason


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)


# -- Standard Webhooks (the reference library signs) -----------------------------------------------


SW = {"preset": "standard-webhooks", "secrets": [{"env": "INGRESS_T_SW"}]}


def sw_headers(body: bytes, *, msg_id: str = "msg_1", at: datetime | None = None, secret: str | None = None):
    at = at or datetime.now(tz=UTC)
    signature = standardwebhooks.Webhook(secret or SECRETS["INGRESS_T_SW"]).sign(msg_id, at, body.decode())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }


def test_standard_webhooks_signature_from_the_library_verifies() -> None:
    verifier = compile_spec(SW)
    body = b'{"type":"invoice.paid","data":{"id":"inv_1"}}'
    assert run(verifier, sw_headers(body), body) == "hmac-sha256:env:INGRESS_T_SW"


def test_standard_webhooks_library_accepts_what_we_accept_and_refuses_a_tampered_body() -> None:
    body = b'{"type":"a"}'
    headers = sw_headers(body)
    standardwebhooks.Webhook(SECRETS["INGRESS_T_SW"]).verify(body, headers)  # the reference agrees
    assert rejected(compile_spec(SW), headers, body + b" ") == verify.SIGNATURE_MISMATCH


def test_standard_webhooks_several_signatures_in_one_header() -> None:
    verifier = compile_spec(SW)
    body = b'{"type":"a"}'
    headers = sw_headers(body)
    good = headers["webhook-signature"]
    other = sw_headers(body, secret="whsec_" + base64.b64encode(b"another key").decode())["webhook-signature"]
    headers["webhook-signature"] = f"v1a,{base64.b64encode(b'x' * 64).decode()} {other} {good}"
    assert run(verifier, headers, body) == "hmac-sha256:env:INGRESS_T_SW"
    headers["webhook-signature"] = other
    assert rejected(verifier, headers, body) == verify.SIGNATURE_MISMATCH


@pytest.mark.parametrize(
    ("shift", "reason"),
    [(timedelta(minutes=-6), verify.TIMESTAMP_STALE), (timedelta(minutes=6), verify.TIMESTAMP_FUTURE)],
)
def test_standard_webhooks_timestamp_tolerance_both_ways(shift: timedelta, reason: str) -> None:
    body = b'{"type":"a"}'
    headers = sw_headers(body, at=datetime.now(tz=UTC) + shift)
    assert rejected(compile_spec(SW), headers, body) == reason
    # Inside the tolerance, both directions pass.
    ok = sw_headers(body, at=datetime.now(tz=UTC) + shift / 2)
    assert run(compile_spec(SW), ok, body)


def test_standard_webhooks_missing_id_or_timestamp() -> None:
    body = b'{"type":"a"}'
    headers = sw_headers(body)
    no_ts = {k: v for k, v in headers.items() if k != "webhook-timestamp"}
    assert rejected(compile_spec(SW), no_ts, body) == verify.TIMESTAMP_MISSING
    no_id = {k: v for k, v in headers.items() if k != "webhook-id"}
    assert rejected(compile_spec(SW), no_id, body) == verify.ID_MISSING


# -- Stripe (the stripe library signs) --------------------------------------------------------------

STRIPE = {"preset": "stripe", "secrets": [{"env": "INGRESS_T_STRIPE"}]}


def test_stripe_signature_header_from_the_library_verifies() -> None:
    body = b'{"id":"evt_1","type":"charge.succeeded"}'
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), SECRETS["INGRESS_T_STRIPE"])
    stripe.WebhookSignature.verify_header(body, header, SECRETS["INGRESS_T_STRIPE"], 300)  # reference agrees
    assert run(compile_spec(STRIPE), {"Stripe-Signature": header}, body) == "hmac-sha256:env:INGRESS_T_STRIPE"


def test_stripe_several_v1_signatures_and_a_v0_are_fine() -> None:
    body = b'{"id":"evt_1"}'
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), SECRETS["INGRESS_T_STRIPE"])
    ts, good = header.split(",")
    wrong = stripe.WebhookSignature.generate_signature_header(body.decode(), "whsec_other").split(",")[1]
    combined = f"{ts},{wrong},v0=deadbeef,{good}"
    assert run(compile_spec(STRIPE), {"Stripe-Signature": combined}, body)


def test_stripe_stale_and_future_timestamps() -> None:
    body = b'{"id":"evt_1"}'
    secret = SECRETS["INGRESS_T_STRIPE"]
    old = stripe.WebhookSignature.generate_signature_header(body.decode(), secret, int(time.time()) - 301)
    new = stripe.WebhookSignature.generate_signature_header(body.decode(), secret, int(time.time()) + 301)
    assert rejected(compile_spec(STRIPE), {"Stripe-Signature": old}, body) == verify.TIMESTAMP_STALE
    assert rejected(compile_spec(STRIPE), {"Stripe-Signature": new}, body) == verify.TIMESTAMP_FUTURE


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ("t=abc,v1=" + "0" * 64, verify.TIMESTAMP_MALFORMED),
        ("t=abc,v1=00", verify.SIGNATURE_MALFORMED),
        ("v1=" + "0" * 64, verify.TIMESTAMP_MISSING),
        ("t=1,t=2,v1=" + "0" * 64, verify.SIGNATURE_MALFORMED),
        ("garbage", verify.SIGNATURE_MALFORMED),
        ("t=1700000000", verify.SIGNATURE_MALFORMED),
        ("t=1700000000,v1=zz", verify.SIGNATURE_MALFORMED),
    ],
)
def test_stripe_malformed_headers_are_rejections(header: str, reason: str) -> None:
    assert rejected(compile_spec(STRIPE), {"Stripe-Signature": header}, b"{}") == reason


# -- Published test vectors ---------------------------------------------------------------------------


def test_github_published_test_vector() -> None:
    # docs.github.com "Validating webhook deliveries": secret, payload and expected signature.
    verifier = compile_spec({"preset": "github", "secrets": [{"env": "INGRESS_T_GITHUB"}]})
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert (
        run(verifier, {"X-Hub-Signature-256": expected}, b"Hello, World!")
        == "hmac-sha256:env:INGRESS_T_GITHUB"
    )
    assert (
        rejected(verifier, {"X-Hub-Signature-256": expected}, b"Hello, World?") == verify.SIGNATURE_MISMATCH
    )
    assert rejected(verifier, {"X-Hub-Signature-256": expected[:-2]}, b"Hello, World!") == (
        verify.SIGNATURE_MALFORMED  # truncated
    )
    assert rejected(verifier, {"X-Hub-Signature-256": expected[7:]}, b"Hello, World!") == (
        verify.SIGNATURE_MALFORMED  # prefix missing
    )


def test_github_legacy_sha1_preset() -> None:
    verifier = compile_spec({"preset": "github-sha1", "secrets": [{"env": "INGRESS_T_GITHUB"}]})
    sig = hmac.new(SECRETS["INGRESS_T_GITHUB"].encode(), b"Hello, World!", hashlib.sha1).hexdigest()
    assert (
        run(verifier, {"X-Hub-Signature": f"sha1={sig}"}, b"Hello, World!")
        == "hmac-sha1:env:INGRESS_T_GITHUB"
    )


SLACK_BODY = (
    b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V"
    b"&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text="
    b"&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN"
    b"&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
)


def test_slack_published_example() -> None:
    # api.slack.com "Verifying requests from Slack": the documented example request.
    verifier = compile_spec({"preset": "slack", "secrets": [{"env": "INGRESS_T_SLACK"}]})
    headers = {
        "X-Slack-Request-Timestamp": "1531420618",
        "X-Slack-Signature": "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
    }
    assert run(verifier, headers, SLACK_BODY, now=1531420618 + 10) == "hmac-sha256:env:INGRESS_T_SLACK"
    # The same request replayed today is stale.
    assert rejected(verifier, headers, SLACK_BODY) == verify.TIMESTAMP_STALE


def test_shopify_base64_over_the_body() -> None:
    verifier = compile_spec({"preset": "shopify", "secrets": [{"env": "INGRESS_T_SHOPIFY"}]})
    body = b'{"id":820982911946154508}'
    digest = hmac.new(SECRETS["INGRESS_T_SHOPIFY"].encode(), body, hashlib.sha256).digest()
    assert run(verifier, {"X-Shopify-Hmac-Sha256": base64.b64encode(digest).decode()}, body)
    assert rejected(verifier, {"X-Shopify-Hmac-Sha256": "not base64!"}, body) == verify.SIGNATURE_MALFORMED


def test_hubspot_v3_method_uri_body_timestamp_in_ms() -> None:
    verifier = compile_spec({"preset": "hubspot-v3", "secrets": [{"env": "INGRESS_T_HUBSPOT"}]})
    uri = "https://hooks.example.com/v1/webhooks/shop/hubspot?portal=62515"
    body = b'[{"eventId":1,"subscriptionType":"contact.creation"}]'
    ts = str(int(time.time() * 1000))
    digest = hmac.new(
        SECRETS["INGRESS_T_HUBSPOT"].encode(), b"POST" + uri.encode() + body + ts.encode(), "sha256"
    )
    headers = {
        "X-HubSpot-Signature-v3": base64.b64encode(digest.digest()).decode(),
        "X-HubSpot-Request-Timestamp": ts,
    }
    assert run(verifier, headers, body, uri=uri)
    assert rejected(verifier, headers, body, uri=uri + "&x=1") == verify.SIGNATURE_MISMATCH
    assert rejected(verifier, headers, body, uri=uri, method="PUT") == verify.SIGNATURE_MISMATCH
    # Milliseconds: a seconds value is ~55 years stale.
    stale = dict(headers, **{"X-HubSpot-Request-Timestamp": str(int(time.time()))})
    assert rejected(verifier, stale, body, uri=uri) == verify.TIMESTAMP_STALE


def test_hubspot_v3_signs_the_uri_with_its_twelve_escapes_decoded() -> None:
    """HubSpot decodes %3A %2F %3F %40 %21 %24 %27 %28 %29 %2A %2C %3B in the request URI before
    signing, and no other escape. The provider computes the signature over the decoded form; the
    request arrives encoded."""
    verifier = compile_spec({"preset": "hubspot-v3", "secrets": [{"env": "INGRESS_T_HUBSPOT"}]})
    sent = (
        "https://hooks.example.com/v1/webhooks/shop/hubspot"
        "?next=https%3A%2F%2Fapp.example%2Fa%28b%29%2a&who=%40me%3b%21%24%27%2C%3F&keep=%7Bx%7D%20y"
    )
    signed = "https://hooks.example.com/v1/webhooks/shop/hubspot?next=https://app.example/a(b)*&who=@me;!$',?&keep=%7Bx%7D%20y"
    body = b'[{"eventId":2}]'
    ts = str(int(time.time() * 1000))

    def headers_for(uri: str) -> dict[str, str]:
        mac = hmac.new(
            SECRETS["INGRESS_T_HUBSPOT"].encode(), b"POST" + uri.encode() + body + ts.encode(), "sha256"
        )
        return {
            "X-HubSpot-Signature-v3": base64.b64encode(mac.digest()).decode(),
            "X-HubSpot-Request-Timestamp": ts,
        }

    assert run(verifier, headers_for(signed), body, uri=sent)
    # Signed over the URI as sent (nothing decoded), or with every escape decoded: not HubSpot's.
    assert rejected(verifier, headers_for(sent), body, uri=sent) == verify.SIGNATURE_MISMATCH
    everything = signed.replace("%7B", "{").replace("%7D", "}").replace("%20", " ")
    assert rejected(verifier, headers_for(everything), body, uri=sent) == verify.SIGNATURE_MISMATCH
    # A route that sets its own empty list signs the URI as sent.
    plain = compile_spec(
        {"preset": "hubspot-v3", "uri_decode": [], "secrets": [{"env": "INGRESS_T_HUBSPOT"}]}
    )
    assert run(plain, headers_for(sent), body, uri=sent)


def test_uri_decoder_decodes_only_what_it_is_given() -> None:
    decode = verify.uri_decoder(["%2F", "%3a"])
    assert decode("a%2fb%3Ac%2Fd%20e%3a") == "a/b:c/d%20e:"
    assert verify.uri_decoder([])("a%2Fb") == "a%2Fb"


# -- Generic config (no preset) and rotation -----------------------------------------------------------


def test_generic_config_with_id_timestamp_template_and_prefix() -> None:
    spec = {
        "scheme": "hmac",
        "algorithm": "sha256",
        "encoding": "hex",
        "signature_header": "X-Sig",
        "signature_prefix": "v1,",
        "signed_content": "{id}.{timestamp}.{body}",
        "id_header": "X-Id",
        "timestamp_header": "X-Ts",
        "timestamp_unit": "ms",
        "tolerance_s": 60,
        "secrets": [{"env": "INGRESS_T_GITHUB"}],
    }
    body = b'{"a":1}'
    ts = str(int(time.time() * 1000))
    sig = hmac.new(
        SECRETS["INGRESS_T_GITHUB"].encode(), b"abc." + ts.encode() + b"." + body, "sha256"
    ).hexdigest()
    assert run(compile_spec(spec), {"X-Sig": f"v1,{sig}", "X-Id": "abc", "X-Ts": ts}, body)
    assert rejected(compile_spec(spec), {"X-Sig": f"v1,{sig}", "X-Id": "abd", "X-Ts": ts}, body) == (
        verify.SIGNATURE_MISMATCH
    )


def test_a_preset_is_only_its_fields_written_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every preset, spelled out as generic fields with no preset name, resolves to the very same flat
    # config the verifier compiles: nothing downstream keys on the name.
    for name, fields in PRESETS.items():
        generic = {k: v for k, v in fields.items() if k != "secret_encoding"}
        ref = {"env": "X", "encoding": fields.get("secret_encoding", "raw")}
        spelled = VerificationSpec.model_validate({**generic, "secrets": [ref]})
        if fields.get("algorithm") == "sha1":
            # The one difference by design: SHA-1 only through a preset that needs it.
            assert any("sha1 is accepted only" in p for p in check_spec(spelled)), name
            continue
        named = VerificationSpec.model_validate({"preset": name, "secrets": [{"env": "X"}]})
        assert check_spec(spelled) == [] and resolve(spelled) == resolve(named), name
    # And the spelled-out asymmetric preset verifies a genuine delivery (control: it is compiled).
    ed = Ed25519PrivateKey.generate()
    monkeypatch.setenv(
        "INGRESS_T_ED", "whpk_" + base64.b64encode(ed.public_key().public_bytes_raw()).decode()
    )
    ts = str(int(time.time()))
    body = b'{"a":1}'
    sig = "v1a," + base64.b64encode(ed.sign(b"m1." + ts.encode() + b"." + body)).decode()
    generic = {k: v for k, v in PRESETS["standard-webhooks-v1a"].items() if k != "secret_encoding"}
    v1a = compile_spec({**generic, "secrets": [{"env": "INGRESS_T_ED", "encoding": "whpk"}]})
    headers = {"webhook-id": "m1", "webhook-timestamp": ts, "webhook-signature": sig}
    assert run(v1a, headers, body) == "ed25519:env:INGRESS_T_ED"
    assert rejected(v1a, {**headers, "webhook-id": "m2"}, body) == verify.SIGNATURE_MISMATCH


def test_rotation_any_active_secret_verifies_and_the_label_names_the_reference() -> None:
    spec = {"preset": "github", "secrets": [{"env": "INGRESS_T_GITHUB"}, {"env": "INGRESS_T_GITHUB_OLD"}]}
    body = b"{}"
    old = hmac.new(SECRETS["INGRESS_T_GITHUB_OLD"].encode(), body, "sha256").hexdigest()
    new = hmac.new(SECRETS["INGRESS_T_GITHUB"].encode(), body, "sha256").hexdigest()
    verifier = compile_spec(spec)
    assert (
        run(verifier, {"X-Hub-Signature-256": f"sha256={old}"}, body)
        == "hmac-sha256:env:INGRESS_T_GITHUB_OLD"
    )
    assert run(verifier, {"X-Hub-Signature-256": f"sha256={new}"}, body) == "hmac-sha256:env:INGRESS_T_GITHUB"


def test_a_repeated_signature_header_is_ambiguous() -> None:
    verifier = compile_spec({"preset": "github", "secrets": [{"env": "INGRESS_T_GITHUB"}]})
    good = "sha256=" + hmac.new(SECRETS["INGRESS_T_GITHUB"].encode(), b"{}", "sha256").hexdigest()
    headers = [("X-Hub-Signature-256", good), ("X-Hub-Signature-256", good)]
    assert rejected(verifier, headers, b"{}") == verify.SIGNATURE_MALFORMED


# -- Spec checks and secrets -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({}, "set a preset or a scheme"),
        ({"preset": "nope"}, "unknown preset"),
        ({"preset": "github"}, "at least one secret reference"),
        ({"scheme": "none", "secrets": [{"env": "X"}]}, "scheme none takes no secrets"),
        ({"preset": "github", "algorithm": "sha1", "secrets": [{"env": "X"}]}, "sha1 is accepted only"),
        ({"preset": "github", "signed_content": "{bdy}", "secrets": [{"env": "X"}]}, "unknown placeholders"),
        ({"preset": "github", "signed_content": "{id}.{body}", "secrets": [{"env": "X"}]}, "no id_header"),
        ({"preset": "github", "signature_header": "X Sig", "secrets": [{"env": "X"}]}, "not a valid header"),
        ({"preset": "github", "tolerance_s": 5, "secrets": [{"env": "X"}]}, "carries no timestamp"),
        ({"preset": "github", "signed_content": "{timestamp}", "secrets": [{"env": "X"}]}, "{body}"),
        ({"preset": "hubspot-v3", "uri_decode": ["%3A", "3B"], "secrets": [{"env": "X"}]}, "percent-escapes"),
        ({"preset": "github", "uri_decode": ["%3A"], "secrets": [{"env": "X"}]}, "has no {uri}"),
    ],
)
def test_check_spec_refuses_impossible_configs(spec: dict[str, Any], problem: str) -> None:
    problems = check_spec(VerificationSpec.model_validate(spec))
    assert any(problem in p for p in problems), problems


def test_every_preset_is_a_valid_generic_config() -> None:
    for name in PRESETS:
        assert check_spec(VerificationSpec.model_validate({"preset": name, "secrets": [{"env": "X"}]})) == []


def test_secrets_from_env_and_file_never_show_their_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "secret"
    path.write_text("file-secret-value\n")
    key = load_secret({"file": str(path)})
    assert key.key == b"file-secret-value"  # trailing newline dropped
    assert "file-secret-value" not in repr(key) and key.name == f"file:{path}"
    whsec = load_secret({"env": "INGRESS_T_SW", "encoding": "whsec"})
    assert whsec.key == base64.b64decode(SECRETS["INGRESS_T_SW"].removeprefix("whsec_"))
    monkeypatch.delenv("INGRESS_T_SW")
    with pytest.raises(SecretUnavailable) as info:
        load_secret({"env": "INGRESS_T_SW"})
    assert "INGRESS_T_SW" in str(info.value)
    with pytest.raises(SecretUnavailable) as info:
        load_secret({"file": str(tmp_path / "missing")})
    assert "missing" in str(info.value)


def test_standard_webhooks_preset_reads_whsec_keys_even_when_stored_as_raw() -> None:
    # Stored route configs carry the default ``encoding: raw``; the preset's keys are never raw text.
    cfg = resolve(
        VerificationSpec.model_validate({**SW, "secrets": [{"env": "INGRESS_T_SW", "encoding": "raw"}]})
    )
    assert cfg["secrets"][0]["encoding"] == "whsec"


# -- Malformed input is a rejection, never another exception --------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    preset=st.sampled_from(["standard-webhooks", "stripe", "github", "slack", "shopify", "hubspot-v3"]),
    headers=st.dictionaries(
        st.sampled_from(
            [
                "webhook-id",
                "webhook-timestamp",
                "webhook-signature",
                "Stripe-Signature",
                "X-Hub-Signature-256",
                "X-Slack-Signature",
                "X-Slack-Request-Timestamp",
                "X-Shopify-Hmac-Sha256",
                "X-HubSpot-Signature-v3",
                "X-HubSpot-Request-Timestamp",
            ]
        ),
        st.text(max_size=120) | st.from_regex(r"(v1,|t=\d{1,12},v1=|sha256=|v0=)[0-9a-zA-Z+/=]{0,90}"),
        max_size=4,
    ),
    body=st.binary(max_size=256),
)
def test_verifier_fuzz_only_ever_rejects(preset: str, headers: dict[str, str], body: bytes) -> None:
    env = {
        "standard-webhooks": "INGRESS_T_SW",
        "stripe": "INGRESS_T_STRIPE",
        "github": "INGRESS_T_GITHUB",
        "slack": "INGRESS_T_SLACK",
        "shopify": "INGRESS_T_SHOPIFY",
        "hubspot-v3": "INGRESS_T_HUBSPOT",
    }[preset]
    verifier = compile_spec({"preset": preset, "secrets": [{"env": env}]})
    with pytest.raises(Rejected):
        run(verifier, headers, body)

"""Every sender preset against the sender's own signing code or published example.

Each preset is an ordinary generic config (``connector.common.packs.verification.PRESETS``); these tests
compile it exactly as the route table does and check, through the real verifier, that a genuine
request verifies and that a tampered body, a wrong key and (where the scheme signs one) a stale or
future timestamp are refused. Where the sender publishes an SDK on PyPI, the SDK signs the request
or, when it only verifies, confirms that what we accept is genuine and what we refuse is not. The
sender documentation each scheme was read from is cited at its signer. The last tests run a few
presets end to end through a real ingress over HTTP.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest
import razorpay
import svix
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict
from sendgrid.helpers.eventwebhook import EventWebhook
from slack_sdk.signature import SignatureVerifier as SlackVerifier
from square.utils.webhooks_helper import verify_signature as square_verify_signature
from twilio.request_validator import RequestValidator

from connector.common.packs.verification import (
    PRESETS,
    SecretUnavailable,
    VerificationSpec,
    check_spec,
    load_secret,
    resolve,
)
from connector.ingress import verify
from connector.ingress.verify import Rejected, SignatureVerifier

from .conftest import StartIngress, install_routes, post, receipt_count, receipts

URI = "https://hooks.example.com/v1/webhooks/shop/x?tenant=7"

# -- keys ---------------------------------------------------------------------------------------------
# Shared secrets are arbitrary text (as the senders issue them); public keys belong to key pairs made
# here, the private half standing in for the sender.

_ED = ed25519.Ed25519PrivateKey.generate()
_ED_OTHER = ed25519.Ed25519PrivateKey.generate()
_DISCORD = ed25519.Ed25519PrivateKey.generate()
_EC = ec.generate_private_key(ec.SECP256R1())
_EC_OTHER = ec.generate_private_key(ec.SECP256R1())


def _raw(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _spki_b64(key: ec.EllipticCurvePrivateKey) -> str:
    return base64.b64encode(
        key.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    ).decode()


KEYS = {
    "P_SVIX": "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
    "P_SVIX_OTHER": "whsec_" + base64.b64encode(b"another svix endpoint secret").decode(),
    "P_V1A": "whpk_" + base64.b64encode(_raw(_ED)).decode(),
    "P_V1A_OTHER": "whpk_" + base64.b64encode(_raw(_ED_OTHER)).decode(),
    "P_TWILIO": "12345",
    "P_SQUARE": "Ibxx_5AKakO-3qeNVR61Dw",
    "P_SENDGRID": _spki_b64(_EC),
    "P_SENDGRID_OTHER": _spki_b64(_EC_OTHER),
    "P_PADDLE": "pdl_ntfset_01gkpjp8bkh3ys6sr5h0dg6e0y_6D1L0kqNTB1OoKu3Ffhm3vEwh5Vg0vEz",
    "P_ZOOM": "zoom-secret-token",
    "P_TWITCH": "twitch-eventsub-secret-0123456789",
    "P_DISCORD": _raw(_DISCORD).hex(),
    "P_DISCORD_OTHER": _raw(_ED_OTHER).hex(),
    "P_TYPEFORM": "typeform-webhook-secret",
    "P_CALENDLY": "calendly-signing-key",
    "P_LINEAR": "lin_wh_signing_secret",
    "P_PAGERDUTY": "pagerduty-v3-secret",
    "P_INTERCOM": "intercom-client-secret",
    "P_BITBUCKET": "bitbucket-webhook-secret",
    "P_RAZORPAY": "razorpay-webhook-secret",
    "P_SLACK": "8f742231b10e8888abcd99yyyzzz85a5",
    "P_WRONG": "a secret the sender never used",
}


@pytest.fixture(autouse=True)
def _keys_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)


def compile_preset(preset: str, env: str, **fields: Any) -> SignatureVerifier:
    """Resolve, check and compile a route's spec exactly as the route table does."""
    spec = VerificationSpec.model_validate({"preset": preset, "secrets": [{"env": env}], **fields})
    assert check_spec(spec) == []
    cfg = resolve(spec)
    return SignatureVerifier(cfg, [load_secret(ref) for ref in cfg["secrets"]])


def run(
    verifier: SignatureVerifier, headers: dict[str, str], body: bytes, *, now: float, uri: str = URI
) -> str:
    return verifier.verify(CIMultiDict(headers), body, "POST", lambda: uri, now)


def reason(verifier: SignatureVerifier, headers: dict[str, str], body: bytes, **kw: Any) -> str:
    with pytest.raises(Rejected) as info:
        run(verifier, headers, body, **kw)
    return info.value.reason


def _hmac_hex(key: str, msg: bytes, algo: str = "sha256") -> str:
    return hmac.new(key.encode(), msg, algo).hexdigest()


def _hmac_b64(key: str, msg: bytes, algo: str = "sha256") -> str:
    return base64.b64encode(hmac.new(key.encode(), msg, algo).digest()).decode()


# -- signers: each makes the headers a genuine delivery carries ------------------------------------------
# ``at`` is the sender's clock (unix seconds); ``key`` the env var of the secret it signs with.

JSON_BODY = b'{"type":"invoice.paid","id":"evt_1","data":{"amount":1200,"note":"caf\xc3\xa9"}}'
FORM = [("CallSid", "CA1234567890ABCDE"), ("From", "+14158675309"), ("Body", "Ahoy & caf\u00e9!"), ("To", "")]
FORM_BODY = urlencode(FORM).encode()


def sign_svix(body: bytes, at: float) -> dict[str, str]:
    # The svix SDK's own signer (https://docs.svix.com/receiving/verifying-payloads/how-manual).
    sig = svix.Webhook(KEYS["P_SVIX"]).sign("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", _dt(at), body.decode())
    return {
        "svix-id": "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W",
        "svix-timestamp": str(int(at)),
        "svix-signature": sig,
    }


def sign_v1a(body: bytes, at: float, key: ed25519.Ed25519PrivateKey = _ED) -> dict[str, str]:
    # https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md
    ts = str(int(at))
    sig = key.sign(b"msg_1." + ts.encode() + b"." + body)
    return {
        "webhook-id": "msg_1",
        "webhook-timestamp": ts,
        "webhook-signature": "v1a," + base64.b64encode(sig).decode(),
    }


def sign_twilio(body: bytes, at: float) -> dict[str, str]:
    # Twilio's RequestValidator (https://www.twilio.com/docs/usage/security): URL + sorted params.
    from urllib.parse import parse_qsl

    params = dict(parse_qsl(body.decode(), keep_blank_values=True))
    return {"X-Twilio-Signature": RequestValidator(KEYS["P_TWILIO"]).compute_signature(URI, params)}


def sign_square(body: bytes, at: float) -> dict[str, str]:
    # https://developer.squareup.com/docs/webhooks/step3validate: base64 HMAC over URL + body.
    return {"x-square-hmacsha256-signature": _hmac_b64(KEYS["P_SQUARE"], URI.encode() + body)}


def sign_sendgrid(body: bytes, at: float, key: ec.EllipticCurvePrivateKey = _EC) -> dict[str, str]:
    # https://www.twilio.com/docs/sendgrid/for-developers/tracking-events/getting-started-event-webhook-security-features
    ts = str(int(at))
    sig = key.sign(ts.encode() + body, ec.ECDSA(hashes.SHA256()))
    return {
        "X-Twilio-Email-Event-Webhook-Signature": base64.b64encode(sig).decode(),
        "X-Twilio-Email-Event-Webhook-Timestamp": ts,
    }


def sign_paddle(body: bytes, at: float) -> dict[str, str]:
    # As https://developer.paddle.com/webhooks/signature-verification specifies: h1 is the hex
    # HMAC-SHA256 of "<ts>:<raw body>" under the notification secret. (Paddle's SDK,
    # paddle-python-sdk, is not used: it installs a top-level `tests` package into site-packages,
    # which shadows this project's tests.)
    ts = str(int(at))
    h1 = hmac.new(KEYS["P_PADDLE"].encode(), f"{ts}:".encode() + body, hashlib.sha256).hexdigest()
    return {"Paddle-Signature": f"ts={ts};h1={h1}"}


def sign_zoom(body: bytes, at: float) -> dict[str, str]:
    # https://developers.zoom.us/docs/api/webhooks/#verify-webhook-events
    ts = str(int(at))
    sig = _hmac_hex(KEYS["P_ZOOM"], b"v0:" + ts.encode() + b":" + body)
    return {"x-zm-signature": f"v0={sig}", "x-zm-request-timestamp": ts}


def sign_twitch(body: bytes, at: float) -> dict[str, str]:
    # https://dev.twitch.tv/docs/eventsub/handling-webhook-events/#verifying-the-event-message
    whole, frac = divmod(at, 1)
    stamp = (
        datetime.fromtimestamp(int(whole), tz=UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{int(frac * 1e9):09d}Z"
    )
    msg_id = "e76c6bd4-55c9-4987-8304-da1588d8988b"
    sig = _hmac_hex(KEYS["P_TWITCH"], msg_id.encode() + stamp.encode() + body)
    return {
        "Twitch-Eventsub-Message-Id": msg_id,
        "Twitch-Eventsub-Message-Timestamp": stamp,
        "Twitch-Eventsub-Message-Signature": f"sha256={sig}",
    }


def sign_discord(body: bytes, at: float) -> dict[str, str]:
    # https://discord.com/developers/docs/interactions/overview#setting-up-an-endpoint-validating-security-request-headers
    ts = str(int(at))
    return {"X-Signature-Ed25519": _DISCORD.sign(ts.encode() + body).hex(), "X-Signature-Timestamp": ts}


def sign_typeform(body: bytes, at: float) -> dict[str, str]:
    # https://www.typeform.com/developers/webhooks/secure-your-webhooks/
    return {"Typeform-Signature": "sha256=" + _hmac_b64(KEYS["P_TYPEFORM"], body)}


def sign_calendly(body: bytes, at: float) -> dict[str, str]:
    # https://developer.calendly.com/api-docs/overview/webhooks/webhook-signatures
    ts = str(int(at))
    return {
        "Calendly-Webhook-Signature": f"t={ts},v1={_hmac_hex(KEYS['P_CALENDLY'], ts.encode() + b'.' + body)}"
    }


def sign_linear(body: bytes, at: float) -> dict[str, str]:
    # https://linear.app/developers/webhooks#securing-webhooks
    return {"Linear-Signature": _hmac_hex(KEYS["P_LINEAR"], body)}


def sign_pagerduty(body: bytes, at: float) -> dict[str, str]:
    # https://developer.pagerduty.com/docs/webhooks/v3-overview/#verifying-signatures (rotation: two)
    old = _hmac_hex("a retired pagerduty secret", body)
    return {"X-PagerDuty-Signature": f"v1={old},v1={_hmac_hex(KEYS['P_PAGERDUTY'], body)}"}


def sign_intercom(body: bytes, at: float) -> dict[str, str]:
    # https://developers.intercom.com/docs/references/webhooks/webhook-models (X-Hub-Signature, SHA-1)
    return {"X-Hub-Signature": "sha1=" + _hmac_hex(KEYS["P_INTERCOM"], body, "sha1")}


def sign_bitbucket(body: bytes, at: float) -> dict[str, str]:
    # https://support.atlassian.com/bitbucket-cloud/docs/manage-webhooks/#Secure-webhooks
    return {"X-Hub-Signature": "sha256=" + _hmac_hex(KEYS["P_BITBUCKET"], body)}


def sign_razorpay(body: bytes, at: float) -> dict[str, str]:
    # https://razorpay.com/docs/webhooks/validate-test/
    return {"X-Razorpay-Signature": _hmac_hex(KEYS["P_RAZORPAY"], body)}


def sign_slack(body: bytes, at: float) -> dict[str, str]:
    # slack_sdk's own signer (https://api.slack.com/authentication/verifying-requests-from-slack).
    ts = str(int(at))
    sig = SlackVerifier(KEYS["P_SLACK"]).generate_signature(timestamp=ts, body=body)
    assert sig is not None
    return {"X-Slack-Signature": sig, "X-Slack-Request-Timestamp": ts}


def _dt(at: float) -> datetime:
    return datetime.fromtimestamp(at, tz=UTC)


@dataclass(frozen=True)
class Case:
    preset: str
    env: str
    wrong_env: str
    sign: Callable[[bytes, float], dict[str, str]]
    scheme: str
    body: bytes = JSON_BODY

    def __str__(self) -> str:
        return self.preset


CASES = [
    Case("svix", "P_SVIX", "P_SVIX_OTHER", sign_svix, "hmac-sha256"),
    Case("standard-webhooks-v1a", "P_V1A", "P_V1A_OTHER", sign_v1a, "ed25519"),
    Case("twilio", "P_TWILIO", "P_WRONG", sign_twilio, "hmac-sha1", FORM_BODY),
    Case("square", "P_SQUARE", "P_WRONG", sign_square, "hmac-sha256"),
    Case("sendgrid", "P_SENDGRID", "P_SENDGRID_OTHER", sign_sendgrid, "ecdsa-sha256"),
    Case("paddle", "P_PADDLE", "P_WRONG", sign_paddle, "hmac-sha256"),
    Case("zoom", "P_ZOOM", "P_WRONG", sign_zoom, "hmac-sha256"),
    Case("twitch", "P_TWITCH", "P_WRONG", sign_twitch, "hmac-sha256"),
    Case("discord", "P_DISCORD", "P_DISCORD_OTHER", sign_discord, "ed25519"),
    Case("typeform", "P_TYPEFORM", "P_WRONG", sign_typeform, "hmac-sha256"),
    Case("calendly", "P_CALENDLY", "P_WRONG", sign_calendly, "hmac-sha256"),
    Case("linear", "P_LINEAR", "P_WRONG", sign_linear, "hmac-sha256"),
    Case("pagerduty", "P_PAGERDUTY", "P_WRONG", sign_pagerduty, "hmac-sha256"),
    Case("intercom", "P_INTERCOM", "P_WRONG", sign_intercom, "hmac-sha1"),
    Case("bitbucket", "P_BITBUCKET", "P_WRONG", sign_bitbucket, "hmac-sha256"),
    Case("razorpay", "P_RAZORPAY", "P_WRONG", sign_razorpay, "hmac-sha256"),
    Case("slack", "P_SLACK", "P_WRONG", sign_slack, "hmac-sha256"),
]
TIMESTAMPED = [
    c for c in CASES if "timestamp_header" in PRESETS[c.preset] or "kv_timestamp_key" in PRESETS[c.preset]
]


def _tampered(body: bytes) -> bytes:
    # One byte changed in a value: still the same shape (valid JSON / form), no longer what was signed.
    return body.replace(b"1", b"2", 1) if b"1" in body else body + b" "


def test_every_new_preset_has_a_case() -> None:
    # A preset added without a test here fails this (the older ones are in test_verification).
    older = {"standard-webhooks", "stripe", "github", "github-sha1", "shopify", "hubspot-v3"}
    assert set(PRESETS) - older == {c.preset for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_genuine_delivery_verifies_and_names_the_key_reference(case: Case) -> None:
    now = time.time()
    verifier = compile_preset(case.preset, case.env)
    assert run(verifier, case.sign(case.body, now), case.body, now=now) == f"{case.scheme}:env:{case.env}"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_tampered_body_is_refused(case: Case) -> None:
    now = time.time()
    verifier = compile_preset(case.preset, case.env)
    headers = case.sign(case.body, now)
    tampered = _tampered(case.body)
    assert tampered != case.body
    assert reason(verifier, headers, tampered, now=now) == verify.SIGNATURE_MISMATCH


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_wrong_key_is_refused(case: Case) -> None:
    now = time.time()
    verifier = compile_preset(case.preset, case.wrong_env)
    assert reason(verifier, case.sign(case.body, now), case.body, now=now) == verify.SIGNATURE_MISMATCH


@pytest.mark.parametrize("case", TIMESTAMPED, ids=str)
def test_stale_and_future_timestamps_are_refused(case: Case) -> None:
    tolerance = PRESETS[case.preset]["tolerance_s"]
    now = time.time()
    verifier = compile_preset(case.preset, case.env)
    inside = case.sign(case.body, now - tolerance + 2)
    assert run(verifier, inside, case.body, now=now).startswith(case.scheme)  # control: edge still fine
    stale = case.sign(case.body, now - tolerance - 2)
    assert reason(verifier, stale, case.body, now=now) == verify.TIMESTAMP_STALE
    future = case.sign(case.body, now + tolerance + 2)
    assert reason(verifier, future, case.body, now=now) == verify.TIMESTAMP_FUTURE


def test_the_schemes_without_a_timestamp_are_the_ones_their_senders_document() -> None:
    # No replay window to check for these: the sender signs no time (their docs say so).
    untimed = {c.preset for c in CASES} - {c.preset for c in TIMESTAMPED}
    assert untimed == {
        "twilio",
        "square",
        "typeform",
        "linear",
        "pagerduty",
        "intercom",
        "bitbucket",
        "razorpay",
    }


# -- the senders' SDKs agree with the verifier ---------------------------------------------------------


def test_svix_sdk_verifies_what_we_accept_and_refuses_what_we_refuse() -> None:
    now = time.time()
    headers = sign_svix(JSON_BODY, now)
    wh = svix.Webhook(KEYS["P_SVIX"])
    wh.verify(JSON_BODY, headers)
    with pytest.raises(svix.webhooks.WebhookVerificationError):
        wh.verify(_tampered(JSON_BODY), headers)
    # Svix rotates by sending several signatures; one matching is enough, for both sides.
    rotated = {
        **headers,
        "svix-signature": "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= " + headers["svix-signature"],
    }
    wh.verify(JSON_BODY, rotated)
    assert run(compile_preset("svix", "P_SVIX"), rotated, JSON_BODY, now=now) == "hmac-sha256:env:P_SVIX"


def test_svix_preset_is_standard_webhooks_under_svix_headers() -> None:
    # The same signature under the webhook-* names is not a Svix delivery (the headers are the config).
    now = time.time()
    h = sign_svix(JSON_BODY, now)
    renamed = {
        "webhook-id": h["svix-id"],
        "webhook-timestamp": h["svix-timestamp"],
        "webhook-signature": h["svix-signature"],
    }
    assert reason(compile_preset("svix", "P_SVIX"), renamed, JSON_BODY, now=now) == verify.SIGNATURE_MISSING
    assert (
        run(compile_preset("standard-webhooks", "P_SVIX"), renamed, JSON_BODY, now=now)
        == "hmac-sha256:env:P_SVIX"
    )


def test_standard_webhooks_v1a_published_vector() -> None:
    # The spec repository's Go library test (libraries/go/webhook_asymmetric_test.go,
    # TestAsymmetricWebhookSign): this private seed signs this message to exactly this signature.
    seed = base64.b64decode("VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk=")
    public = (
        ed25519.Ed25519PrivateKey.from_private_bytes(seed)
        .public_key()
        .public_bytes(Encoding.Raw, PublicFormat.Raw)
    )
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1a,tQ9V2XOqn7jL/DQenEFpqIugdBVtiMmER5mhSkXBNwM0mkATuDe6KYYUuxqtaiHeYGb7Ka"
        "aBRdM5WqyeFiL8Ag==",
    }
    body = b'{"test": 2432232314}'
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("P_V1A_VECTOR", "whpk_" + base64.b64encode(public).decode())
        verifier = compile_preset("standard-webhooks-v1a", "P_V1A_VECTOR")
    assert run(verifier, headers, body, now=1614265330) == "ed25519:env:P_V1A_VECTOR"
    assert reason(verifier, headers, b'{"test": 2432232315}', now=1614265330) == verify.SIGNATURE_MISMATCH
    # The spec's mixed header: a symmetric v1 entry beside the v1a one is skipped, not an error.
    mixed = {
        **headers,
        "webhook-signature": "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4= "
        + headers["webhook-signature"],
    }
    assert run(verifier, mixed, body, now=1614265330) == "ed25519:env:P_V1A_VECTOR"
    # At most four candidates for a public-key scheme (each costs a signature check), sixteen for HMAC.
    many = {**headers, "webhook-signature": " ".join([headers["webhook-signature"]] * 5)}
    assert reason(verifier, many, body, now=1614265330) == verify.SIGNATURE_MALFORMED
    four = {**headers, "webhook-signature": " ".join([headers["webhook-signature"]] * 4)}
    assert run(verifier, four, body, now=1614265330) == "ed25519:env:P_V1A_VECTOR"
    # And a header with only symmetric entries carries nothing for this scheme.
    only_v1 = {**headers, "webhook-signature": "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4="}
    assert reason(verifier, only_v1, body, now=1614265330) == verify.SIGNATURE_MALFORMED


def test_twilio_published_example_and_request_validator_agree() -> None:
    # Twilio's documented example (https://www.twilio.com/docs/usage/security), which its
    # RequestValidator reproduces: auth token 12345, this URL, these five POST parameters.
    uri = "https://mycompany.com/myapp.php?foo=1&bar=2"
    params = {
        "CallSid": "CA1234567890ABCDE",
        "Caller": "+14158675309",
        "Digits": "1234",
        "From": "+14158675309",
        "To": "+18005551212",
    }
    assert RequestValidator("12345").compute_signature(uri, params) == "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    verifier = compile_preset("twilio", "P_TWILIO")
    # The body as Twilio posts it: form-encoded, any order (the scheme sorts).
    body = urlencode(sorted(params.items(), reverse=True)).encode()
    headers = {"X-Twilio-Signature": "RSOYDt4T1cUTdK1PDd93/VVr8B8="}
    assert run(verifier, headers, body, now=time.time(), uri=uri) == "hmac-sha1:env:P_TWILIO"
    assert (
        reason(verifier, headers, body.replace(b"1234", b"9999"), now=time.time(), uri=uri)
        == verify.SIGNATURE_MISMATCH
    )
    # The URL is signed too: another query string is another signature.
    assert reason(verifier, headers, body, now=time.time(), uri=uri + "&x=1") == verify.SIGNATURE_MISMATCH


def test_twilio_repeated_parameters_sort_by_value_like_the_sdk() -> None:
    params = CIMultiDict(
        [("MediaUrl", "https://b.example/2"), ("MediaUrl", "https://a.example/1"), ("NumMedia", "2")]
    )
    sig = RequestValidator(KEYS["P_TWILIO"]).compute_signature(URI, params)
    body = urlencode(list(params.items())).encode()
    assert (
        run(compile_preset("twilio", "P_TWILIO"), {"X-Twilio-Signature": sig}, body, now=time.time())
        == "hmac-sha1:env:P_TWILIO"
    )
    assert RequestValidator(KEYS["P_TWILIO"]).validate(URI, params, sig)


@pytest.mark.parametrize(
    "body",
    [b"a=%ff", b"&".join([b"a="] * 1001), b"\xff=1"],
    ids=["bad-utf8-escape", "too-many-fields", "raw-non-utf8"],
)
def test_twilio_bodies_that_are_not_forms_cannot_match(body: bytes) -> None:
    # Whatever the signature says: no content can be built, so nothing can match (never a 500).
    headers = {"X-Twilio-Signature": _hmac_b64(KEYS["P_TWILIO"], URI.encode(), "sha1")}
    assert (
        reason(compile_preset("twilio", "P_TWILIO"), headers, body, now=time.time())
        == verify.SIGNATURE_MISMATCH
    )


def test_square_sdk_agrees() -> None:
    headers = sign_square(JSON_BODY, time.time())
    sig = headers["x-square-hmacsha256-signature"]
    kw = {"signature_header": sig, "signature_key": KEYS["P_SQUARE"], "notification_url": URI}
    assert square_verify_signature(request_body=JSON_BODY.decode(), **kw)
    assert not square_verify_signature(request_body=_tampered(JSON_BODY).decode(), **kw)
    # Square signs the notification URL: a delivery verified against another URL fails, and so
    # does one whose Host had bytes no URL can carry (never an exception).
    verifier = compile_preset("square", "P_SQUARE")
    assert reason(verifier, headers, JSON_BODY, now=time.time(), uri="https://h\udcff.example/x") == (
        verify.SIGNATURE_MISMATCH
    )
    assert (
        reason(verifier, headers, JSON_BODY, now=time.time(), uri=URI.replace("tenant=7", "tenant=8"))
        == verify.SIGNATURE_MISMATCH
    )


def test_sendgrid_published_vector_and_sdk_agree() -> None:
    # sendgrid-python's own test (test/unit/test_eventwebhook.py): SendGrid's public key, signature,
    # timestamp and payload (with its trailing CRLF).
    public_key = (
        "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE83T4O/n84iotIvIW4mdBgQ/7dAfSmpqIM8kF9mN1flpVKS3GRqe62gw+"
        "2fNNRaINXvVpiglSI8eNEc6wEA3F+g=="
    )
    signature = (
        "MEUCIGHQVtGj+Y3LkG9fLcxf3qfI10QysgDWmMOVmxG0u6ZUAiEAyBiXDWzM+uOe5W0JuG+luQAbPIqHh89M15TluLtEZtM="
    )
    timestamp = "1600112502"
    payload = (
        json.dumps(
            [
                {
                    "email": "hello@world.com",
                    "event": "dropped",
                    "reason": "Bounced Address",
                    "sg_event_id": "ZHJvcC0xMDk5NDkxOS1MUnpYbF9OSFN0T0doUTRrb2ZTbV9BLTA",
                    "sg_message_id": "LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-756b745b58-kmzbl-18-"
                    "5F5FC76C-9.0",
                    "smtp-id": "<LRzXl_NHStOGhQ4kofSm_A@ismtpd0039p1iad1.sendgrid.net>",
                    "timestamp": 1600112492,
                }
            ],
            sort_keys=True,
            separators=(",", ":"),
        )
        + "\r\n"
    )
    assert EventWebhook(public_key).verify_signature(payload, signature, timestamp)
    headers = {
        "X-Twilio-Email-Event-Webhook-Signature": signature,
        "X-Twilio-Email-Event-Webhook-Timestamp": timestamp,
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("P_SENDGRID_VECTOR", public_key)
        verifier = compile_preset("sendgrid", "P_SENDGRID_VECTOR")
    now = int(timestamp) + 10
    assert run(verifier, headers, payload.encode(), now=now) == "ecdsa-sha256:env:P_SENDGRID_VECTOR"
    assert reason(verifier, headers, payload.encode().rstrip(), now=now) == verify.SIGNATURE_MISMATCH
    # Our own signer's requests pass the SDK's verifier too.
    ours = sign_sendgrid(JSON_BODY, time.time())
    sdk = EventWebhook(KEYS["P_SENDGRID"])
    sig, ts = ours["X-Twilio-Email-Event-Webhook-Signature"], ours["X-Twilio-Email-Event-Webhook-Timestamp"]
    assert sdk.verify_signature(JSON_BODY.decode(), sig, ts)
    assert not sdk.verify_signature(_tampered(JSON_BODY).decode(), sig, ts)


def test_paddle_secret_rotation_two_h1_entries() -> None:
    now = time.time()
    headers = sign_paddle(JSON_BODY, now)
    # During a secret rotation Paddle sends two h1 entries; either may be the current secret's.
    ts, h1 = headers["Paddle-Signature"].split(";")
    rotated = {"Paddle-Signature": f"{ts};h1={'0' * 64};{h1}"}
    assert (
        run(compile_preset("paddle", "P_PADDLE"), rotated, JSON_BODY, now=now) == "hmac-sha256:env:P_PADDLE"
    )


def test_razorpay_sdk_agrees() -> None:
    sig = sign_razorpay(JSON_BODY, time.time())["X-Razorpay-Signature"]
    razorpay.Utility().verify_webhook_signature(JSON_BODY.decode(), sig, KEYS["P_RAZORPAY"])
    with pytest.raises(razorpay.errors.SignatureVerificationError):
        razorpay.Utility().verify_webhook_signature(_tampered(JSON_BODY).decode(), sig, KEYS["P_RAZORPAY"])


def test_slack_sdk_verifier_agrees() -> None:
    now = time.time()
    headers = sign_slack(JSON_BODY, now)
    assert SlackVerifier(KEYS["P_SLACK"]).is_valid_request(JSON_BODY, headers)
    assert not SlackVerifier(KEYS["P_SLACK"]).is_valid_request(_tampered(JSON_BODY), headers)


def test_twitch_rfc3339_timestamps_signed_as_sent() -> None:
    # Twitch sends nanosecond RFC 3339 stamps; the signed text is the header as sent, the window
    # is computed from the parsed instant (offsets honoured), and a non-date is malformed.
    verifier = compile_preset("twitch", "P_TWITCH")
    now = time.time()
    headers = sign_twitch(JSON_BODY, now)
    assert run(verifier, headers, JSON_BODY, now=now) == "hmac-sha256:env:P_TWITCH"
    stamp = "2023-07-19T16:56:51.634234626+02:00"  # 14:56:51Z
    msg_id = headers["Twitch-Eventsub-Message-Id"]
    sig = _hmac_hex(KEYS["P_TWITCH"], msg_id.encode() + stamp.encode() + JSON_BODY)
    offset = {
        **headers,
        "Twitch-Eventsub-Message-Timestamp": stamp,
        "Twitch-Eventsub-Message-Signature": f"sha256={sig}",
    }
    instant = datetime(2023, 7, 19, 14, 56, 51, tzinfo=UTC).timestamp()
    assert run(verifier, offset, JSON_BODY, now=instant + 599) == "hmac-sha256:env:P_TWITCH"
    assert reason(verifier, offset, JSON_BODY, now=instant + 601) == verify.TIMESTAMP_STALE
    for bad in (
        "1689778611",
        "2023-02-30T10:00:00Z",
        "2023-07-19T14:56:51",
        "2023-07-19T14:56:51.1234567890Z",
    ):
        malformed = {**headers, "Twitch-Eventsub-Message-Timestamp": bad}
        assert reason(verifier, malformed, JSON_BODY, now=now) == verify.TIMESTAMP_MALFORMED, bad


def test_rfc3339_parser() -> None:
    assert verify.rfc3339_seconds("1970-01-01T00:00:00Z") == 0
    assert verify.rfc3339_seconds("1970-01-01T01:00:00.5+01:00") == 0.5
    assert verify.rfc3339_seconds("1969-12-31T23:00:00-01:00") == 0
    assert verify.rfc3339_seconds("1970-01-01T00:00:00+24:00") is None
    assert verify.rfc3339_seconds("1970-01-01 00:00:00Z") is None


# -- public keys: references, loaded and checked when the route loads -----------------------------------


def test_public_keys_load_from_whpk_hex_base64_der_and_pem(tmp_path: Any) -> None:
    raw = _raw(_ED)
    pem = _ED.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "ed.pem").write_bytes(pem)
    ec_pem = _EC.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "ec.pem").write_bytes(ec_pem)
    ed = {"key_type": "ed25519"}
    assert load_secret({"env": "P_V1A", "encoding": "whpk", **ed}).key == raw
    assert load_secret({"env": "P_DISCORD", "encoding": "hex", **ed}).key == _raw(_DISCORD)
    assert load_secret({"file": str(tmp_path / "ed.pem"), "encoding": "whpk", **ed}).key == raw
    der = _EC.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    assert load_secret({"env": "P_SENDGRID", "encoding": "base64", "key_type": "ecdsa"}).key == der
    assert (
        load_secret({"file": str(tmp_path / "ec.pem"), "encoding": "base64", "key_type": "ecdsa"}).key == der
    )


@pytest.mark.parametrize(
    ("ref", "key_type"),
    [
        ({"env": "P_SENDGRID", "encoding": "base64"}, "ed25519"),  # an EC key where ed25519 is expected
        ({"env": "P_V1A", "encoding": "whpk"}, "ecdsa"),  # 32 raw bytes are no DER key
        ({"env": "P_WRONG", "encoding": "hex"}, "ed25519"),  # not hex
        ({"env": "P_SVIX", "encoding": "whsec"}, "ed25519"),  # a 24-byte secret is no public key
    ],
)
def test_a_key_of_the_wrong_kind_is_unavailable_and_named_by_reference(
    ref: dict[str, str], key_type: str
) -> None:
    with pytest.raises(SecretUnavailable) as info:
        load_secret({**ref, "key_type": key_type})
    assert ref["env"] in str(info.value)
    assert KEYS[ref["env"]] not in str(info.value)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (
            {"preset": "discord", "algorithm": "sha256", "secrets": [{"env": "X"}]},
            "ed25519 takes no algorithm",
        ),
        (
            {"preset": "sendgrid", "algorithm": "sha1", "secrets": [{"env": "X"}]},
            "ecdsa takes algorithm sha256",
        ),
        (
            {"preset": "standard-webhooks-v1a", "secrets": [{"env": "X", "encoding": "whsec"}]},
            "not a public key",
        ),
        ({"preset": "svix", "secrets": [{"env": "X", "encoding": "whpk"}]}, "cannot verify an HMAC"),
        (
            {"preset": "twilio", "signed_content": "{uri}{sorted_form}{body}", "secrets": [{"env": "X"}]},
            "exactly once",
        ),
        ({"preset": "paddle", "kv_separator": ":", "secrets": [{"env": "X"}]}, "kv_separator must be"),
        ({"preset": "github", "kv_separator": ";", "secrets": [{"env": "X"}]}, "signature_format is not kv"),
    ],
)
def test_check_spec_refuses_impossible_public_key_and_form_configs(
    spec: dict[str, Any], problem: str
) -> None:
    problems = check_spec(VerificationSpec.model_validate(spec))
    assert any(problem in p for p in problems), problems


def test_resolve_marks_public_key_references_and_hmac_ones_not() -> None:
    v1a = resolve(
        VerificationSpec.model_validate({"preset": "standard-webhooks-v1a", "secrets": [{"env": "X"}]})
    )
    assert v1a["secrets"] == [{"env": "X", "file": None, "encoding": "whpk", "key_type": "ed25519"}]
    svx = resolve(VerificationSpec.model_validate({"preset": "svix", "secrets": [{"env": "X"}]}))
    assert svx["secrets"] == [{"env": "X", "file": None, "encoding": "whsec"}]


def test_asymmetric_malformed_signatures_are_rejections() -> None:
    now = time.time()
    verifier = compile_preset("sendgrid", "P_SENDGRID")
    headers = sign_sendgrid(JSON_BODY, now)
    for bad in ("", "AAAA", base64.b64encode(b"\x30" * 200).decode(), "not base64!"):
        assert reason(
            verifier, {**headers, "X-Twilio-Email-Event-Webhook-Signature": bad}, JSON_BODY, now=now
        ) in (
            verify.SIGNATURE_MALFORMED,
            verify.SIGNATURE_MISMATCH,
        )
    # A DER-shaped signature that is not a valid one for this key: a mismatch, not an exception.
    junk = base64.b64encode(b"\x30\x06\x02\x01\x01\x02\x01\x01").decode()
    assert (
        reason(verifier, {**headers, "X-Twilio-Email-Event-Webhook-Signature": junk}, JSON_BODY, now=now)
        == verify.SIGNATURE_MISMATCH
    )
    discord = compile_preset("discord", "P_DISCORD")
    dh = sign_discord(JSON_BODY, now)
    assert (
        reason(discord, {**dh, "X-Signature-Ed25519": "00" * 63}, JSON_BODY, now=now)
        == verify.SIGNATURE_MALFORMED
    )
    assert (
        reason(discord, {**dh, "X-Signature-Ed25519": "00" * 64}, JSON_BODY, now=now)
        == verify.SIGNATURE_MISMATCH
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    case=st.sampled_from(CASES),
    values=st.lists(
        st.text(max_size=160)
        | st.from_regex(r"(v1,|v1a,|t=\d{1,12},v1=|ts=\d{1,12};h1=|sha256=|sha1=|v0=)[0-9a-zA-Z+/=]{0,130}")
        | st.from_regex(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,12})?(Z|[+-]\d{2}:\d{2})?"),
        min_size=3,
        max_size=3,
    ),
    drop=st.sets(st.integers(0, 2)),
    body=st.binary(max_size=256) | st.sampled_from([JSON_BODY, FORM_BODY]),
)
def test_any_header_values_are_only_ever_rejections(
    case: Case, values: list[str], drop: set[int], body: bytes
) -> None:
    # Whatever a stranger puts in the headers a preset reads: a rejection, never another exception.
    cfg = PRESETS[case.preset]
    names = [
        cfg["signature_header"],
        cfg.get("timestamp_header") or "X-Unused-1",
        cfg.get("id_header") or "X-Unused-2",
    ]
    headers = {
        name: value for i, (name, value) in enumerate(zip(names, values, strict=True)) if i not in drop
    }
    with pytest.raises(Rejected):
        run(compile_preset(case.preset, case.env), headers, body, now=time.time())


# -- end to end: a real ingress over HTTP -----------------------------------------------------------------

E2E_ROUTES: list[dict[str, Any]] = [
    {
        "key": "svix",
        "verification": {"preset": "svix", "secrets": [{"env": "P_SVIX"}]},
        "idempotency_header": "svix-id",
    },
    {"key": "v1a", "verification": {"preset": "standard-webhooks-v1a", "secrets": [{"env": "P_V1A"}]}},
    {"key": "sendgrid", "verification": {"preset": "sendgrid", "secrets": [{"env": "P_SENDGRID"}]}},
    {"key": "paddle", "verification": {"preset": "paddle", "secrets": [{"env": "P_PADDLE"}]}},
    {
        "key": "twilio",
        "content": "any",
        "verification": {"preset": "twilio", "secrets": [{"env": "P_TWILIO"}]},
    },
]
PUBLIC_BASE = "https://hooks.example.com"


@pytest.mark.parametrize(
    ("route", "sign", "content_type"),
    [
        ("svix", sign_svix, "application/json"),
        ("v1a", sign_v1a, "application/json"),
        ("sendgrid", sign_sendgrid, "application/json"),
        ("paddle", sign_paddle, "application/json"),
    ],
)
async def test_presets_end_to_end_over_http(
    db_url: str,
    start_ingress: StartIngress,
    http: aiohttp.ClientSession,
    route: str,
    sign: Any,
    content_type: str,
) -> None:
    install_routes(db_url, E2E_ROUTES)
    svc = await start_ingress(install=False)
    headers = sign(JSON_BODY, time.time())
    refused = await post(http, svc, route, _tampered(JSON_BODY), headers, content_type=content_type)
    assert (refused.status, refused.body.get("error")) == (401, verify.SIGNATURE_MISMATCH)
    assert receipt_count(db_url) == 0
    accepted = await post(http, svc, route, JSON_BODY, headers, content_type=content_type)
    assert accepted.status == 200, accepted.body
    rows = receipts(db_url)
    assert len(rows) == 1 and bytes(rows[0]["body"]) == JSON_BODY
    env = next(r["verification"]["secrets"][0]["env"] for r in E2E_ROUTES if r["key"] == route)
    assert rows[0]["verification"].endswith(f":env:{env}")
    # Nothing of the key or signature is kept: the receipt names the scheme and the reference.
    assert all(v not in rows[0]["verification"] for v in headers.values())


async def test_twilio_form_post_end_to_end_signs_the_public_url_and_query(
    db_url: str, start_ingress: StartIngress, http: aiohttp.ClientSession
) -> None:
    install_routes(db_url, E2E_ROUTES)
    svc = await start_ingress(install=False, public_base_url=PUBLIC_BASE)
    path = "/v1/webhooks/shop/twilio?account=AC1"
    sig = RequestValidator(KEYS["P_TWILIO"]).compute_signature(PUBLIC_BASE + path, dict(FORM))
    url = f"http://127.0.0.1:{svc.http_port}{path}"
    form = {"Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": sig}
    async with http.post(url, data=FORM_BODY.replace(b"Ahoy", b"Ahoi"), headers=form) as r:
        assert r.status == 401
    async with http.post(url.replace("AC1", "AC2"), data=FORM_BODY, headers=form) as r:
        assert r.status == 401  # the query string is signed
    assert receipt_count(db_url) == 0
    async with http.post(url, data=FORM_BODY, headers=form) as r:
        assert r.status == 200, await r.text()
    rows = receipts(db_url)
    assert len(rows) == 1 and rows[0]["verification"] == "hmac-sha1:env:P_TWILIO"

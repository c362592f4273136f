"""The vendored browser assets are exactly the pinned packages' files (VENDOR.json: sha256 of each),
each package with its licence, and the pages load nothing else from outside this origin."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import connector.console

STATIC = Path(connector.console.__file__).parent / "static"
TEMPLATES = Path(connector.console.__file__).parent / "templates"


def test_vendored_files_match_their_pinned_hashes() -> None:
    vendor = json.loads((STATIC / "vendor" / "VENDOR.json").read_text())
    listed = set()
    for package in vendor["packages"]:
        assert package["version"] and package["license"] and package["npm_integrity"].startswith("sha512-")
        assert any(name.endswith(".LICENSE") for name in package["files"]), package["name"]
        for name, meta in package["files"].items():
            data = (STATIC / "vendor" / name).read_bytes()
            assert hashlib.sha256(data).hexdigest() == meta["sha256"], f"{name} differs from the pinned file"
            listed.add(name)
    on_disk = {p.name for p in (STATIC / "vendor").iterdir()} - {"VENDOR.json"}
    assert on_disk == listed, "every vendored file is listed (and only those)"


def test_templates_reference_only_this_origin_and_no_inline_code() -> None:
    seen = 0
    for path in sorted(TEMPLATES.glob("*.html")):
        text = path.read_text()
        seen += 1
        for url in re.findall(r'(?:src|href|action)="([^"{]+)', text):
            assert url.startswith(("/", "#")), f"{path.name}: {url} leaves this origin"
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), f"{path.name}: inline script"
        assert not re.search(r"\son[a-z]+=", text), f"{path.name}: inline event handler"
        assert "style=" not in text and "<style" not in text, f"{path.name}: inline style"
    assert seen >= 10

"""`redacted`: named fields become `sha256:<hex>`, nested paths and list indexes included; the
input is never modified, and missing paths are ignored."""

from __future__ import annotations

import hashlib

from policies.keys import canonical_json
from policies.redaction import redacted


def test_named_fields_are_replaced_by_their_hash_and_the_rest_is_kept():
    """A top-level field, a nested one and a list element are hashed; others stay as they were."""
    arguments = {"to": "a", "body": "secret", "card": {"number": 4111}, "files": [{"data": "x"}]}
    out = redacted(arguments, ["body", "card.number", "files.0.data", "nope.deeper", "files.9"])
    digest = "sha256:" + hashlib.sha256(canonical_json("secret").encode()).hexdigest()
    assert out["body"] == digest
    assert out["card"]["number"].startswith("sha256:")
    assert out["files"][0]["data"].startswith("sha256:")
    assert out["to"] == "a"
    assert arguments["body"] == "secret"
    assert arguments["card"]["number"] == 4111


def test_no_fields_returns_the_arguments_themselves():
    """Without a redact list nothing is copied."""
    arguments = {"a": 1}
    assert redacted(arguments, []) is arguments
    assert redacted(None, ["a"]) is None

"""Idempotency keys and request fingerprints.

A call's *fingerprint* is the hash of its operation (the MCP tool name; for HTTP the method and
normalised path) and its full canonical arguments: it tells "the same call sent again under its
key" (replay) from "the key reused for something else" (mismatch) — another tool or path with the
same arguments included, so a `refund` can never be answered with an earlier `charge`'s outcome.
Absent arguments (`None`) are not the same as empty ones (`{}`).
The *key* names the ledger entry: the caller's explicit key, or one derived from canonical JSON, or
none. Keys are scoped by tenant and upstream in the ledger, so an explicit key is returned as given.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any, Literal

import orjson

from policies.model import KeyRecipe

__all__ = ["KeyDecision", "canonical_json", "decide_key", "fingerprint", "pick_field"]

KeySource = Literal["explicit", "derived", "none"]


def canonical_json(value: Any) -> str:
    """Serialise a JSON-like value so that equal values give equal text.

    Object keys are sorted, strings (keys too) are put in Unicode NFC, numbers are normalised
    (an integral float such as `1.0` is written `1`, `-0.0` is `0`), and no spaces are written.

    Raises:
        TypeError: a value that JSON cannot carry (sets, bytes, objects, non-string keys).
        ValueError: NaN or infinity, or two keys of one object that are equal once normalised.
    """
    return _dumps(_normalise(value))


def _dumps(normal: Any) -> str:
    """The canonical text of a value already in canonical form (`_normalise`)."""
    return json.dumps(
        normal, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def fingerprint(operation: str, arguments: Any) -> str:
    """The sha256 hex digest of the operation and the canonical arguments (`None`: absent).

    Raises:
        TypeError, ValueError: arguments that have no canonical JSON form (see `canonical_json`).
    """
    return _print_of(operation, _arguments_utf8(arguments))


def _arguments_utf8(arguments: Any) -> bytes:
    """The canonical text of `arguments` as UTF-8, the walk and the writing done once."""
    floats: list[float] = []
    normal = _normalise(arguments, floats)
    return _canonical_utf8(normal, has_floats=bool(floats))


def _print_of(operation: str, arguments: bytes) -> str:
    """The fingerprint from the operation and the canonical text of the arguments (UTF-8)."""
    return _object_hash({"operation": _member_text(operation), "arguments": arguments})


def _string_text(value: str | None) -> str:
    """What `_dumps` writes for a string (put in NFC here) or None, without its set-up cost."""
    return "null" if value is None else encode_basestring(unicodedata.normalize("NFC", value))


@functools.lru_cache(maxsize=1024)
def _member_text(value: str | None) -> bytes:
    """`_string_text` as UTF-8, for the strings a key's context repeats call after call (the
    tenant, upstream, tool, recipe and run id), each written once while it stays in use."""
    return _utf8(_string_text(value))


_NAME_TEXT: dict[str, bytes] = {}  # a member's name as written before its value: b'"name":'
_LARGE_MEMBER = 4096  # a member this long is fed to the hash as it is, not copied


def _object_hash(members: dict[str, bytes]) -> str:
    """The sha256 hex digest of an object's canonical text, fed to the hash from its members'
    canonical texts (UTF-8): the digest of `_dumps` of the whole object (names sorted, no spaces),
    without writing megabytes of arguments out a second time. Names are ASCII, already in NFC.
    The small pieces are joined and hashed at once; a large member is hashed where it lies."""
    digest = hashlib.sha256()
    pieces = [b"{"]
    for index, name in enumerate(sorted(members)):
        if index:
            pieces.append(b",")
        written = _NAME_TEXT.get(name)
        if written is None:
            written = _NAME_TEXT[name] = b'"%s":' % name.encode()
        pieces.append(written)
        value = members[name]
        if len(value) >= _LARGE_MEMBER:
            digest.update(b"".join(pieces))
            digest.update(value)
            pieces.clear()
        else:
            pieces.append(value)
    pieces.append(b"}")
    digest.update(b"".join(pieces))
    return digest.hexdigest()


def _utf8(text: str) -> bytes:
    return text.encode("utf-8")


def _canonical_utf8(normal: Any, *, has_floats: bool) -> bytes:
    """The canonical text of a value in canonical form, as UTF-8.

    Without floats orjson writes the very bytes `_dumps` writes (names sorted, no spaces,
    characters as they are, the same escapes: tested over every code point), about ten times
    faster on a large argument. A float is written by the standard library, which spells some
    exponents otherwise (`2.5e-07` where orjson writes `2.5e-7`), and so is what orjson refuses
    (an integer beyond 64 bits, nesting deeper than it goes): a key must never change.
    """
    if not has_floats:
        try:
            return orjson.dumps(normal, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            pass
    return _utf8(_dumps(normal))


@dataclass(frozen=True, slots=True)
class KeyDecision:
    """The idempotency key of one call (`None`: no dedupe) and the fingerprint stored with it.

    `dedup_window_s`: how long the key recognises a repeat as a retry of this call; `None` for an
    explicit key, which holds for the ledger's retention.
    """

    key: str | None
    source: KeySource
    fingerprint: str
    dedup_window_s: float | None = None


def decide_key(
    recipe: KeyRecipe,
    *,
    explicit: str | None,
    tenant: str,
    upstream: str,
    operation: str,
    arguments: Any,
    run_id: str | None,
    window_s: float | None = None,
) -> KeyDecision:
    """Pick the key of a call: the caller's key wins, else the recipe decides.

    `operation` is the tool name (MCP) or "METHOD /path" (HTTP). `derived` hashes tenant,
    upstream, operation, run id and all arguments (absent ones as null); `fields` hashes the same
    context with only the named argument fields (dotted paths reach into objects, numeric parts
    index lists; a missing field counts as null), so rewording an unnamed free-text field keeps
    the key. `explicit` without a caller key, and `none`, give no key. A blank explicit key counts
    as absent. A derived key dedupes for `window_s` (the caller's explicit key: for retention).

    Raises:
        TypeError, ValueError: arguments that have no canonical JSON form (see `canonical_json`).
    """
    # The arguments are put in canonical form and written as text once, for the fingerprint and
    # a derived key: the walk is Python code, and the arguments may be megabytes.
    arguments_text = _arguments_utf8(arguments)
    arguments_print = _print_of(operation, arguments_text)
    if explicit is not None and explicit.strip():
        return KeyDecision(explicit, "explicit", arguments_print)
    if recipe.mode in ("none", "explicit"):
        return KeyDecision(None, "none", arguments_print)
    context = {"recipe": recipe.mode, "tenant": tenant, "upstream": upstream, "tool": operation}
    members = {name: _member_text(value) for name, value in context.items()}
    members["run_id"] = _member_text(run_id)
    if recipe.mode == "fields":
        args = {} if arguments is None else arguments
        picked = {name: pick_field(args, name) for name in recipe.fields}
        members["fields"] = _utf8(_dumps(_normalise(picked)))
    else:
        members["arguments"] = arguments_text
    key = _object_hash(members)
    return KeyDecision(key, "derived", arguments_print, dedup_window_s=window_s)


def pick_field(arguments: Any, path: str) -> Any:
    """The value at a dotted `path` inside `arguments`, or `None` when any step is missing."""
    node = arguments
    for part in path.split("."):
        if isinstance(node, Mapping):
            if part not in node:
                return None
            node = node[part]
        elif isinstance(node, Sequence) and not isinstance(node, str) and part.isdigit():
            index = int(part)
            if index >= len(node):
                return None
            node = node[index]
        else:
            return None
    return node


def _normalise(value: Any, floats: list[float] | None = None) -> Any:
    """`value` in canonical form; the non-integral floats kept in it are appended to `floats`."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} has no JSON form")
        if value.is_integer():
            return int(value)
        if floats is not None:
            floats.append(value)
        return value
    if isinstance(value, Mapping):
        return _normalise_object(value, floats)
    if isinstance(value, list | tuple):
        return [_normalise(item, floats) for item in value]
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _normalise_object(
    value: Mapping[Any, Any], floats: list[float] | None = None
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise TypeError(f"object key {key!r} is not a string")
        name = unicodedata.normalize("NFC", key)
        if name in result:
            raise ValueError(f"object keys collide once put in Unicode NFC: {name!r}")
        result[name] = _normalise(item, floats)
    return result

"""The `x-mcp-header` rule of MCP 2026-07-28 (SEP-2243), without loading the SDK.

A tool may mark properties of its `inputSchema` with `x-mcp-header: <Name>`; a client then mirrors
each such argument of a `tools/call` into an `Mcp-Param-<Name>` header, and the name a request
carries (`params.name`, or `params.uri` for `resources/read`) into `Mcp-Name`. The proxy needs the
rule only when it changes a forwarded request's arguments: it must then rebuild those headers as the
client would have (`proxy.mcp.wire.headers.modern_routing_headers`).

The SDK has the same codec, but importing it loads pydantic and the SDK's types: about 55 MB of a
sidecar whose whole idle footprint is under 60 MB. The tests hold this module to the SDK's
answers, so the two cannot drift apart unnoticed.

The rule, as the specification states it:
- an annotation is valid only on a property reached from the schema's root through `properties`
  alone (not under `items`, `anyOf`, `$defs` and the other subschema keywords), whose `type` is
  `string`, `integer` or `boolean`, and whose header name is an RFC 9110 token, unique in the
  schema regardless of case. One invalid annotation makes the whole schema's invalid;
- an argument that is absent, null, or not a scalar sends no header; `true`/`false` for booleans;
- a value that is not plain printable ASCII without space at either end (or that looks like the
  wrapper itself) is sent as `=?base64?<UTF-8 bytes in base64>?=`.
"""

from __future__ import annotations

import base64
import re
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

__all__ = ["NAME_BEARING", "PARAM_PREFIX", "ParamHeaders", "declared", "encode", "mirrored"]

ParamHeaders = dict[tuple[str, ...], str]
"""Header name by the path of `properties` keys to the argument it mirrors."""

PARAM_PREFIX = "Mcp-Param-"
NAME_BEARING: Mapping[str, str] = MappingProxyType(
    {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
)
"""The params key whose value each method mirrors into `Mcp-Name`."""

_KEY = "x-mcp-header"
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_PLAIN = re.compile(r"[\x20-\x7e]*")
_WRAPPED = re.compile(r"=\?base64\?.*\?=")
_TYPES = frozenset({"string", "integer", "boolean"})
# JSON Schema 2020-12's keywords whose values are schemas (`properties` aside): one schema, a list
# of schemas, or a mapping of names to schemas. Data keywords (`default`, `enum`, `const`, …) and
# references are never entered, so nothing in the data reads as an annotation.
_ONE = frozenset(
    {
        "additionalProperties",
        "contains",
        "contentSchema",
        "else",
        "if",
        "items",
        "not",
        "propertyNames",
        "then",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
_MANY = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_NAMED = frozenset({"$defs", "definitions", "dependentSchemas", "patternProperties"})


def declared(schema: Any) -> ParamHeaders | None:
    """The arguments `schema` mirrors into headers ({} if none), or None if any annotation in it
    breaks the rule (then none of them is used)."""
    found: ParamHeaders = {}
    names: set[str] = set()
    for path, position in _positions(schema):
        if _KEY not in position:
            continue
        name = position[_KEY]
        if not path or not isinstance(name, str) or not _TOKEN.fullmatch(name):
            return None
        kind = position.get("type")
        if not isinstance(kind, str) or kind not in _TYPES or name.lower() in names:
            return None
        names.add(name.lower())
        found[path] = name
    return found


def _positions(schema: Any) -> Iterator[tuple[tuple[str, ...] | None, dict[str, Any]]]:
    """Every schema position under `schema` (breadth first, without recursion: any depth is
    safe) with its path of `properties` keys, or None once the walk went through another
    keyword."""
    waiting: deque[tuple[tuple[str, ...] | None, Any]] = deque([((), schema)])
    while waiting:
        path, position = waiting.popleft()
        if isinstance(position, dict):
            yield path, position
            waiting.extend(_under(path, position))


def _under(
    path: tuple[str, ...] | None, position: dict[str, Any]
) -> Iterator[tuple[tuple[str, ...] | None, Any]]:
    """The positions directly under `position`: a property keeps the path, and extends it while
    there is one; anything under another keyword is off the path."""
    for keyword, value in position.items():
        if keyword == "properties" and isinstance(value, dict):
            for name, sub in value.items():
                yield (None if path is None else (*path, name)), sub
            continue
        if keyword in _ONE:
            subs: Iterable[Any] = (value,)
        elif keyword in _MANY and isinstance(value, list):
            subs = value
        elif keyword in _NAMED and isinstance(value, dict):
            subs = value.values()
        else:
            continue
        for sub in subs:
            yield None, sub


def mirrored(
    headers: Mapping[tuple[str, ...], str], arguments: Mapping[str, Any]
) -> dict[str, str]:
    """The `Mcp-Param-*` headers of a call with these arguments."""
    out: dict[str, str] = {}
    for path, name in headers.items():
        text = _rendered(_at(arguments, path))
        if text is not None:
            out[PARAM_PREFIX + name] = encode(text)
    return out


def _at(arguments: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = arguments
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _rendered(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        try:
            return str(value)
        except ValueError:  # an int past the interpreter's digit limit: no header for it
            return None
    return None


def encode(value: str) -> str:
    """`value` as a header carries it: as it is when it survives a header's trip, else wrapped."""
    if _PLAIN.fullmatch(value) and value == value.strip() and not _WRAPPED.fullmatch(value):
        return value
    return f"=?base64?{base64.b64encode(value.encode()).decode('ascii')}?="

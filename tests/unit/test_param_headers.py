"""Interlock's own `x-mcp-header` codec (`proxy.mcp.wire.param_headers`) against the SDK's.

The proxy keeps the SDK out of its process (pydantic and the SDK's types cost ~55 MB), so it has
its own copy of the rule; these tests hold the two to the same answers: on the spec's named cases,
and on generated schemas, arguments and values (the SDK is a test dependency here, never loaded by
`interlock serve`)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.shared import inbound as sdk

from proxy.mcp.wire.param_headers import NAME_BEARING, declared, encode, mirrored

_SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _sdk_declared(schema: Any) -> dict[tuple[str, ...], str] | None:
    if sdk.find_invalid_x_mcp_header(schema) is not None:
        return None
    return sdk.x_mcp_header_map(schema)


def _prop(kind: Any, header: Any) -> dict[str, Any]:
    return {"type": kind, "x-mcp-header": header}


def _obj(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


# --- named cases ---


def test_top_level_and_nested_properties_are_mirrored_by_their_path() -> None:
    schema = _obj(region=_prop("string", "Region"), opts=_obj(dry=_prop("boolean", "Dry-Run")))
    assert declared(schema) == {("region",): "Region", ("opts", "dry"): "Dry-Run"}
    assert declared(schema) == _sdk_declared(schema)


def test_a_schema_without_annotations_mirrors_nothing() -> None:
    assert declared(_obj(q={"type": "string"})) == {}
    assert declared(None) == {} == _sdk_declared(None)


def test_an_annotation_off_the_properties_chain_invalidates_the_schema() -> None:
    for schema in (
        _prop("string", "Root"),  # the root itself
        {"type": "array", "items": _prop("string", "Item")},
        {"anyOf": [_obj(a=_prop("string", "A"))]},
        {"$defs": {"x": _prop("string", "X")}, **_obj(q={"type": "string"})},
        _obj(a={"type": "object", "additionalProperties": _prop("string", "More")}),
    ):
        assert declared(schema) is None, schema
        assert _sdk_declared(schema) is None, schema


def test_annotations_the_rule_forbids_invalidate_the_schema() -> None:
    for schema in (
        _obj(n=_prop("number", "N")),  # not portable as text
        _obj(n=_prop(["string", "null"], "N")),
        _obj(n={"x-mcp-header": "N"}),  # no type
        _obj(n=_prop("string", "Bad Name")),  # not a token
        _obj(n=_prop("string", "")),
        _obj(n=_prop("string", 7)),
        _obj(a=_prop("string", "Same"), b=_prop("integer", "SAME")),  # unique regardless of case
    ):
        assert declared(schema) is None, schema
        assert _sdk_declared(schema) is None, schema


def test_data_keywords_are_never_read_as_annotations() -> None:
    schema = _obj(q={"type": "string", "default": {"x-mcp-header": "Nope"}, "enum": ["a"]})
    assert declared(schema) == {} == _sdk_declared(schema)


def test_arguments_become_headers_as_a_client_sends_them() -> None:
    headers = {("region",): "Region", ("opts", "dry"): "Dry", ("n",): "N", ("gone",): "Gone"}
    arguments = {"region": "café", "opts": {"dry": True}, "n": 12, "gone": None}
    assert mirrored(headers, arguments) == {
        "Mcp-Param-Region": "=?base64?Y2Fmw6k=?=",
        "Mcp-Param-Dry": "true",
        "Mcp-Param-N": "12",
    }
    assert mirrored(headers, arguments) == sdk.mcp_param_headers(headers, arguments)
    assert mirrored({("opts", "dry"): "Dry"}, {"opts": "not an object"}) == {}
    assert mirrored({("list",): "L"}, {"list": [1]}) == {}


def test_values_that_would_not_survive_a_header_are_wrapped() -> None:
    assert encode("eu-west-1") == "eu-west-1"
    for value in (" padded", "padded ", "tab\there", "naïve", "=?base64?abc?=", "line\nbreak"):
        wrapped = encode(value)
        assert wrapped.startswith("=?base64?"), value
        assert sdk.decode_header_value(wrapped) == value
        assert wrapped == sdk.encode_header_value(value)


def test_the_methods_that_carry_a_name_are_the_sdks() -> None:
    assert dict(NAME_BEARING) == dict(sdk.NAME_BEARING_METHODS)


def test_every_subschema_keyword_is_walked_and_no_data_keyword_is() -> None:
    """Each JSON Schema 2020-12 keyword whose value is a schema (one, a list, a mapping) takes the
    walk off the `properties` chain, so an annotation under it invalidates the schema; a value
    of the wrong shape for its keyword, and the data keywords, are not walked at all."""
    annotated = _prop("string", "A")
    walked = [
        *({keyword: annotated} for keyword in _ONE_SCHEMA),
        *({keyword: [annotated]} for keyword in _SCHEMA_LISTS),
        *({keyword: {"x": annotated}} for keyword in _NAMED_SCHEMAS),
    ]
    for schema in walked:
        assert declared(schema) is None, schema
        assert _sdk_declared(schema) is None, schema
    not_walked = [
        *({keyword: annotated} for keyword in _DATA),
        *({keyword: [annotated]} for keyword in (*_DATA, *_ONE_SCHEMA)),
        *({keyword: {"x": annotated}} for keyword in (*_DATA, *_SCHEMA_LISTS)),
        *({keyword: annotated} for keyword in (*_SCHEMA_LISTS, *_NAMED_SCHEMAS)),
        {"properties": [annotated]},
    ]
    for schema in not_walked:
        assert declared(schema) == {}, schema
        assert _sdk_declared(schema) == {}, schema


def test_a_header_name_with_space_or_a_line_break_at_an_end_is_not_a_token() -> None:
    for name in (" A", "A ", "A\n", "\tA"):
        schema = _obj(a=_prop("string", name))
        assert declared(schema) is None, name
        assert _sdk_declared(schema) is None, name


def test_a_schema_of_any_depth_is_read_without_recursion() -> None:
    """A listing's schema nested 900 levels deep (the JSON reader takes up to about a thousand):
    read as having no annotations, not a RecursionError out of learning the listing."""
    deep: dict[str, Any] = {"type": "string", "x-mcp-header": "Deep"}
    for level in range(900):
        deep = {"type": "object", "properties": {f"p{level}": deep}, "default": deep}
    expected = _sdk_declared(deep)
    assert expected is not None
    assert declared(deep) == expected
    assert len(next(iter(expected))) == 900
    nested_data: Any = {"x-mcp-header": "Data"}
    for _ in range(900):
        nested_data = {"default": nested_data}
    assert declared(_obj(q={"type": "string", "default": nested_data})) == {}


def test_an_integer_past_the_digit_limit_sends_no_header() -> None:
    headers = {("n",): "N"}
    huge = {"n": 10**5000}
    assert mirrored(headers, huge) == {} == sdk.mcp_param_headers(headers, huge)
    assert mirrored(headers, {"n": 10**50}) == {"Mcp-Param-N": str(10**50)}


# --- generated: the same answers as the SDK ---
# The keyword lists are JSON Schema 2020-12's, written out here (not imported from the module) so
# that a keyword the module forgot is generated all the same.

_ONE_SCHEMA = (
    "additionalProperties", "contains", "contentSchema", "else", "if", "items", "not",
    "propertyNames", "then", "unevaluatedItems", "unevaluatedProperties",
)  # fmt: skip
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_NAMED_SCHEMAS = ("$defs", "definitions", "dependentSchemas", "patternProperties")
_DATA = ("default", "const", "enum", "examples", "$ref")
_TOKEN_CHARS = "!#$%&'*+-.^_`|~09AZaz"


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    """What `fn(*args)` returned, or the type of what it raised."""
    try:
        return "returned", fn(*args)
    except Exception as error:  # compared, not handled
        return "raised", type(error)


_names = st.sampled_from(["a", "b", "region", "opts", "x"])
_header_names = st.one_of(
    st.sampled_from(["Region", "region", "X-Id", "Dry_Run", "a.b", "Bad Name", "", "é", " A"]),
    st.text(alphabet=_TOKEN_CHARS + " \t\x7f:", max_size=6),
    st.text(max_size=6),
    st.integers(),
    st.none(),
)
_kinds = st.sampled_from(["string", "integer", "boolean", "number", "object", None, ["string"]])


def _schemas() -> st.SearchStrategy[Any]:
    leaf = st.one_of(
        st.builds(
            lambda kind, header, annotated: (
                {"type": kind, "x-mcp-header": header} if annotated else {"type": kind}
            ),
            _kinds,
            _header_names,
            st.booleans(),
        ),
        st.sampled_from([True, False, 0, "x", None, []]),  # what else a position may hold
    )

    def nest(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        keyword = st.sampled_from
        return st.one_of(
            st.builds(
                lambda p: {"type": "object", "properties": p}, st.dictionaries(_names, inner)
            ),
            st.builds(lambda k, i: {k: i}, keyword(_ONE_SCHEMA + _DATA), inner),
            st.builds(lambda k, xs: {k: xs}, keyword(_SCHEMA_LISTS + _DATA + ("items",)),
                      st.lists(inner, max_size=2)),
            st.builds(lambda k, d: {k: d}, keyword(_NAMED_SCHEMAS + _DATA),
                      st.dictionaries(_names, inner, max_size=2)),
            st.builds(lambda a, b: a | b if isinstance(a, dict) and isinstance(b, dict) else a,
                      inner, inner),
        )  # fmt: skip

    return st.recursive(leaf, nest, max_leaves=10)


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
)
_arguments = st.recursive(
    st.dictionaries(_names, _scalars, max_size=4),
    lambda inner: st.dictionaries(_names, st.one_of(_scalars, inner), max_size=4),
    max_leaves=10,
)
_values = st.one_of(
    st.text(),
    st.text(alphabet="=?base64ab\x7f \t\n", max_size=14),  # the wrapper's pieces, DEL, spaces
    st.builds(lambda a, b: a + b, st.sampled_from(["=?base64?", "x=?base64?", ""]),
              st.sampled_from(["?=", "abc?=", "x", "?=\n", ""])),
    st.text(alphabet=st.characters(categories=["Cs", "Zs", "Cc"]), max_size=3),  # surrogates
)  # fmt: skip


@_SETTINGS
@given(_schemas())
def test_any_schema_declares_what_the_sdk_declares(schema: Any) -> None:
    assert _outcome(declared, schema) == _outcome(_sdk_declared, schema)


@_SETTINGS
@given(_schemas(), _arguments)
def test_any_arguments_mirror_as_the_sdk_mirrors_them(schema: Any, arguments: Any) -> None:
    headers = _sdk_declared(schema) or {("a",): "A", ("opts", "x"): "X", ("b",): "B"}
    assert _outcome(mirrored, headers, arguments) == _outcome(
        sdk.mcp_param_headers, headers, arguments
    )


@_SETTINGS
@given(_values)
def test_any_value_is_encoded_as_the_sdk_encodes_it(value: str) -> None:
    assert _outcome(encode, value) == _outcome(sdk.encode_header_value, value)
    if _outcome(encode, value)[0] == "returned":
        assert sdk.decode_header_value(encode(value)) == value

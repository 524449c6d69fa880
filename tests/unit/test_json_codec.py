"""`proxy.json_codec.loads` accepts what `json.loads` accepts and returns equal values."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.json_codec import compact_text, loads

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(_JSON)
def test_any_document_reads_as_the_standard_parser_reads_it(value: object) -> None:
    """Every JSON document (integers of any size included) parses to the same value."""
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        expected = json.loads(text)
        got = loads(text.encode("utf-8", "surrogatepass"))
        assert got == expected
        assert repr(got) == repr(expected)  # 1 stays 1, not 1.0


@pytest.mark.parametrize(
    "raw",
    [
        b"123456789012345678901234567890",
        b'{"id": -98765432109876543210}',
        b'"\\ud800"',
        b"[1e400, -1e400]",
        b'{"a": 1, "a": 2}',
    ],
)
def test_what_a_fast_parser_reads_differently_is_read_as_json_does(raw: bytes) -> None:
    """Long integers stay exact, lone surrogates and overflowing floats are kept as json does."""
    assert repr(loads(raw)) == repr(json.loads(raw))


def test_nan_literals_and_invalid_input_behave_as_json() -> None:
    """NaN is accepted as json accepts it; invalid JSON and bad UTF-8 raise ValueError."""
    assert math.isnan(loads(b"NaN"))
    with pytest.raises(ValueError):
        loads(b"{")
    with pytest.raises(ValueError):
        loads(b'"\xff"')


_FINITE_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(_FINITE_JSON)
def test_compact_text_is_compact_json_of_the_same_value(value: object) -> None:
    """What the ledger stores of a call's arguments reads back as the same value (an integer
    stays an integer, a float a float; exponents may be written `e-7` rather than `e-07`)."""
    text = compact_text(value)
    assert json.loads(text) == value
    assert repr(json.loads(text)) == repr(value)


def test_compact_text_writes_what_orjson_refuses() -> None:
    """Compact; an integer beyond 64 bits is written exactly; what JSON cannot carry, as its
    str()."""
    assert compact_text({"to": "a", "n": [1, 2.5]}) == '{"to":"a","n":[1,2.5]}'
    assert compact_text({"n": 2**70, "é": [1.5]}) == '{"n":1180591620717411303424,"é":[1.5]}'
    assert compact_text({"at": {1, 2}}) == '{"at":"{1, 2}"}'


@pytest.mark.parametrize("text", ['"\ud800"', '["\udcff", 1]', '{"k": "a\udfffb"}'])
def test_a_text_holding_a_lone_surrogate_reads_as_json_does(text: str) -> None:
    """A text (not bytes) may hold a lone surrogate itself, unescaped (a line read with
    surrogate escapes, say): the standard parser reads it, so `loads` does too."""
    assert loads(text) == json.loads(text)

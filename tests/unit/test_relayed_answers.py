"""A `tools/call` answer read for relaying: its envelope is parsed, the tool's output is not.

`read_upstream_message(raw, lazy_output=True)` leaves a result's `content` and
`structuredContent` as `RawJson` (their JSON text); everything else is parsed as before. Such a
message must still equal the fully parsed one, go on as its own bytes, and be written by every
encoder as its value; whatever the envelope reader cannot vouch for is parsed whole, as before.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.json_codec import RawJson
from proxy.mcp.pipeline.outcomes import encode_outcome, outcome_state
from proxy.mcp.wire import jsonrpc
from proxy.mcp.wire.jsonrpc import StaleWireBytes, dumps, read_upstream_message, wire_bytes
from proxy.mcp.wire.tasks import created_task_id

BIG = 2**70  # beyond 64 bits: orjson alone would read it as a float


def _answer(**result: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 7, "result": result}).encode()


def test_the_tools_output_stays_unparsed_and_the_rest_is_read():
    raw = _answer(
        content=[{"type": "text", "text": "café ☃"}],
        structuredContent={"rows": [1, 2.5, BIG]},
        isError=True,
        _meta={"k": "v"},
    )
    message = read_upstream_message(raw, lazy_output=True)
    assert message is not None
    result = message["result"]
    assert isinstance(result["content"], RawJson)
    assert isinstance(result["structuredContent"], RawJson)
    assert result["isError"] is True
    assert result["_meta"] == {"k": "v"}
    assert message["id"] == 7
    assert outcome_state(message) == "failed"
    assert wire_bytes(message) is raw
    assert message == read_upstream_message(raw)  # equal to the whole parse, value for value
    assert result["structuredContent"].value()["rows"][2] == BIG


def test_an_unparsed_member_is_written_as_its_value_by_every_encoder():
    raw = _answer(content=[{"type": "text", "text": "ok ☃"}], structuredContent={"n": BIG})
    lazy = read_upstream_message(raw, lazy_output=True)
    whole = read_upstream_message(raw)
    assert lazy is not None
    assert whole is not None
    assert json.loads(dumps({"copy": lazy["result"]})) == {"copy": whole["result"]}
    assert json.loads(encode_outcome(lazy)) == {"result": whole["result"]}
    # "NaN" in the bytes sends encode_outcome to the standard library: the same value again.
    nan = _answer(content=[{"type": "text", "text": "NaN, Infinity"}])
    lazy_nan = read_upstream_message(nan, lazy_output=True)
    assert lazy_nan is not None
    assert isinstance(lazy_nan["result"]["content"], RawJson)
    assert encode_outcome(lazy_nan) == encode_outcome(read_upstream_message(nan) or {})


def test_a_task_answer_is_still_recognized():
    raw = _answer(task={"taskId": "t-1", "status": "working"})
    message = read_upstream_message(raw, lazy_output=True)
    assert message is not None
    assert created_task_id(message) == "t-1"
    modern = _answer(resultType="task", taskId="t-2", status="working")
    message = read_upstream_message(modern, lazy_output=True)
    assert message is not None
    assert created_task_id(message) == "t-2"


def test_exact_ids_and_errors_are_read_whole():
    raw = json.dumps(
        {"jsonrpc": "2.0", "id": BIG, "error": {"code": -32000, "message": "no", "data": [BIG]}}
    ).encode()
    message = read_upstream_message(raw, lazy_output=True)
    assert message is not None
    assert message["id"] == BIG
    assert message["error"]["data"] == [BIG]
    assert outcome_state(message) == "failed"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"jsonrpc":"2.0","id":1,"result":{"content":[NaN]}}',  # the standard parser's NaN
        b'{"jsonrpc":"2.0","id":1,"result":{"content":"\\ud800"}}',  # a lone surrogate
        b'{"jsonrpc":"2.0","id":1,"extra":true,"result":{"content":[]}}',  # a member we skip
        b'{"jsonrpc":"2.0","id":1,"result":{"content":[1]},"result":{"content":[2]}}',
        b'{"jsonrpc":"2.0","id":1,"result":[1,2]}',  # a result that is not an object
        # a number beyond a double where the reader builds values: msgspec refuses it, the
        # whole parse reads it as infinity (as Python's json module does)
        b'{"jsonrpc":"2.0","id":1,"result":{"content":[],"_meta":{"n":1e400}}}',
        b'{"jsonrpc":"2.0","id":1,"result":{"tools":[{"n":-1e400}]}}',
        b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"n":1e400}],"isError":false}}',
        b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}',
        b'{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":{"content":[]}}',
    ],
)
def test_what_the_envelope_reader_cannot_vouch_for_is_parsed_whole(raw: bytes):
    assert read_upstream_message(raw, lazy_output=True) == read_upstream_message(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"jsonrpc":"2.0","id":1,"result":{"content":"\xff"}}',  # not UTF-8
        b'{"jsonrpc":"2.0","id":1,"result":{"content":[1,]}}',  # not JSON
        b'{"jsonrpc":"2.0","result":{"content":[]}}',  # not JSON-RPC: no id
        b"[1, 2]",
    ],
)
def test_what_is_not_a_message_is_still_refused(raw: bytes):
    assert read_upstream_message(raw) is None
    assert read_upstream_message(raw, lazy_output=True) is None


def test_an_edit_beside_the_unparsed_output_is_caught(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(jsonrpc, "_CHECK_WIRE", True)
    message = read_upstream_message(_answer(content=[], _meta={"k": "v"}), lazy_output=True)
    assert message is not None
    wire_bytes(message)  # unchanged: fine
    message["result"]["_meta"]["k"] = "changed"
    with pytest.raises(StaleWireBytes):
        wire_bytes(message)


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    result=st.dictionaries(
        st.sampled_from(["content", "structuredContent", "isError", "_meta", "other"]), _json
    ),
    ascii_only=st.booleans(),
)
def test_a_lazy_read_equals_the_whole_parse(result: dict[str, Any], ascii_only: bool):
    document = {"jsonrpc": "2.0", "id": 1, "result": result}
    raw = json.dumps(document, ensure_ascii=ascii_only).encode()
    lazy = read_upstream_message(raw, lazy_output=True)
    assert lazy == read_upstream_message(raw) == document
    assert lazy is not None
    assert json.loads(dumps(lazy)) == document
    assert json.loads(encode_outcome(lazy)) == {"result": result}
    assert wire_bytes(lazy) is raw


# JSON text that Python's encoder never writes: number literals of any size and exponent
# (beyond a double, below its smallest step, integers past 64 bits), and extra whitespace.
_number_text = st.from_regex(
    r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,6})?([eE][+-]?[0-9]{1,4})?", fullmatch=True
)
_json_text = st.recursive(
    _number_text | st.sampled_from(["null", "true", "false", '"x"', '"\\u00e9"']),
    lambda inner: (
        st.lists(inner, max_size=4).map(lambda items: "[ " + " , ".join(items) + " ]")
        | st.lists(inner, max_size=3).map(
            lambda items: "{" + ",".join(f'"k{n}": {item}' for n, item in enumerate(items)) + "}"
        )
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    members=st.dictionaries(
        st.sampled_from(["content", "structuredContent", "isError", "_meta", "other"]),
        _json_text,
    )
)
def test_a_lazy_read_of_any_json_text_equals_the_whole_parse(members: dict[str, str]):
    """Whatever numbers the upstream writes, the envelope read never raises and reads what the
    whole parse reads (falling back to it where msgspec refuses a number)."""
    result = "{" + ",".join(f'"{name}": {text}' for name, text in members.items()) + "}"
    raw = f'{{"jsonrpc": "2.0", "id": 1, "result": {result}}}'.encode()
    whole = read_upstream_message(raw)
    assert whole is not None
    assert read_upstream_message(raw, lazy_output=True) == whole

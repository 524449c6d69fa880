"""How a tools/call outcome is stored: whatever encoder writes it, a replay reads back the very
values the upstream answered."""

from __future__ import annotations

import json
import math

from proxy.mcp.pipeline.outcomes import encode_outcome
from proxy.mcp.wire.jsonrpc import read_upstream_message


def _answer(text: str) -> dict[str, object]:
    message = read_upstream_message(text.encode())
    assert message is not None
    return message


def test_the_stored_outcome_is_the_result_without_the_request_id() -> None:
    stored = encode_outcome(_answer('{"jsonrpc":"2.0","id":7,"result":{"n":1.5,"s":"é\\u2028"}}'))
    assert json.loads(stored) == {"result": {"n": 1.5, "s": "é\u2028"}}
    failed = encode_outcome(_answer('{"jsonrpc":"2.0","id":7,"error":{"code":-1,"message":"x"}}'))
    assert json.loads(failed) == {"error": {"code": -1, "message": "x"}}


def test_non_finite_numbers_and_huge_integers_survive_the_round_trip() -> None:
    """An upstream's NaN (accepted by the lenient parser) stays NaN, not null, and an integer
    beyond 64 bits stays exact."""
    stored = json.loads(
        encode_outcome(_answer('{"jsonrpc":"2.0","id":1,"result":{"x":NaN,"y":-Infinity}}'))
    )
    assert math.isnan(stored["result"]["x"])
    assert stored["result"]["y"] == -math.inf
    huge = 2**80 + 1
    stored = json.loads(
        encode_outcome(_answer(f'{{"jsonrpc":"2.0","id":1,"result":{{"n":{huge}}}}}'))
    )
    assert stored == {"result": {"n": huge}}


def test_a_large_result_is_stored_whole() -> None:
    items = [{"id": i, "name": f"item {i}", "score": i / 7} for i in range(20_000)]
    text = json.dumps({"jsonrpc": "2.0", "id": 3, "result": {"structuredContent": items}})
    assert json.loads(encode_outcome(_answer(text))) == {"result": {"structuredContent": items}}

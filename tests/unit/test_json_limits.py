"""How deep request JSON may nest: counted iteratively, so the check itself cannot overflow."""

from __future__ import annotations

import json

from policies.json_limits import MAX_JSON_DEPTH, nests_deeper_than


def _nested(depth: int) -> bytes:
    return ("[" * depth + "1" + "]" * depth).encode()


def test_depth_up_to_the_limit_passes_and_one_more_does_not():
    """Exactly MAX_JSON_DEPTH levels pass; one more is refused; objects count like arrays."""
    at_limit, over = _nested(MAX_JSON_DEPTH), _nested(MAX_JSON_DEPTH + 1)
    assert not nests_deeper_than(json.loads(at_limit), raw=at_limit)
    assert nests_deeper_than(json.loads(over), raw=over)
    objects = '{"a":' * (MAX_JSON_DEPTH + 1) + "1" + "}" * (MAX_JSON_DEPTH + 1)
    assert nests_deeper_than(json.loads(objects))


def test_wide_bodies_with_many_brackets_are_not_deep():
    """A thousand sibling objects are many brackets but one level."""
    wide = json.dumps({"messages": [{"role": "user", "content": "x"}] * 1000}).encode()
    assert not nests_deeper_than(json.loads(wide), raw=wide)


def test_a_depth_far_beyond_the_recursion_limit_is_measured_without_recursion():
    """A structure deeper than Python's recursion limit is judged, not crashed on."""
    value: list[object] = []
    for _ in range(50_000):
        value = [value]
    assert nests_deeper_than(value)

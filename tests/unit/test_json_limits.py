"""How deep request JSON may nest: counted iteratively, so the check itself cannot overflow."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import json_limits
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


def test_with_its_raw_text_the_check_reads_only_the_bytes():
    """Given the body it was parsed from, a body dense with containers is measured on its bytes
    (at C speed: a walk over the parsed containers held the event loop for ~2 s on a 4 MB body
    of small objects); the parsed value is not looked at."""
    deep = _nested(MAX_JSON_DEPTH + 1)
    assert nests_deeper_than(None, raw=deep)
    wide = json.dumps([[{}] * 3] * 200).encode()  # many brackets, three levels
    assert not nests_deeper_than(None, limit=3, raw=wide)
    assert nests_deeper_than(None, limit=2, raw=wide)


def test_brackets_inside_strings_do_not_count():
    """Brackets and escaped quotes inside strings are text, not nesting."""
    text = json.dumps({"a": '"[[[[[[\\"{{{{{', "b": [[1]], "c": "\\\\"}).encode()
    assert not nests_deeper_than(json.loads(text), limit=3, raw=text)
    assert nests_deeper_than(json.loads(text), limit=2, raw=text)


json_text = st.text(alphabet=st.sampled_from('ab[]{}"\\é\n'), max_size=6)
json_nested = st.recursive(
    st.none() | st.integers() | json_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(json_text, inner, max_size=3),
    max_leaves=30,
)


@given(json_nested, st.integers(min_value=0, max_value=6), st.booleans())
def test_the_raw_check_agrees_with_the_walk(value: Any, limit: int, ascii_only: bool):
    """On any JSON text (strings full of brackets, quotes, escapes), the byte check and the walk
    over the parsed value give the same answer."""
    raw = json.dumps(value, ensure_ascii=ascii_only).encode()
    walked = nests_deeper_than(value, limit)
    assert nests_deeper_than(value, limit, raw=raw) == walked
    with pytest.MonkeyPatch.context() as patch:  # the bytes alone, however sparse the body
        patch.setattr(json_limits, "_WALK_BYTES_PER_CONTAINER", 1 << 40)
        assert nests_deeper_than(None, limit, raw=raw) == walked

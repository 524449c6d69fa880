"""Idempotency keys: canonical JSON, fingerprints, and the key recipes."""

from __future__ import annotations

import hashlib
import math
import unicodedata
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.keys import canonical_json, decide_key, fingerprint, pick_field
from policies.model import KeyRecipe

CONTEXT: dict[str, Any] = {
    "tenant": "acme",
    "upstream": "mail",
    "operation": "send",
    "run_id": "r1",
}

json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
json_floats = st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    json_scalars | json_floats,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


def _key(recipe: KeyRecipe, arguments: Any, **overrides: Any) -> str | None:
    context = {**CONTEXT, **overrides}
    return decide_key(
        recipe, explicit=context.pop("explicit", None), arguments=arguments, **context
    ).key


def _reorder_and_decompose(value: Any, draw_order: Any) -> Any:
    """The same JSON value with objects in another key order and strings in Unicode NFD."""
    if isinstance(value, str):
        return unicodedata.normalize("NFD", value)
    if isinstance(value, list):
        return [_reorder_and_decompose(item, draw_order) for item in value]
    if isinstance(value, dict):
        keys = draw_order(list(value))
        return {
            unicodedata.normalize("NFD", k): _reorder_and_decompose(value[k], draw_order)
            for k in keys
        }
    return value


def test_canonical_json_sorts_keys_and_drops_spaces() -> None:
    """Object keys are sorted and no whitespace is written."""
    assert (
        canonical_json({"b": 1, "a": [1, {"d": None, "c": True}]})
        == '{"a":[1,{"c":true,"d":null}],"b":1}'
    )


def test_canonical_json_normalises_numbers() -> None:
    """An integral float is written as an integer, -0.0 as 0, other floats keep their value."""
    assert (
        canonical_json([1.0, -0.0, 2.5, 10**20, 1e20])
        == "[1,0,2.5,100000000000000000000,100000000000000000000]"
    )


def test_canonical_json_puts_strings_and_keys_in_nfc() -> None:
    """A decomposed string and key serialise exactly like their composed forms."""
    decomposed = {"cafe\u0301": "re\u0301sume\u0301"}
    assert canonical_json(decomposed) == canonical_json({"café": "résumé"}) == '{"café":"résumé"}'


def test_canonical_json_refuses_non_json() -> None:
    """NaN, non-string keys, keys that collide once normalised, and foreign types are refused."""
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})
    with pytest.raises(TypeError):
        canonical_json({1: "x"})
    with pytest.raises(ValueError, match="collide"):
        canonical_json({"é": 1, "e\u0301": 2})
    with pytest.raises(TypeError):
        canonical_json({"x": b"bytes"})


def test_fingerprint_is_sha256_of_the_canonical_operation_and_arguments() -> None:
    """The fingerprint is the hex sha256 of canonical JSON of the operation and the arguments."""
    expected = hashlib.sha256(b'{"arguments":{"a":1,"b":2},"operation":"charge"}').hexdigest()
    assert fingerprint("charge", {"b": 2, "a": 1}) == expected


def test_fingerprint_tells_operations_apart() -> None:
    """The same arguments under another tool or HTTP path are another call (a key mismatch)."""
    assert fingerprint("charge", {"amount": 500}) != fingerprint("refund", {"amount": 500})
    assert fingerprint("POST /v1/charges", {"n": 1}) != fingerprint("POST /v1/refunds", {"n": 1})
    charge = decide_key(KeyRecipe("derived"), explicit="k", arguments={"a": 1}, **CONTEXT)
    refund = decide_key(
        KeyRecipe("derived"), explicit="k", arguments={"a": 1}, **{**CONTEXT, "operation": "x"}
    )
    assert charge.key == refund.key
    assert charge.fingerprint != refund.fingerprint


def test_absent_arguments_differ_from_empty_ones() -> None:
    """`arguments` left out is not the same call as `arguments: {}` (fingerprint and key)."""
    assert fingerprint("tick", None) != fingerprint("tick", {})
    assert _key(KeyRecipe("derived"), None) != _key(KeyRecipe("derived"), {})


def test_explicit_key_wins_over_every_recipe() -> None:
    """A caller's key is used as given whatever the recipe, with source explicit."""
    for recipe in (KeyRecipe("derived"), KeyRecipe("fields", ("a",)), KeyRecipe("none")):
        decision = decide_key(recipe, explicit="order-7", arguments={"a": 1}, **CONTEXT)
        assert (decision.key, decision.source) == ("order-7", "explicit")
        assert decision.fingerprint == fingerprint("send", {"a": 1})


def test_derived_keys_carry_their_window_and_explicit_keys_none() -> None:
    """A derived (or fields) key dedupes for the given window; an explicit key for retention."""
    for recipe in (KeyRecipe("derived"), KeyRecipe("fields", ("a",))):
        derived = decide_key(recipe, explicit=None, arguments={"a": 1}, window_s=60.0, **CONTEXT)
        assert (derived.source, derived.dedup_window_s) == ("derived", 60.0)
        explicit = decide_key(recipe, explicit="k", arguments={"a": 1}, window_s=60.0, **CONTEXT)
        assert (explicit.source, explicit.dedup_window_s) == ("explicit", None)


def test_blank_explicit_key_counts_as_absent() -> None:
    """An empty Idempotency-Key header does not become a key shared by every call."""
    decision = decide_key(KeyRecipe("derived"), explicit="  ", arguments={"a": 1}, **CONTEXT)
    assert decision.source == "derived"
    assert decision.key != "  "


def test_none_and_explicit_recipes_without_caller_key_give_no_key() -> None:
    """Recipes `none` and `explicit` without a caller key mean no dedupe; the fingerprint stays."""
    for recipe in (KeyRecipe("none"), KeyRecipe("explicit")):
        decision = decide_key(recipe, explicit=None, arguments={"a": 1}, **CONTEXT)
        assert (decision.key, decision.source) == (None, "none")
        assert decision.fingerprint == fingerprint("send", {"a": 1})


def test_derived_key_depends_on_every_part_of_its_context() -> None:
    """Tenant, upstream, operation, run id and arguments each change the derived key."""
    recipe = KeyRecipe("derived")
    base = _key(recipe, {"a": 1})
    assert base is not None
    assert len(base) == 64
    assert _key(recipe, {"a": 1}) == base
    variants = [
        _key(recipe, {"a": 2}),
        _key(recipe, {"a": 1}, tenant="other"),
        _key(recipe, {"a": 1}, upstream="other"),
        _key(recipe, {"a": 1}, operation="other"),
        _key(recipe, {"a": 1}, run_id=None),
        _key(recipe, {"a": 1}, run_id="r2"),
    ]
    assert len({base, *variants}) == 7


def test_fields_recipe_uses_only_named_fields_and_dotted_paths() -> None:
    """A fields recipe keys on the named (dotted) fields only; missing fields count as null."""
    recipe = KeyRecipe("fields", ("to", "meta.order_id"))
    first = {"to": "a@b.c", "meta": {"order_id": 7, "note": "hi"}, "body": "Hello!"}
    reworded = {"to": "a@b.c", "meta": {"order_id": 7, "note": "bye"}, "body": "Hi there"}
    assert _key(recipe, first) == _key(recipe, reworded)
    assert _key(recipe, first) != _key(recipe, {**first, "to": "x@y.z"})
    assert _key(recipe, {"to": "a@b.c"}) == _key(
        recipe, {"to": "a@b.c", "meta": {"order_id": None}}
    )
    assert _key(recipe, first) != _key(KeyRecipe("derived"), first)
    fields_decision = decide_key(recipe, explicit=None, arguments=first, **CONTEXT)
    assert fields_decision.fingerprint != fingerprint("send", reworded)


def test_pick_field_walks_objects_and_lists() -> None:
    """Dotted paths reach into objects and, with numeric parts, into lists; dead ends are None."""
    arguments = {"items": [{"id": "x"}, {"id": "y"}], "to": "a"}
    assert pick_field(arguments, "items.1.id") == "y"
    assert pick_field(arguments, "items.5.id") is None
    assert pick_field(arguments, "to.length") is None
    assert pick_field(arguments, "missing") is None


@given(value=json_values, data=st.data())
def test_key_ignores_key_order_and_unicode_form(value: Any, data: st.DataObject) -> None:
    """The same arguments in any key order or Unicode form give the same key and fingerprint."""

    def shuffled(keys: list[str]) -> list[str]:
        return data.draw(st.permutations(keys))

    try:
        expected = _key(KeyRecipe("derived"), {"v": value})
    except ValueError:  # two keys that collide once normalised are refused either way
        return
    variant = _reorder_and_decompose({"v": value}, shuffled)
    assert _key(KeyRecipe("derived"), variant) == expected
    assert fingerprint("send", variant) == fingerprint("send", {"v": value})


unnamed_fields = st.dictionaries(st.text("abcxyz", min_size=1, max_size=4), json_values, max_size=4)


@given(
    named=st.dictionaries(st.sampled_from(["to", "subject"]), json_values, max_size=2),
    other=unnamed_fields,
    other_again=unnamed_fields,
)
def test_fields_recipe_ignores_fields_it_does_not_name(
    named: dict[str, Any], other: dict[str, Any], other_again: dict[str, Any]
) -> None:
    """A per-tool recipe gives the same key whatever the unnamed fields hold."""
    recipe = KeyRecipe("fields", ("to", "subject"))
    assert _key(recipe, {**other, **named}) == _key(recipe, {**other_again, **named})


def test_derived_keys_and_fingerprints_stay_the_same_across_versions() -> None:
    """Keys are stored in ledgers: a call resent after an upgrade must get the key it had."""
    arguments = {"to": "Zoe\u0301", "amount": 5.0, "tags": ["a", {"n": -0.0}]}
    decision = decide_key(KeyRecipe(mode="derived"), explicit=None, arguments=arguments, **CONTEXT)
    assert decision.key == "1a5fa26cd4fe8ab667ca80a0c542c69f99a3676f3bd04432a31f52c59c883002"
    assert decision.fingerprint == (
        "95e1f5e5187e04473e74ea9ad76feb8679921b463012d7c6f0f18b1c5f4bd687"
    )


@given(json_values, st.text(max_size=6))
def test_derived_key_is_the_hash_of_its_canonical_document(value: Any, run_id: str) -> None:
    """Whatever the arguments: key = sha256(canonical JSON of the recipe's document), and the
    fingerprint = sha256(canonical JSON of the operation and the arguments)."""
    context = {**CONTEXT, "run_id": unicodedata.normalize("NFD", run_id) or None}
    decision = decide_key(KeyRecipe(mode="derived"), explicit=None, arguments=value, **context)
    assert decision.key == _whole_document_key(value, run_id=context["run_id"])
    expected_print = _digest({"operation": context["operation"], "arguments": value})
    assert decision.fingerprint == expected_print == fingerprint(context["operation"], value)


@given(st.dictionaries(st.sampled_from(["to", "cc", "body"]), json_values, max_size=3))
def test_fields_key_is_the_hash_of_its_canonical_document(value: dict[str, Any]) -> None:
    """The `fields` recipe's key hashes the same context with only the named fields (a missing
    one as null): the whole document's canonical JSON, however the key is put together."""
    decision = decide_key(
        KeyRecipe("fields", ("to", "cc")), explicit=None, arguments=value, **CONTEXT
    )
    picked = {"to": value.get("to"), "cc": value.get("cc")}
    assert decision.key == _whole_document_key(picked, recipe="fields")


@pytest.mark.parametrize("size", [4080, 4083, 4084, 4085, 4090, 8192])
def test_arguments_around_the_size_hashed_in_place_keep_their_key(size: int) -> None:
    """Arguments whose canonical text is just under, at and over the length the hash takes
    in place (4,096 bytes: `{"body":"…"}` adds 11) give the key and fingerprint of their whole
    document, whether they were joined with the other members or hashed where they lie."""
    arguments = {"body": "x" * size}
    assert fingerprint("op", arguments) == _digest({"operation": "op", "arguments": arguments})
    assert _key(KeyRecipe("derived"), arguments) == _whole_document_key(arguments)


def test_every_character_is_written_as_the_canonical_form_writes_it() -> None:
    """Strings hash as the standard library writes them, whichever encoder writes them: every
    code point (but the surrogates JSON text cannot carry), as a key and as a value."""
    text = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    arguments = {text[i : i + 512]: text[i : i + 512] for i in range(0, len(text), 512)}
    assert fingerprint("op", arguments) == _digest({"operation": "op", "arguments": arguments})
    assert _key(KeyRecipe("derived"), arguments) == _whole_document_key(arguments)


def test_floats_integers_beyond_64_bits_and_deep_nesting_keep_their_canonical_text() -> None:
    """`2.5e-07` stays `2.5e-07` (not `2.5e-7`), an integer beyond 64 bits and a value nested
    deeper than fast encoders go are written whole: the key of a call never changes with them."""
    deep: Any = ["bottom"]
    for _ in range(300):
        deep = {"d": deep}
    for arguments in ({"x": 2.5e-07, "y": [1e-05, 123.5]}, {"n": 2**70, "m": -(2**64)}, deep):
        expected = _digest({"operation": "op", "arguments": arguments})
        assert fingerprint("op", arguments) == expected
        decision = decide_key(KeyRecipe("derived"), explicit=None, arguments=arguments, **CONTEXT)
        assert decision.fingerprint == fingerprint(CONTEXT["operation"], arguments)
        assert decision.key == _whole_document_key(arguments)


def _whole_document_key(
    arguments: Any, *, run_id: str | None = CONTEXT["run_id"], recipe: str = "derived"
) -> str:
    """The key as the whole document's hash: what `decide_key` must give however it builds it
    (the `fields` recipe's document carries its picked fields as `fields`)."""
    document = {
        "recipe": recipe,
        "tenant": CONTEXT["tenant"],
        "upstream": CONTEXT["upstream"],
        "tool": CONTEXT["operation"],
        "run_id": run_id,
        "fields" if recipe == "fields" else "arguments": arguments,
    }
    return _digest(document)


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()

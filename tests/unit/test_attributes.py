"""Request attributes at the edge: where each comes from, and which values are refused."""

from __future__ import annotations

import pytest

from policies.attributes import BadAttribute, read_attributes
from policies.model import Config, UpstreamSpec

CONFIG = Config(upstreams={"up": UpstreamSpec("up", "http", url="http://127.0.0.1:9")})


def test_meta_wins_over_headers_and_defaults_fill_the_rest() -> None:
    """`_meta` beats the header; absent or blank values take the defaults."""
    attrs = read_attributes(
        CONFIG,
        {"X-Interlock-Tenant": "header", "X-Interlock-Run": "  ", "Idempotency-Key": "k"},
        {"interlock/tenant": "meta"},
    )
    assert (attrs.tenant, attrs.run_id, attrs.idempotency_key) == ("meta", None, "k")
    assert (attrs.work_class, attrs.deadline_s) == ("interactive", 60.0)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("X-Interlock-Tenant", "t" * 128),
        ("X-Interlock-Run", "run-ü-日本-🙂"),
        ("Idempotency-Key", "k" * 255),
    ],
)
def test_values_up_to_the_limit_and_any_printable_text_pass(header: str, value: str) -> None:
    """128 characters (keys 255) of any printable Unicode are accepted as sent."""
    read_attributes(CONFIG, {header: value})


@pytest.mark.parametrize(
    ("header", "value", "name"),
    [
        ("X-Interlock-Tenant", "t" * 129, "tenant"),
        ("X-Interlock-Tenant", "a\x00b", "tenant"),
        ("X-Interlock-Tenant", "a\udcffb", "tenant"),
        ("X-Interlock-Run", "r" * 129, "run"),
        ("X-Interlock-Run", "a\nb", "run"),
        ("X-Interlock-Class", "x" * 129, "class"),
        ("X-Interlock-Class", "vip", "class"),
        ("Idempotency-Key", "k" * 256, "idempotency_key"),
        ("Idempotency-Key", "k\u2029k", "idempotency_key"),
        ("X-Interlock-Deadline-Ms", "soon", "deadline"),
        ("X-Interlock-Deadline-Ms", "inf", "deadline"),
        ("X-Interlock-Deadline-Ms", "-5", "deadline"),
    ],
)
def test_bad_values_name_their_attribute(header: str, value: str, name: str) -> None:
    """Too long, unprintable (control, separator, lone surrogate) or meaningless: refused, and
    the error names the attribute (the paths answer `bad_<name>`)."""
    with pytest.raises(BadAttribute) as caught:
        read_attributes(CONFIG, {header: value})
    assert caught.value.name == name


def test_a_meta_value_that_is_no_string_is_refused() -> None:
    """`_meta` values must be strings (or numbers): an object is a bad attribute."""
    with pytest.raises(BadAttribute) as caught:
        read_attributes(CONFIG, {}, {"interlock/tenant": {"id": 1}})
    assert caught.value.name == "tenant"

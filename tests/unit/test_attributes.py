"""Request attributes at the edge: where each comes from, and which values are refused."""

from __future__ import annotations

import pytest

from policies.attributes import BadAttribute, TenantMismatch, read_attributes
from policies.identity import CallerRefused, key_tenant
from policies.model import Config, Defaults, UpstreamSpec

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


def test_a_deadline_beyond_the_configured_one_is_cut_to_it() -> None:
    """A caller cannot lift the deadline: a longer one is the configured one; shorter ones stand."""
    config = Config(upstreams={})
    far = read_attributes(config, {"X-Interlock-Deadline-Ms": "1e12"})
    assert far.deadline_s == config.defaults.deadline_s
    near = read_attributes(config, {"X-Interlock-Deadline-Ms": "1500"})
    assert near.deadline_s == 1.5


KEYED = Config(upstreams={}, tenant_api_keys={"key-a": "team-a"})


def test_with_api_keys_the_key_names_the_tenant() -> None:
    """The key's tenant wins; naming the same tenant is fine; naming another is a mismatch."""
    assert read_attributes(KEYED, {"Authorization": "Bearer key-a"}).tenant == "team-a"
    same = {"x-api-key": "key-a", "X-Interlock-Tenant": "team-a"}
    assert read_attributes(KEYED, same).tenant == "team-a"
    with pytest.raises(TenantMismatch) as caught:
        read_attributes(KEYED, {"x-api-key": "key-a"}, {"interlock/tenant": "team-b"})
    assert (caught.value.reason, caught.value.status) == ("tenant_mismatch", 403)


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "missing_api_key"),
        ({"Authorization": "Bearer nope"}, "unknown_api_key"),
        ({"Authorization": "Basic a2V5LWE="}, "missing_api_key"),
        ({"x-api-key": "key-a", "X-Interlock-Tenant": "team-b"}, "tenant_mismatch"),
    ],
)
def test_callers_without_a_known_key_are_refused(headers: dict[str, str], reason: str) -> None:
    """No key, an unknown key, or another scheme is 401; another tenant's name is 403."""
    with pytest.raises(CallerRefused) as caught:
        key_tenant(KEYED, {k.lower(): v for k, v in headers.items()})
    assert caught.value.reason == reason
    assert caught.value.status == (403 if reason == "tenant_mismatch" else 401)


def test_a_call_that_names_nothing_gets_its_own_configurations_defaults() -> None:
    """The values of a call that names no attribute are read once per configuration: a second
    configuration (a reload) gets its own defaults, not the first one's, and a call that does
    name one, in any case, in a header or in `_meta`, is still read."""
    other = Config(
        upstreams=CONFIG.upstreams,
        defaults=Defaults(work_class="background", deadline_s=5.0),
    )
    plain = {"Accept": "application/json", "Content-Type": "application/json"}
    for config, expected in ((CONFIG, ("interactive", 60.0)), (other, ("background", 5.0))):
        for _ in range(2):
            attrs = read_attributes(config, plain, {"progressToken": 1})
            assert (attrs.tenant, attrs.work_class, attrs.deadline_s) == ("default", *expected)
            assert (attrs.run_id, attrs.idempotency_key) == (None, None)
    assert read_attributes(other, {**plain, "x-INTERLOCK-run": "r1"}).run_id == "r1"
    assert read_attributes(other, plain, {"interlock/class": "bulk"}).work_class == "bulk"
    assert read_attributes(CONFIG, plain).work_class == "interactive"

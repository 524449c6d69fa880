"""The edge's pure decisions: which browser origins and which Host names are accepted."""

from __future__ import annotations

import pytest

from policies.edge import host_allowed, normalised, origin_allowed, split_host
from policies.model import EdgeSettings

DEFAULT = EdgeSettings()


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1:8787", "localhost", "LOCALHOST:1", "[::1]:8787", "[::1]", "127.0.0.1", None],
)
def test_loopback_names_pass_on_any_port(host: str | None):
    """Loopback names (and no Host at all) pass with the default settings."""
    assert host_allowed(host, DEFAULT, "127.0.0.1")


@pytest.mark.parametrize(
    "host", ["evil.example.com", "evil.example.com:8787", "127.0.0.1.evil.com", "[::2]:8787", ""]
)
def test_foreign_names_are_refused(host: str):
    """A name that does not resolve to us by configuration is a rebinding attempt."""
    assert not host_allowed(host, DEFAULT, "127.0.0.1")


def test_the_listen_address_passes_unless_it_is_a_wildcard():
    """A concrete listen address names us; 0.0.0.0 names nobody (set allowed_hosts)."""
    assert host_allowed("10.0.0.5:8787", DEFAULT, "10.0.0.5")
    assert not host_allowed("0.0.0.0:8787", DEFAULT, "0.0.0.0")


def test_allowed_hosts_match_by_name_or_name_and_port():
    """`name` allows any port; `name:port` only that port; `*` allows every host."""
    settings = EdgeSettings(allowed_hosts=normalised(["Interlock.Internal", "gw:9000"]))
    assert host_allowed("interlock.internal:1234", settings, "127.0.0.1")
    assert host_allowed("gw:9000", settings, "127.0.0.1")
    assert not host_allowed("gw:9001", settings, "127.0.0.1")
    assert not host_allowed("gw", settings, "127.0.0.1")
    assert host_allowed("anything", EdgeSettings(allowed_hosts=("*",)), "127.0.0.1")


def test_origins_pass_when_absent_or_listed():
    """No Origin passes (not a browser); a listed one passes, case and trailing slash aside;
    `null` and anything unlisted are refused."""
    settings = EdgeSettings(allowed_origins=normalised(["https://Console.example.com/"]))
    assert origin_allowed(None, DEFAULT)
    assert origin_allowed("https://console.example.com", settings)
    assert not origin_allowed("https://console.example.com.evil", settings)
    assert not origin_allowed("null", settings)
    assert not origin_allowed("http://127.0.0.1:8787", DEFAULT)
    assert origin_allowed("null", EdgeSettings(allowed_origins=("*",)))


def test_split_host():
    """Host values split into name and port, IPv6 literals kept in brackets."""
    assert split_host("a:1") == ("a", "1")
    assert split_host("[::1]:2") == ("[::1]", "2")
    assert split_host("[::1]") == ("[::1]", None)
    assert split_host("a") == ("a", None)


def test_the_proxys_own_origin_is_not_cross_site():
    """An Origin that is the request's own (allowed) Host is same-origin and passes, as an MCP
    server accepts its own origin; the rebinding page's origin fails on its Host first."""
    assert origin_allowed("http://127.0.0.1:8787", DEFAULT, host="127.0.0.1:8787")
    assert origin_allowed("https://localhost:9", DEFAULT, host="localhost:9")
    assert not origin_allowed("http://127.0.0.1:8788", DEFAULT, host="127.0.0.1:8787")
    assert not origin_allowed("http://evil.example:8787", DEFAULT, host="127.0.0.1:8787")
    assert not origin_allowed("http://127.0.0.1:8787", DEFAULT)

"""What a stdio server inherits of the proxy's environment (`proxy.mcp.upstreams.stdio`)."""

from __future__ import annotations

import sys

import pytest
from mcp.client.stdio import DEFAULT_INHERITED_ENV_VARS

from proxy.mcp.upstreams.stdio import INHERITED_ENV, inherited_environment


@pytest.mark.skipif(sys.platform == "win32", reason="the SDK names other variables on Windows")
def test_the_inherited_names_are_those_mcp_stdio_clients_pass_on() -> None:
    """The same set as the Python SDK's stdio client (checked here, where the SDK is installed for
    the tests; the proxy itself does not load the SDK for it)."""
    assert set(INHERITED_ENV) == set(DEFAULT_INHERITED_ENV_VARS)


def test_only_the_named_variables_are_inherited_and_never_a_shell_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.setenv("HOME", "/home/agent")
    monkeypatch.setenv("SHELL", "() { :; }; echo pwned")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.delenv("TERM", raising=False)
    inherited = inherited_environment()
    assert inherited["PATH"] == "/usr/bin"
    assert inherited["HOME"] == "/home/agent"
    assert "SHELL" not in inherited
    assert "TERM" not in inherited
    assert "OPENAI_API_KEY" not in inherited

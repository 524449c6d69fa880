"""`load_config_in_child`: serve's configuration, validated by a child process, is the very value
(or the very error) the in-process validation gives; a child that cannot answer falls back to it."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from policies.config import load_config
from policies.config_errors import ConfigError
from proxy.ops import config_child
from proxy.ops.config_child import load_config_in_child

_GOOD = """
listen: "127.0.0.1:8089"
ledger: {url: "sqlite:///ledger.db", durability: full, retention_h: 2}
limits:
  global: {max_running: 8, max_pending: 16}
upstreams:
  mail: {mcp: "http://127.0.0.1:9/mcp", timeout_s: 5, limits: {max_running: 2}}
  api: {http: "http://127.0.0.1:9", kind: openai, headers: {Authorization: "Bearer ${TOKEN}"}}
tools:
  - {match: "mail/send_*", side_effect: true, key: {fields: [to, subject], window_s: 600}}
"""


def test_the_child_gives_the_configuration_the_process_would_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKEN", "sk-child")
    path = tmp_path / "interlock.yaml"
    path.write_text(_GOOD)
    config = load_config_in_child(path)
    assert config == load_config(path)
    assert config.ledger.url == f"sqlite:///{tmp_path / 'ledger.db'}"  # resolved as in-process
    assert config.upstreams["api"].headers == {"Authorization": "Bearer sk-child"}


def test_the_child_refuses_a_bad_file_with_the_same_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        'upstreams:\n  mail: {mcp: "http://127.0.0.1:9/mcp"}\ntools:\n  - match: x/y\n'
        "    cost_class: nope\n"
    )
    with pytest.raises(ConfigError) as in_process:
        load_config(path)
    with pytest.raises(ConfigError) as from_child:
        load_config_in_child(path)
    assert str(from_child.value) == str(in_process.value)
    assert (from_child.value.path, from_child.value.line) == (
        in_process.value.path,
        in_process.value.line,
    )
    assert from_child.value.line == 5


@pytest.mark.parametrize("interpreter", ["/bin/false", "/nonexistent/python"])
def test_a_child_that_cannot_answer_leaves_the_validation_to_the_process(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    interpreter: str,
) -> None:
    monkeypatch.setenv("TOKEN", "sk-child")
    path = tmp_path / "interlock.yaml"
    path.write_text(_GOOD)
    monkeypatch.setattr(sys, "executable", interpreter)
    with caplog.at_level(logging.WARNING, logger="interlock"):
        config = load_config_in_child(path)
    assert config == load_config(path)
    assert "configuration validated in this process instead of a child" in caplog.text
    bad = tmp_path / "bad.yaml"
    bad.write_text("upstreams: {}\n")
    with pytest.raises(ConfigError, match="configure at least one upstream"):
        load_config_in_child(bad)


def test_an_answer_that_cannot_be_read_leaves_the_validation_to_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A child whose answer is not a configuration (here an interpreter that prints the marker
    and something else) is not trusted: the process validates the file itself."""
    monkeypatch.setenv("TOKEN", "sk-child")
    path = tmp_path / "interlock.yaml"
    path.write_text(_GOOD)
    impostor = tmp_path / "python"
    impostor.write_text("#!/bin/sh\nprintf '\\n--interlock-config--\\nnot a pickle'\n")
    impostor.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(impostor))
    with caplog.at_level(logging.WARNING, logger="interlock"):
        config = load_config_in_child(path)
    assert config == load_config(path)
    assert "the child's answer could not be read" in caplog.text


def test_the_answer_is_unpickled_to_the_configuration_s_values_only() -> None:
    """A pickle that would build anything else (here a call of `os.system`) is refused."""
    import io
    import os
    import pickle

    class Sneaky:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("true",))

    with pytest.raises(pickle.UnpicklingError, match=r"holds no posix\.system"):
        config_child._ModelUnpickler(io.BytesIO(pickle.dumps(Sneaky()))).load()

"""`interlock check-config` and `serve` as a user runs them: real processes, real exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.mcp_servers import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "interlock.yaml"
_BAD_COST_CLASS = (  # line 5 names a cost class that is not configured
    "upstreams:\n"
    '  mail: {mcp: "http://127.0.0.1:9/mcp"}\n'
    "tools:\n"
    "  - match: x/y\n"
    "    cost_class: nope\n"
)


def interlock(
    *args: str, env: dict[str, str] | None = None, unset: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**environment, "COLUMNS": "160", **(env or {})},
    )


def test_check_config_prints_the_effective_policy():
    """The example config is valid and its limits, classes and rules (in order) are printed."""
    done = interlock("check-config", str(EXAMPLE), env={"OPENAI_API_KEY": "sk-test"})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Limits per scope" in out
    assert "upstream:mail" in out
    assert "cost_class:browser" in out
    assert out.index("mail/send_*") < out.index("*/search*")
    assert "fields: to, subject, window 600 s" in out
    assert "dedup window 300 s" in out
    openai_row = next(line for line in out.splitlines() if "api.openai.com" in line)
    assert "openai" in openai_row
    assert "429, 503, 529" in openai_row  # the statuses that release a side effect
    mail_row = next(line for line in out.splitlines() if "127.0.0.1:9001" in line)
    assert "generic" not in mail_row
    assert "429" in mail_row
    assert "sk-test" not in out  # header values are secrets: only their names are shown
    assert out.rstrip().endswith(f"{EXAMPLE}: OK")


def test_check_config_refuses_a_bad_file_with_key_and_line(tmp_path: Path):
    """A bad file exits 2 with a message naming the file, line, key path and why."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(_BAD_COST_CLASS)
    done = interlock("check-config", str(bad))
    assert done.returncode == 2
    assert f"{bad}:5: tools[0].cost_class = 'nope': unknown cost class" in done.stderr


def test_serve_with_a_bad_config_exits_2_without_a_traceback(tmp_path: Path):
    """`serve` refuses an invalid file before listening, with the same clear message."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("upstreams: {}\nmode: enforce\n")
    done = interlock("serve", "--config", str(bad))
    assert done.returncode == 2
    assert "configure at least one upstream" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_names_the_file_line_and_key_of_a_bad_value(tmp_path: Path):
    """`serve` (whose configuration a child process validates) words an invalid value exactly as
    `check-config` does; an unset `${VAR}` and a missing file too."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(_BAD_COST_CLASS)
    done = interlock("serve", "--config", str(bad))
    assert done.returncode == 2
    expected = f"interlock: invalid configuration: {bad}:5: tools[0].cost_class = 'nope': "
    assert expected + "unknown cost class" in done.stderr
    assert "validated in this process" not in done.stderr  # the child's refusal, relayed
    unset = tmp_path / "unset.yaml"
    unset.write_text(
        "upstreams:\n"
        '  api: {http: "http://127.0.0.1:9", headers: {Authorization: "Bearer ${NOT_SET_HERE}"}}\n'
    )
    done = interlock("serve", "--config", str(unset), unset=("NOT_SET_HERE",))
    assert done.returncode == 2
    assert "environment variable NOT_SET_HERE is not set" in done.stderr
    assert "validated in this process" not in done.stderr  # the child validated it
    missing = tmp_path / "missing.yaml"
    done = interlock("serve", "--config", str(missing))
    assert done.returncode == 2
    assert f"{missing}: cannot read the configuration" in done.stderr
    assert "Traceback" not in done.stderr


def test_config_from_environment_variable(tmp_path: Path):
    """Without --config, INTERLOCK_CONFIG names the file."""
    good = tmp_path / "i.yaml"
    good.write_text('upstreams:\n  mail: {mcp: "http://127.0.0.1:9/mcp"}\n')
    done = interlock("check-config", env={"INTERLOCK_CONFIG": str(good)})
    assert done.returncode == 0, done.stderr
    assert f"{good}: OK" in done.stdout

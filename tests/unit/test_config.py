"""Configuration loading: the documented surface parses, and every bad file is refused clearly."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from policies.config import ConfigError, load_config, parse_config_text
from policies.model import KeyRecipe

MINIMAL = """\
upstreams:
  mail:
    mcp: "http://127.0.0.1:9001/mcp"
"""

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "interlock.yaml"


def parse(text: str, **env: str):
    return parse_config_text(textwrap.dedent(text), "test.yaml", environ=env)


def test_minimal_config_gets_every_default():
    """Only `upstreams` is required; everything else takes DESIGN.md's defaults."""
    config = parse(MINIMAL)
    assert config.listen == "127.0.0.1:8787"
    assert config.mode == "enforce"
    assert config.ledger.durability == "full"
    assert config.ledger.lease_s == 30
    assert config.defaults.work_class == "interactive"
    assert config.limits["global"].max_running == 256
    assert config.limits["tenant"].max_pending == 128
    assert config.limits["run"].max_running == 8
    assert {name: band.share for name, band in config.classes.items()} == {
        "critical": 0.10,
        "interactive": 0.60,
        "background": 0.25,
        "bulk": 0.05,
    }
    assert config.classes["interactive"].max_wait_s == 0
    assert config.upstreams["mail"].kind == "mcp_http"


def test_example_config_parses_with_its_environment():
    """The shipped example parses once the variable it interpolates is set."""
    config = load_config(EXAMPLE, environ={"OPENAI_API_KEY": "sk-test"})
    assert config.upstreams["openai"].headers["Authorization"] == "Bearer sk-test"
    assert config.upstreams["files"].kind == "mcp_stdio"
    assert config.upstreams["files"].command == ("python", "-m", "files_server")
    assert config.tools[0].key is not None
    assert config.tools[0].key.fields == ("to", "subject")
    assert [rule.match for rule in config.tools] == ["mail/send_*", "*/search*"]


def test_relative_sqlite_path_resolves_against_the_config_folder(tmp_path: Path):
    """`sqlite:///interlock.db` means next to the config file, not the working directory."""
    file = tmp_path / "conf" / "interlock.yaml"
    file.parent.mkdir()
    file.write_text(MINIMAL)
    config = load_config(file, environ={})
    assert config.ledger.url == f"sqlite:///{tmp_path / 'conf' / 'interlock.db'}"


def test_environment_overrides_section_keys():
    """INTERLOCK_<SECTION>_<KEY> overrides the file, values parsed as YAML scalars."""
    config = parse(
        MINIMAL,
        INTERLOCK_LEDGER_URL="postgresql://u@db:5432/x",
        INTERLOCK_LEDGER_LEASE_S="12",
        INTERLOCK_MODE="observe",
        INTERLOCK_DEFAULTS_CLASS="background",
        INTERLOCK_ADMIN_TOKEN="not-a-config-key",
    )
    assert config.ledger.url == "postgresql://u@db:5432/x"
    assert config.ledger.lease_s == 12
    assert config.mode == "observe"
    assert config.defaults.work_class == "background"


def test_rate_limits_parse_per_scope():
    """rate_per_s and burst are limits like the others, on any scope."""
    config = parse(
        """\
        limits:
          tenant: {max_running: 8, rate_per_s: 2.5, burst: 5}
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp", limits: {rate_per_s: 10}}
        """
    )
    assert config.limits["tenant"].rate_per_s == 2.5
    assert config.limits["tenant"].burst == 5
    assert config.upstreams["mail"].limits.rate_per_s == 10
    assert config.upstreams["mail"].limits.burst is None


def test_headers_interpolate_environment_variables():
    """`${VAR}` in header values is replaced from the environment."""
    config = parse(
        """\
        upstreams:
          api:
            http: "http://127.0.0.1:9000"
            headers: {x-api-key: "${KEY}", x-static: plain}
        """,
        KEY="secret",
    )
    assert config.upstreams["api"].headers == {"x-api-key": "secret", "x-static": "plain"}


@pytest.mark.parametrize(
    ("header", "env", "why"),
    [
        ('x-api-key: "${KEY}"', {"KEY": "secret\r\nX-Injected: 1"}, "line break"),
        ('x-static: "a\\nb"', {}, "line break"),
        ('x-static: "a\\rb"', {}, "line break"),
        ('x-api-key: "${KEY}"', {"KEY": "sec\x00ret"}, "line break"),
        ('"x api key": v', {}, "not a header name"),
        ('"x-clé": v', {}, "not a header name"),
    ],
    ids=[
        "interpolated-crlf",
        "literal-newline",
        "literal-carriage-return",
        "interpolated-nul",
        "space-in-name",
        "non-ascii-name",
    ],
)
def test_a_header_that_cannot_be_sent_as_it_is_is_a_config_error(
    header: str, env: dict[str, str], why: str
) -> None:
    """Configured upstream headers are written into every request: a name that is not an HTTP
    token, or a value (after `${VAR}`) with a line break, would split the request. The error
    names the key and never shows the value (it may be a secret from the environment)."""
    with pytest.raises(ConfigError, match=why) as caught:
        parse(
            f"""\
            upstreams:
              api:
                http: "http://127.0.0.1:9000"
                headers: {{{header}}}
            """,
            **env,
        )
    assert "upstreams.api.headers" in str(caught.value)
    assert "secret" not in str(caught.value)


def test_telemetry_sample_ratio_defaults_to_every_trace_and_parses():
    """Head sampling of new traces: 1.0 (all) unless `telemetry.sample_ratio` says otherwise."""
    assert parse(MINIMAL).telemetry.sample_ratio == 1.0
    config = parse("telemetry: {sample_ratio: 0.05}\n" + textwrap.dedent(MINIMAL))
    assert config.telemetry.sample_ratio == 0.05
    assert parse(MINIMAL, INTERLOCK_TELEMETRY_SAMPLE_RATIO="0.2").telemetry.sample_ratio == 0.2


def test_upstream_kind_and_not_executed_statuses_parse():
    """`kind` declares a model provider (default generic); `not_executed_statuses` is a set."""
    config = parse(
        """\
        upstreams:
          openai: {http: "https://api.openai.com", kind: openai}
          gateway: {http: "http://127.0.0.1:9000", not_executed_statuses: [502, 503]}
        """
    )
    assert config.upstreams["openai"].provider == "openai"
    assert config.upstreams["gateway"].provider == "generic"
    assert config.upstreams["gateway"].not_executed_statuses == frozenset({502, 503})


def test_dedup_windows_parse_from_defaults_and_rules():
    """`defaults.dedup_window_s` (default 300) and a rule's `key: {…, window_s: N}`."""
    config = parse(
        """\
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp"}
        defaults: {dedup_window_s: 60}
        tools:
          - {match: "mail/send_*", key: {fields: [to], window_s: 5}}
          - {match: "mail/ping", key: {window_s: 0}}
        """
    )
    assert parse(MINIMAL).defaults.dedup_window_s == 300
    assert config.defaults.dedup_window_s == 60
    assert config.tools[0].key == KeyRecipe("fields", ("to",), window_s=5)
    assert config.tools[1].key == KeyRecipe("derived", window_s=0)


BAD_FILES = {
    "negative dedup window": (
        """\
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp"}
        tools:
          - {match: "mail/send", key: {window_s: -1}}
        """,
        4,
        ["tools[0].key.window_s", "-1", "greater than or equal to 0"],
    ),
    "model kind on an MCP upstream": (
        """\
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp", kind: openai}
        """,
        2,
        ["upstreams.mail.kind", "'openai'", "only an http upstream"],
    ),
    "unknown upstream kind": (
        """\
        upstreams:
          api: {http: "http://127.0.0.1:9000", kind: azure}
        """,
        2,
        ["upstreams.api.kind", "'azure'", "openai"],
    ),
    "not_executed_statuses outside 4xx/5xx": (
        """\
        upstreams:
          api: {http: "http://127.0.0.1:9000", not_executed_statuses: [200]}
        """,
        2,
        ["upstreams.api.not_executed_statuses", "200"],
    ),
    "unknown key": (
        """\
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp"}
        ledgr: {url: "sqlite:///x.db"}
        """,
        3,
        ["ledgr", "Extra inputs are not permitted"],
    ),
    "wrong type": (
        """\
        upstreams:
          mail:
            mcp: "http://127.0.0.1:9001/mcp"
            limits: {max_running: many}
        """,
        4,
        ["upstreams.mail.limits.max_running", "'many'"],
    ),
    "negative limit": (
        """\
        limits:
          global: {max_running: 10, max_pending: -1}
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp"}
        """,
        2,
        ["limits.global.max_pending", "-1", "greater than or equal to 0"],
    ),
    "shares not summing to 1": (
        """\
        classes:
          critical: {share: 0.5, max_wait_s: 30}
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp"}
        """,
        1,
        ["classes", "sum to 1", "1.4"],
    ),
    "upstream with both mcp and http": (
        """\
        upstreams:
          mail:
            mcp: "http://127.0.0.1:9001/mcp"
            http: "http://127.0.0.1:9002"
        """,
        2,
        ["upstreams.mail", "exactly one of mcp, http, command", "got mcp, http"],
    ),
    "unknown cost class in a tool rule": (
        """\
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp"}
        tools:
          - match: "mail/send_*"
            cost_class: email
        """,
        5,
        ["tools[0].cost_class", "'email'", "unknown cost class"],
    ),
    "bad glob": (
        """\
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp"}
        tools:
          - match: "mail/send_[abc"
        """,
        4,
        ["tools[0].match", "unbalanced"],
    ),
    "duplicate upstream": (
        """\
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp"}
          mail: {mcp: "http://127.0.0.1:9002/mcp"}
        """,
        3,
        ["duplicate key 'mail'", "first at line 2"],
    ),
    "no upstreams": ("mode: enforce\n", 1, ["upstreams", "Field required"]),
    "unknown mode": (
        """\
        mode: yolo
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp"}
        """,
        1,
        ["mode", "'yolo'", "enforce"],
    ),
    "upstream URL without scheme": (
        """\
        upstreams:
          mail: {mcp: "127.0.0.1:9001/mcp"}
        """,
        2,
        ["upstreams.mail.mcp", "http:// or https://"],
    ),
    "unknown work class": (
        """\
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp"}
        defaults: {class: urgent}
        """,
        3,
        ["defaults.class", "'urgent'"],
    ),
    "rule that is neither MCP nor HTTP": (
        """\
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp"}
        tools:
          - match: "send_email"
        """,
        4,
        ["tools[0].match", "'upstream/tool'"],
    ),
    "invalid YAML": ("upstreams: [\n  mail\n", 3, ["not valid YAML"]),
    "missing environment variable": (
        """\
        upstreams:
          api:
            http: "http://127.0.0.1:9000"
            headers: {Authorization: "Bearer ${NO_SUCH_VAR_FOR_TEST}"}
        """,
        4,
        ["upstreams.api.headers.Authorization", "NO_SUCH_VAR_FOR_TEST is not set"],
    ),
    "zero rate": (
        """\
        limits:
          tenant: {rate_per_s: 0}
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp"}
        """,
        2,
        ["limits.tenant.rate_per_s", "greater than 0"],
    ),
    "sample ratio above one": (
        """\
        telemetry: {sample_ratio: 1.5}
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp"}
        """,
        1,
        ["telemetry.sample_ratio", "1.5", "less than or equal to 1"],
    ),
    "bad listen address": (
        """\
        listen: "localhost"
        upstreams:
          mail: {mcp: "http://127.0.0.1:9001/mcp"}
        """,
        1,
        ["listen", "HOST:PORT"],
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_file_is_refused_naming_key_value_and_line(name: str):
    """Each bad file is refused with a message naming the key path, the value, why, and the line."""
    text, line, fragments = BAD_FILES[name]
    with pytest.raises(ConfigError) as caught:
        parse(text)
    message = str(caught.value)
    assert message.startswith(f"test.yaml:{line}:"), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_missing_file_is_a_clear_error(tmp_path: Path):
    """A config path that does not exist is a ConfigError naming the path, not a traceback."""
    with pytest.raises(ConfigError, match="cannot read the configuration"):
        load_config(tmp_path / "absent.yaml", environ={})

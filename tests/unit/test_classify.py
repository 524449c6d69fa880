"""Classification: rules first (first match wins), then MCP annotations, then the HTTP defaults."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.classify import ToolClassifier, classify_http, classify_tool, is_http_rule
from policies.model import Config, Defaults, KeyRecipe, ToolRule, UpstreamSpec


def _config(*rules: ToolRule, upstream_timeout: float | None = None) -> Config:
    upstreams = {
        "mail": UpstreamSpec(
            "mail", "mcp_http", url="http://127.0.0.1:9/mcp", timeout_s=upstream_timeout
        ),
        "openai": UpstreamSpec("openai", "http", url="http://127.0.0.1:9", provider="openai"),
        "anthropic": UpstreamSpec(
            "anthropic", "http", url="http://127.0.0.1:9", provider="anthropic"
        ),
        "generic": UpstreamSpec("generic", "http", url="http://127.0.0.1:9"),
    }
    return Config(upstreams=upstreams, tools=rules, defaults=Defaults(timeout_s=30.0))


def test_first_matching_rule_wins_and_carries_its_settings() -> None:
    """The first rule that matches decides, and its key recipe, cost class and budget come along."""
    config = _config(
        ToolRule(
            "mail/send_*",
            0,
            side_effect=True,
            key=KeyRecipe("fields", ("to", "subject")),
            cost_class="email",
            retry_budget=2,
            reject_as="tool_error",
            timeout_s=5.0,
            work_class="background",
        ),
        ToolRule("mail/*", 1, side_effect=False),
    )
    send = classify_tool(config, "mail", "send_email", {"readOnlyHint": True})
    assert send.side_effect is True
    assert send.source == "rule"
    assert send.rule_index == 0
    assert send.key == KeyRecipe("fields", ("to", "subject"))
    assert (send.cost_class, send.retry_budget, send.reject_as) == ("email", 2, "tool_error")
    assert (send.timeout_s, send.work_class) == (5.0, "background")
    other = classify_tool(config, "mail", "list_folders", None)
    assert (other.side_effect, other.source, other.rule_index) == (False, "rule", 1)


def test_rule_without_side_effect_defers_the_flag_but_keeps_its_settings() -> None:
    """A rule with `side_effect: null` lets annotations decide; its key recipe still applies."""
    config = _config(ToolRule("mail/*", 0, key=KeyRecipe("none"), cost_class="email"))
    result = classify_tool(config, "mail", "search", {"readOnlyHint": True})
    assert (result.side_effect, result.source) == (False, "annotations")
    assert (result.key, result.cost_class, result.rule_index) == (KeyRecipe("none"), "email", 0)


@pytest.mark.parametrize(
    ("annotations", "side_effect", "source"),
    [
        ({"readOnlyHint": True}, False, "annotations"),
        ({"readOnlyHint": False, "destructiveHint": True}, True, "annotations"),
        ({"destructiveHint": False}, True, "default"),
        ({"readOnlyHint": "yes"}, True, "default"),
        (None, True, "default"),
    ],
)
def test_annotations_then_default_decide_without_a_rule(
    annotations: dict[str, object] | None, side_effect: bool, source: str
) -> None:
    """Only a boolean readOnlyHint makes a tool read-only; without it a tool is side-effecting."""
    result = classify_tool(_config(), "mail", "anything", annotations)
    assert (result.side_effect, result.source, result.rule_index) == (side_effect, source, None)
    assert result.key == KeyRecipe("derived")
    assert result.costly is False


def test_idempotent_hint_is_recorded_but_does_not_make_a_tool_read_only() -> None:
    """idempotentHint is kept on the classification and leaves the tool side-effecting."""
    result = classify_tool(_config(), "mail", "set_flag", {"idempotentHint": True})
    assert result.idempotent_hint is True
    assert result.side_effect is True


def test_idempotent_hint_defaults_the_key_to_none_unless_a_rule_names_one() -> None:
    """A repeat of an idempotent tool is harmless: its default key is `none` (it runs again);
    a rule's key recipe still wins."""
    hint = {"idempotentHint": True}
    assert classify_tool(_config(), "mail", "set_flag", hint).key == KeyRecipe("none")
    assert classify_tool(_config(), "mail", "set_flag", {}).key == KeyRecipe("derived")
    ruled = _config(ToolRule("mail/*", 0, key=KeyRecipe("derived")))
    assert classify_tool(ruled, "mail", "set_flag", hint).key == KeyRecipe("derived")


def test_dedup_window_is_the_rules_else_the_default() -> None:
    """A rule's `key: {window_s: N}` sets the call's dedup window; otherwise the default's."""
    config = replace(
        _config(ToolRule("mail/send", 0, key=KeyRecipe("derived", window_s=5.0))),
        defaults=Defaults(timeout_s=30.0, dedup_window_s=120.0),
    )
    assert classify_tool(config, "mail", "send", None).dedup_window_s == 5.0
    assert classify_tool(config, "mail", "other", None).dedup_window_s == 120.0
    assert classify_http(config, "openai", "POST", "/v1/files").dedup_window_s == 120.0


def test_timeout_falls_back_from_rule_to_upstream_to_default() -> None:
    """The per-attempt timeout is the rule's, else the upstream's, else the configured default."""
    with_rule = _config(ToolRule("mail/slow", 0, timeout_s=90.0), upstream_timeout=20.0)
    assert classify_tool(with_rule, "mail", "slow", None).timeout_s == 90.0
    assert classify_tool(with_rule, "mail", "fast", None).timeout_s == 20.0
    assert classify_tool(_config(), "mail", "fast", None).timeout_s == 30.0


@pytest.mark.parametrize(
    ("upstream", "method", "path", "side_effect", "costly"),
    [
        ("openai", "GET", "/v1/models", False, False),
        ("openai", "head", "/v1/models", False, False),
        ("openai", "POST", "/v1/files", True, False),
        ("openai", "DELETE", "/v1/files/abc", True, False),
        ("openai", "POST", "/v1/chat/completions", False, True),
        ("openai", "POST", "/v1/completions", False, True),
        ("openai", "POST", "/v1/responses", False, True),
        ("openai", "POST", "/v1/embeddings?x=1", False, True),
        ("openai", "GET", "/v1/responses", False, False),
        ("anthropic", "POST", "/v1/messages", False, True),
        ("anthropic", "POST", "/v1/messages/count_tokens", False, True),
        ("anthropic", "POST", "/v1/messages/batches", True, False),
        ("anthropic", "POST", "/v1/chat/completions", True, False),
    ],
)
def test_http_defaults(
    upstream: str, method: str, path: str, side_effect: bool, costly: bool
) -> None:
    """GET/HEAD read-only; a provider's inference endpoints costly, not side-effecting;
    everything else side-effecting."""
    result = classify_http(_config(), upstream, method, path)
    assert (result.side_effect, result.costly, result.source) == (side_effect, costly, "default")


@pytest.mark.parametrize(
    ("upstream", "path"),
    [
        ("openai", "/v1/threads/t1/messages"),
        ("openai", "/v1/messages"),
        ("openai", "/chat/completions"),
        ("openai", "/v1/chat/completions/"),
        ("openai", "/openai/deployments/gpt/chat/completions"),
        ("anthropic", "/v1/responses"),
        ("generic", "/v1/chat/completions"),
        ("generic", "/v1/messages"),
        ("generic", "/v1/threads/t1/messages"),
    ],
)
def test_only_a_providers_exact_inference_paths_escape_the_ledger(upstream: str, path: str) -> None:
    """A path that only ends like an inference endpoint, or any path of an upstream not declared
    a model provider, is a side effect (ledgered, never retried after it may have run)."""
    result = classify_http(_config(), upstream, "POST", path)
    assert (result.side_effect, result.costly) == (True, False)


def test_inference_endpoints_name_their_gen_ai_operation() -> None:
    """The classification names the GenAI operation of an inference endpoint (none elsewhere)."""
    config = _config()
    assert classify_http(config, "openai", "POST", "/v1/chat/completions").gen_ai_operation == (
        "chat"
    )
    assert classify_http(config, "openai", "POST", "/v1/embeddings").gen_ai_operation == (
        "embeddings"
    )
    assert classify_http(config, "anthropic", "POST", "/v1/messages").gen_ai_operation == "chat"
    assert classify_http(config, "generic", "POST", "/v1/messages").gen_ai_operation is None


def test_http_rules_match_method_path_globs_with_optional_upstream_prefix() -> None:
    """HTTP rules match "METHOD /path" and "upstream:METHOD /path", not another upstream's."""
    config = _config(
        ToolRule("other:POST /v1/*", 0, side_effect=False),
        ToolRule("openai:POST /v1/files", 1, side_effect=False),
        ToolRule("GET /v1/files/*", 2, side_effect=True, cost_class="files"),
    )
    posted = classify_http(config, "openai", "POST", "/v1/files")
    assert (posted.side_effect, posted.rule_index, posted.source) == (False, 1, "rule")
    fetched = classify_http(config, "openai", "get", "/v1/files/abc")
    assert (fetched.side_effect, fetched.rule_index, fetched.cost_class) == (True, 2, "files")


def test_mcp_and_http_rules_do_not_catch_each_other() -> None:
    """A tool glob never matches an HTTP request and an HTTP glob never matches a tool."""
    config = _config(
        ToolRule("*/search*", 0, side_effect=False), ToolRule("* /*", 1, cost_class="x")
    )
    assert is_http_rule(config.tools[1])
    assert not is_http_rule(config.tools[0])
    http = classify_http(config, "openai", "POST", "/search")
    assert (http.side_effect, http.rule_index) == (True, 1)
    tool = classify_tool(config, "mail", "search_inbox", None)
    assert (tool.side_effect, tool.rule_index) == (False, 0)


def test_rule_can_make_an_inference_path_side_effecting() -> None:
    """A rule overrides the inference default; the path stays costly."""
    config = _config(ToolRule("POST /v1/responses", 0, side_effect=True))
    result = classify_http(config, "openai", "POST", "/v1/responses")
    assert (result.side_effect, result.costly, result.source) == (True, True, "rule")


_HINTS: list[dict[str, object] | None] = [
    None,
    {},
    {"readOnlyHint": True},
    {"readOnlyHint": False},
    {"readOnlyHint": 1},
    {"readOnlyHint": "true"},
    {"idempotentHint": True},
    {"idempotentHint": 1},
    {"readOnlyHint": False, "idempotentHint": True},
    {"readOnlyHint": True, "idempotentHint": True, "title": "ignored"},
]


def test_the_tool_classifier_answers_as_classify_tool_for_every_call_shape() -> None:
    """Remembered classifications never leak between tools, upstreams or what annotations say:
    every combination, asked in any order and again, gets what `classify_tool` decides."""
    config = _config(
        ToolRule("mail/send_*", 0, side_effect=True, key=KeyRecipe("explicit")),
        ToolRule("mail/search", 1, side_effect=False),
        ToolRule("mail/*", 2, cost_class="slow"),
    )
    config = replace(
        config,
        upstreams={
            **config.upstreams,
            "files": UpstreamSpec("files", "mcp_http", url="http://127.0.0.1:9/f", timeout_s=7.0),
        },
    )
    classify = ToolClassifier(config)
    shapes = [
        (upstream, tool, index)
        for upstream in ("mail", "files")
        for tool in ("send_email", "search", "other")
        for index in range(len(_HINTS))
    ]
    for _ in range(2):
        for upstream, tool, index in shapes:
            hints = _HINTS[index]
            assert classify(upstream, tool, hints) == classify_tool(config, upstream, tool, hints)
        shapes.reverse()


def test_the_tool_classifier_stays_bounded() -> None:
    """Tool names come from callers: past its bound the classifier starts over, never grows."""
    classify = ToolClassifier(_config(), max_entries=8)
    for n in range(100):
        classify("mail", f"tool-{n}", None)
        assert len(classify) <= 8
    assert classify("mail", "tool-3", {"readOnlyHint": True}).side_effect is False

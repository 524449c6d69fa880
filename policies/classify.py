"""Classification: is a call side-effecting, is it costly, and which policy rule governs it.

The side-effect flag comes from the first source that says something:

1. the first policy rule whose glob matches (rules are tried in order; the first match is the rule,
   and its `side_effect: null` defers only that flag to the next source);
2. for MCP tools, the tool's annotations from `tools/list`: `readOnlyHint: true` is read-only,
   `readOnlyHint: false` is side-effecting;
3. the defaults of DESIGN.md: an MCP tool is side-effecting; an HTTP `GET`/`HEAD` is read-only,
   other methods are side-effecting, except the inference endpoints of an upstream declared a
   model provider (`kind: openai` or `kind: anthropic`), which are costly but not side-effecting.

Inference endpoints are matched exactly on the whole path the upstream receives (its base URL's
path, then the caller's), so `POST /v1/threads/t1/messages` is no inference call and a generic
JSON API has none at all: a path that merely looks like one is a side effect, never retried.
HTTP rules and classification are given that same decoded, normalised path (see
`proxy.http.paths`), so an encoded character cannot step around a rule.

A rule whose glob contains a space is an HTTP rule ("METHOD /path" or "upstream:METHOD /path");
any other rule is an MCP rule on "upstream/tool". Each kind of call only looks at its kind of rule,
so "*/search*" never catches an HTTP "GET /search" by accident. Globs are case-sensitive `fnmatch`.

`destructiveHint` and `idempotentHint` never make a call read-only. `idempotentHint: true` makes
the default key recipe `none` (a repeat is harmless, so a deliberate repeat must run, not replay);
the call is still recorded. It does not license retrying a call that may have run: DESIGN.md only
retries a side-effecting call that certainly did not take effect.

The key recipe is the rule's, else `none` for an idempotent tool, else `derived`; a derived (or
fields) key dedupes for the recipe's `window_s`, else `defaults.dedup_window_s`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Any, Literal

from policies.model import Config, KeyRecipe, ProviderKind, RejectAs, ToolRule, WorkClass

__all__ = [
    "INFERENCE_ENDPOINTS",
    "Classification",
    "ClassificationSource",
    "ToolClassifier",
    "classify_http",
    "classify_tool",
    "inference_operation",
    "is_http_rule",
]

ClassificationSource = Literal["rule", "annotations", "default"]

INFERENCE_ENDPOINTS: Mapping[ProviderKind, Mapping[str, str | None]] = {
    "openai": {
        "/v1/chat/completions": "chat",
        "/v1/completions": "text_completion",
        "/v1/responses": "chat",
        "/v1/embeddings": "embeddings",
    },
    "anthropic": {
        "/v1/messages": "chat",
        "/v1/messages/count_tokens": None,
    },
}
"""Per model provider, its `POST` inference paths → the GenAI operation name (None: none fits)."""
_READ_ONLY_METHODS = frozenset({"GET", "HEAD"})
_DERIVED = KeyRecipe("derived")
_NO_KEY = KeyRecipe("none")


@dataclass(frozen=True, slots=True)
class Classification:
    """What policy says about one call.

    `costly` marks a model-inference endpoint (budgeted, traced), `gen_ai_operation` its GenAI
    operation name. `key` is the effective key recipe (the rule's, else `none` for an idempotent
    tool, else derived) and `dedup_window_s` how long a derived key recognises a repeat.
    `timeout_s` is the effective per-attempt timeout: the rule's, else the
    upstream's, else the configured default. `work_class` is the rule's override, if any.
    `source` names where `side_effect` came from.
    """

    side_effect: bool
    costly: bool
    key: KeyRecipe
    cost_class: str | None
    retry_budget: int | None
    reject_as: RejectAs
    timeout_s: float | None
    work_class: WorkClass | None
    rule_index: int | None
    source: ClassificationSource
    idempotent_hint: bool = False
    gen_ai_operation: str | None = None
    dedup_window_s: float = 300.0
    redact: tuple[str, ...] = ()
    """Argument fields (dotted paths) stored only as a hash: the rule's `redact`."""


def is_http_rule(rule: ToolRule) -> bool:
    """Whether a rule is written for HTTP calls ("METHOD /path"), not MCP tools."""
    return " " in rule.match


def classify_tool(
    config: Config, upstream: str, tool: str, annotations: Mapping[str, Any] | None
) -> Classification:
    """Classify an MCP `tools/call` of `tool` on `upstream`, given its annotations if known."""
    subject = f"{upstream}/{tool}"
    rule = _first_rule(config, lambda r: not is_http_rule(r) and fnmatchcase(subject, r.match))
    hints = annotations or {}
    idempotent = hints.get("idempotentHint") is True
    source: ClassificationSource
    if rule is not None and rule.side_effect is not None:
        side_effect, source = rule.side_effect, "rule"
    elif isinstance(hints.get("readOnlyHint"), bool):
        side_effect, source = hints["readOnlyHint"] is not True, "annotations"
    else:
        side_effect, source = True, "default"
    return _build(config, upstream, rule, side_effect, False, source, idempotent)


_MAX_TOOL_SHAPES = 4096


class ToolClassifier:
    """`classify_tool` under one configuration, remembered per call shape: the upstream, the
    tool, and what its annotations say that the decision reads (a boolean `readOnlyHint`, an
    `idempotentHint` of true). Every `tools/call` is classified, and the answer is the same for
    every call of one shape (a glob match and a 13-field value: a few microseconds otherwise).

    At most `max_entries` are kept; past that it starts over (tool names come from callers).
    """

    __slots__ = ("_config", "_known", "_max")

    def __init__(self, config: Config, *, max_entries: int = _MAX_TOOL_SHAPES) -> None:
        self._config = config
        self._known: dict[tuple[str, str, bool | None, bool], Classification] = {}
        self._max = max_entries

    def __len__(self) -> int:
        return len(self._known)

    def __call__(
        self, upstream: str, tool: str, annotations: Mapping[str, Any] | None
    ) -> Classification:
        hints = annotations or {}
        read_only = hints.get("readOnlyHint")
        shape = (
            upstream,
            tool,
            read_only if isinstance(read_only, bool) else None,
            hints.get("idempotentHint") is True,
        )
        known = self._known.get(shape)
        if known is None:
            known = classify_tool(self._config, upstream, tool, annotations)
            if len(self._known) >= self._max:
                self._known.clear()
            self._known[shape] = known
        return known


def inference_operation(provider: ProviderKind, method: str, path: str) -> tuple[bool, str | None]:
    """Whether `method path` is an inference endpoint of `provider`, and its GenAI operation."""
    endpoints = INFERENCE_ENDPOINTS.get(provider, {})
    if method.upper() != "POST" or path not in endpoints:
        return False, None
    return True, endpoints[path]


def classify_http(config: Config, upstream: str, method: str, path: str) -> Classification:
    """Classify an HTTP request `method path` to `upstream`.

    `path` is the decoded, normalised path the upstream receives (its base URL's path included);
    a query string, if any, is ignored.
    """
    verb = method.upper()
    bare = path.split("?", 1)[0]
    bare = bare if bare.startswith("/") else f"/{bare}"
    plain, scoped = f"{verb} {bare}", f"{upstream}:{verb} {bare}"

    def matches(rule: ToolRule) -> bool:
        return is_http_rule(rule) and (
            fnmatchcase(plain, rule.match) or fnmatchcase(scoped, rule.match)
        )

    rule = _first_rule(config, matches)
    read_only = verb in _READ_ONLY_METHODS
    spec = config.upstreams.get(upstream)
    provider: ProviderKind = spec.provider if spec is not None else "generic"
    costly, operation = inference_operation(provider, verb, bare)
    source: ClassificationSource
    if rule is not None and rule.side_effect is not None:
        side_effect, source = rule.side_effect, "rule"
    else:
        side_effect, source = not read_only and not costly, "default"
    result = _build(config, upstream, rule, side_effect, costly, source, False)
    return replace(result, gen_ai_operation=operation)


def _first_rule(config: Config, predicate: Callable[[ToolRule], bool]) -> ToolRule | None:
    return next((rule for rule in config.tools if predicate(rule)), None)


def _build(
    config: Config,
    upstream: str,
    rule: ToolRule | None,
    side_effect: bool,
    costly: bool,
    source: ClassificationSource,
    idempotent: bool,
) -> Classification:
    spec = config.upstreams.get(upstream)
    upstream_timeout = spec.timeout_s if spec is not None else None
    rule_timeout = rule.timeout_s if rule is not None else None
    timeout = rule_timeout or upstream_timeout or config.defaults.timeout_s
    if rule is not None and rule.key is not None:
        key = rule.key
    else:
        key = _NO_KEY if idempotent else _DERIVED
    window = key.window_s if key.window_s is not None else config.defaults.dedup_window_s
    return Classification(
        side_effect=side_effect,
        costly=costly,
        key=key,
        cost_class=rule.cost_class if rule is not None else None,
        retry_budget=rule.retry_budget if rule is not None else None,
        reject_as=rule.reject_as if rule is not None else "error",
        timeout_s=timeout,
        work_class=rule.work_class if rule is not None else None,
        rule_index=rule.index if rule is not None else None,
        source=source,
        idempotent_hint=idempotent,
        dedup_window_s=window,
        redact=rule.redact if rule is not None else (),
    )

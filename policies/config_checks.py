"""Rules across keys that the schema alone cannot express: exactly one upstream transport, URLs,
globs that are MCP or HTTP rules, shares summing to 1, cost classes that exist."""

from __future__ import annotations

import fnmatch
import math
import re

from policies.config_schema import ConfigIn, ToolRuleIn, UpstreamIn
from policies.config_yaml import MISSING, KeyPath, Reporter

__all__ = ["DEFAULT_CLASSES", "check_config", "merged_classes"]

DEFAULT_CLASSES: dict[str, tuple[float, float]] = {
    "critical": (0.10, 30.0),
    "interactive": (0.60, 0.0),
    "background": (0.25, 30.0),
    "bulk": (0.05, 300.0),
}
_UPSTREAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_HTTP_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "*"}


def _check_glob(rule: ToolRuleIn, index: int, reporter: Reporter) -> None:
    pattern = rule.match
    where = ("tools", index, "match")
    if pattern.count("[") != pattern.count("]"):
        raise reporter.error(where, pattern, "unbalanced '[' ']' in the glob")
    target = pattern.split(":", 1)[1] if re.match(r"^[\w.-]+:", pattern) else pattern
    if " " in target:
        method, _, http_path = target.partition(" ")
        if method.upper() not in _HTTP_METHODS or not http_path.startswith(("/", "*")):
            raise reporter.error(
                where, pattern, "an HTTP rule is 'METHOD /path-glob' (e.g. 'POST /v1/files*')"
            )
    elif "/" not in target:
        raise reporter.error(where, pattern, "an MCP rule is 'upstream/tool' (e.g. 'mail/send_*')")
    try:
        re.compile(fnmatch.translate(pattern))
    except re.error as exc:
        raise reporter.error(where, pattern, f"not a valid glob: {exc}") from None


def _check_upstream(name: str, up: UpstreamIn, reporter: Reporter) -> None:
    where: KeyPath = ("upstreams", name)
    if not _UPSTREAM_NAME.match(name):
        raise reporter.error(where, name, "upstream names use letters, digits, '_', '-', '.'")
    given = [k for k in ("mcp", "http", "command") if getattr(up, k) is not None]
    if len(given) != 1:
        why = "set exactly one of mcp, http, command" + (
            f" (got {', '.join(given)})" if given else ""
        )
        raise reporter.error(where, MISSING, why)
    for key in ("mcp", "http"):
        url = getattr(up, key)
        if url is not None and not re.match(r"^https?://[^/\s]+", url):
            raise reporter.error((*where, key), url, "must be an http:// or https:// URL")
    if up.command is not None and not up.command:
        raise reporter.error((*where, "command"), up.command, "must name a program to run")
    if up.kind != "generic" and up.http is None:
        why = "only an http upstream can be a model API (kind: openai or anthropic)"
        raise reporter.error((*where, "kind"), up.kind, why)


def check_config(cfg: ConfigIn, reporter: Reporter) -> None:
    if not cfg.upstreams:
        raise reporter.error(("upstreams",), {}, "configure at least one upstream")
    for name, up in cfg.upstreams.items():
        _check_upstream(name, up, reporter)
    if not re.match(r"^(\[[0-9a-fA-F:]+\]|[\w.-]+):\d{1,5}$", cfg.listen):
        raise reporter.error(("listen",), cfg.listen, "expected HOST:PORT, e.g. 127.0.0.1:8787")
    shares = merged_classes(cfg)
    total = sum(share for share, _ in shares.values())
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        detail = ", ".join(f"{k} {v[0]:g}" for k, v in shares.items())
        raise reporter.error(
            ("classes",), MISSING, f"shares must sum to 1, got {total:g} ({detail})"
        )
    for index, rule in enumerate(cfg.tools):
        _check_glob(rule, index, reporter)
        if rule.cost_class is not None and rule.cost_class not in cfg.cost_classes:
            defined = ", ".join(sorted(cfg.cost_classes)) or "none"
            raise reporter.error(
                ("tools", index, "cost_class"),
                rule.cost_class,
                f"unknown cost class (defined under cost_classes: {defined})",
            )
    endpoint = cfg.telemetry.otlp_endpoint
    if endpoint is not None and not re.match(r"^https?://[^/\s]+", endpoint):
        raise reporter.error(("telemetry", "otlp_endpoint"), endpoint, "must be an http(s) URL")
    if not re.match(r"^(sqlite|postgresql|postgres)(\+\w+)?://", cfg.ledger.url):
        raise reporter.error(
            ("ledger", "url"),
            cfg.ledger.url,
            "expected sqlite:///PATH or postgresql://USER@HOST/DB",
        )


def merged_classes(cfg: ConfigIn) -> dict[str, tuple[float, float]]:
    merged = dict(DEFAULT_CLASSES)
    for name, band in cfg.classes.items():
        merged[name] = (band.share, band.max_wait_s)
    return merged

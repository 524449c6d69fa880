"""Load the YAML configuration into frozen `policies.model.Config` values.

Errors name the key path, the bad value, why, and the line in the file:
``interlock.yaml:14: tools[0].cost_class = 'email': unknown cost class (defined: browser)``.
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from policies.config_schema import ConfigIn, LimitsIn, ToolRuleIn, UpstreamIn
from policies.model import (
    WORK_CLASSES,
    AdminSettings,
    BudgetSettings,
    ClassBand,
    Config,
    Defaults,
    KeyRecipe,
    LedgerSettings,
    Limits,
    RetrySettings,
    TelemetrySettings,
    ToolRule,
    UpstreamKind,
    UpstreamSpec,
    WorkClass,
)

__all__ = ["DEFAULT_CLASSES", "ConfigError", "load_config", "parse_config_text"]

Path_ = tuple[str | int, ...]

DEFAULT_CLASSES: dict[str, tuple[float, float]] = {
    "critical": (0.10, 30.0),
    "interactive": (0.60, 0.0),
    "background": (0.25, 30.0),
    "bulk": (0.05, 300.0),
}
_DEFAULT_LIMITS = {
    "global": LimitsIn(max_running=256, max_pending=1024),
    "tenant": LimitsIn(max_running=32, max_pending=128),
    "run": LimitsIn(max_running=8),
}
_ENV_SECTIONS = ("admin", "ledger", "telemetry", "defaults", "budgets")
_ENV_TOP_LEVEL = ("listen", "mode", "max_body_bytes", "retry_after_cap_s", "shutdown_grace_s")
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_UPSTREAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_HTTP_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "*"}


class ConfigError(ValueError):
    """The configuration cannot be used; `str()` is the message for the operator."""

    def __init__(self, message: str, *, path: str = "", line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


def _fmt_path(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


class _Loader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys (PyYAML would silently keep the last one)."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(
                f"duplicate key {key!r} (first at line {seen[key]})",
                path=str(key),
                line=key_node.start_mark.line + 1,
            )
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _line_map(
    node: yaml.Node | None, path: Path_ = (), out: dict[Path_, int] | None = None
) -> dict[Path_, int]:
    """Map each key path of the document to the line (1-based) where its value starts."""
    out = {} if out is None else out
    if node is None:
        return out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = (*path, str(key_node.value))
            out[child] = key_node.start_mark.line + 1
            _line_map(value_node, child, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _line_map(item, (*path, index), out)
    return out


class _Reporter:
    """Builds `ConfigError`s that point at the line of the offending key."""

    def __init__(self, source: str, lines: Mapping[Path_, int]) -> None:
        self.source = source
        self.lines = lines

    def line_of(self, path: Path_) -> int | None:
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.lines:
                return self.lines[path[:cut]]
        return None

    def error(self, path: Path_, value: Any, why: str) -> ConfigError:
        line = self.line_of(path)
        where = f"{self.source}:{line}" if line else self.source
        shown = "" if value is _MISSING else f" = {value!r}"
        return ConfigError(
            f"{where}: {_fmt_path(path)}{shown}: {why}", path=_fmt_path(path), line=line
        )


_MISSING = object()


def _dig(data: Any, path: Path_) -> Any:
    for part in path:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return data


def _apply_env_overrides(data: dict[str, Any], environ: Mapping[str, str]) -> None:
    """`INTERLOCK_<SECTION>_<KEY>` (and `INTERLOCK_<KEY>` for top-level keys) override the file."""
    for name, raw in environ.items():
        if not name.startswith("INTERLOCK_"):
            continue
        rest = name[len("INTERLOCK_") :].lower()
        value = yaml.safe_load(raw) if raw.strip() else None
        if rest in _ENV_TOP_LEVEL:
            data[rest] = value
            continue
        for section in _ENV_SECTIONS:
            if rest.startswith(section + "_"):
                key = rest[len(section) + 1 :]
                if key in _section_keys(section):
                    section_data = data.setdefault(section, {})
                    if isinstance(section_data, dict):
                        section_data["class" if key == "class" else key] = value


def _section_keys(section: str) -> set[str]:
    model = ConfigIn.model_fields[section].annotation
    fields = getattr(model, "model_fields", {})
    return {(f.alias or n) for n, f in fields.items()}


def parse_config_text(
    text: str,
    source: str = "interlock.yaml",
    environ: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> Config:
    """Parse and validate a configuration document.

    Raises:
        ConfigError: the document is not valid YAML, or a key is unknown, mistyped or inconsistent.
    """
    environ = os.environ if environ is None else environ
    try:
        root = yaml.compose(text, Loader=_Loader)
        data = yaml.load(text, Loader=_Loader)
    except ConfigError as exc:
        raise ConfigError(f"{source}:{exc.line}: {exc}", path=exc.path, line=exc.line) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}:{line}: not valid YAML: {problem}", line=line) from None
    reporter = _Reporter(source, _line_map(root))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise reporter.error((), data, "the configuration must be a mapping of keys")
    _apply_env_overrides(data, environ)
    try:
        parsed = ConfigIn.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        path: Path_ = tuple(first["loc"])
        raise reporter.error(path, _dig(data, path), first["msg"]) from None
    _check(parsed, reporter)
    return _build(parsed, reporter, environ, base_dir, source)


def load_config(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate the configuration file at `path`.

    Raises:
        ConfigError: the file is missing, unreadable or invalid (the message names key and line).
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the configuration: {exc.strerror}") from None
    return parse_config_text(text, str(file), environ, base_dir=file.resolve().parent)


def _check_glob(rule: ToolRuleIn, index: int, reporter: _Reporter) -> None:
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


def _check_upstream(name: str, up: UpstreamIn, reporter: _Reporter) -> None:
    where: Path_ = ("upstreams", name)
    if not _UPSTREAM_NAME.match(name):
        raise reporter.error(where, name, "upstream names use letters, digits, '_', '-', '.'")
    given = [k for k in ("mcp", "http", "command") if getattr(up, k) is not None]
    if len(given) != 1:
        why = "set exactly one of mcp, http, command" + (
            f" (got {', '.join(given)})" if given else ""
        )
        raise reporter.error(where, _MISSING, why)
    for key in ("mcp", "http"):
        url = getattr(up, key)
        if url is not None and not re.match(r"^https?://[^/\s]+", url):
            raise reporter.error((*where, key), url, "must be an http:// or https:// URL")
    if up.command is not None and not up.command:
        raise reporter.error((*where, "command"), up.command, "must name a program to run")


def _check(cfg: ConfigIn, reporter: _Reporter) -> None:
    if not cfg.upstreams:
        raise reporter.error(("upstreams",), {}, "configure at least one upstream")
    for name, up in cfg.upstreams.items():
        _check_upstream(name, up, reporter)
    if not re.match(r"^(\[[0-9a-fA-F:]+\]|[\w.-]+):\d{1,5}$", cfg.listen):
        raise reporter.error(("listen",), cfg.listen, "expected HOST:PORT, e.g. 127.0.0.1:8787")
    shares = _merged_classes(cfg)
    total = sum(share for share, _ in shares.values())
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        detail = ", ".join(f"{k} {v[0]:g}" for k, v in shares.items())
        raise reporter.error(
            ("classes",), _MISSING, f"shares must sum to 1, got {total:g} ({detail})"
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


def _merged_classes(cfg: ConfigIn) -> dict[str, tuple[float, float]]:
    merged = dict(DEFAULT_CLASSES)
    for name, band in cfg.classes.items():
        merged[name] = (band.share, band.max_wait_s)
    return merged


def _interpolate(value: str, path: Path_, reporter: _Reporter, environ: Mapping[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise reporter.error(path, _MISSING, f"environment variable {name} is not set")
        return environ[name]

    return _INTERPOLATION.sub(substitute, value)


def _limits(limits: LimitsIn) -> Limits:
    return Limits(limits.max_running, limits.max_pending, limits.max_wait_s)


def _ledger_url(url: str, base_dir: Path | None) -> str:
    match = re.match(r"^(sqlite(?:\+\w+)?):///(.*)$", url)
    if match is None or base_dir is None:
        return url
    scheme, file = match.groups()
    if not file or file == ":memory:" or file.startswith("/"):
        return url
    return f"{scheme}:///{(base_dir / file).resolve()}"


def _build_upstream(
    name: str, up: UpstreamIn, reporter: _Reporter, environ: Mapping[str, str]
) -> UpstreamSpec:
    headers = {
        key: _interpolate(value, ("upstreams", name, "headers", key), reporter, environ)
        for key, value in up.headers.items()
    }
    env = {
        key: _interpolate(value, ("upstreams", name, "env", key), reporter, environ)
        for key, value in up.env.items()
    }
    kind: UpstreamKind = "mcp_http" if up.mcp else "http" if up.http else "mcp_stdio"
    return UpstreamSpec(
        name=name,
        kind=kind,
        url=(up.mcp or up.http or None),
        command=tuple(up.command or ()),
        env=env,
        cwd=up.cwd,
        headers=headers,
        limits=_limits(up.limits),
        timeout_s=up.timeout_s,
        retry=RetrySettings(**up.retry.model_dump()),
    )


def _build_rule(index: int, rule: ToolRuleIn) -> ToolRule:
    key: KeyRecipe | None
    if rule.key is None:
        key = None
    elif isinstance(rule.key, str):
        key = KeyRecipe(mode=rule.key)
    else:
        key = KeyRecipe(mode="fields", fields=tuple(rule.key.fields))
    return ToolRule(
        match=rule.match,
        index=index,
        side_effect=rule.side_effect,
        key=key,
        cost_class=rule.cost_class,
        retry_budget=rule.retry_budget,
        reject_as=rule.reject_as,
        timeout_s=rule.timeout_s,
        work_class=rule.work_class,
    )


def _build(
    cfg: ConfigIn,
    reporter: _Reporter,
    environ: Mapping[str, str],
    base_dir: Path | None,
    source: str,
) -> Config:
    merged = _merged_classes(cfg)
    classes: dict[WorkClass, ClassBand] = {
        name: ClassBand(name=name, share=merged[name][0], max_wait_s=merged[name][1])
        for name in WORK_CLASSES
    }
    limits: dict[str, LimitsIn] = dict(_DEFAULT_LIMITS)
    limits.update({str(name): value for name, value in cfg.limits.items()})
    tenant_keys = {
        _interpolate(key, ("tenants", "api_keys", key), reporter, environ): tenant
        for key, tenant in cfg.tenants.api_keys.items()
    }
    ledger = cfg.ledger.model_dump()
    ledger["url"] = _ledger_url(cfg.ledger.url, base_dir)
    return Config(
        upstreams={n: _build_upstream(n, u, reporter, environ) for n, u in cfg.upstreams.items()},
        listen=cfg.listen,
        mode=cfg.mode,
        admin=AdminSettings(token_env=cfg.admin.token_env),
        ledger=LedgerSettings(**ledger),
        telemetry=TelemetrySettings(**cfg.telemetry.model_dump()),
        defaults=Defaults(
            work_class=cfg.defaults.work_class,
            timeout_s=cfg.defaults.timeout_s,
            deadline_s=cfg.defaults.deadline_s,
        ),
        classes=classes,
        limits={name: _limits(value) for name, value in limits.items()},
        cost_classes={name: _limits(value) for name, value in cfg.cost_classes.items()},
        tools=tuple(_build_rule(i, rule) for i, rule in enumerate(cfg.tools)),
        budgets=BudgetSettings(tokens=cfg.budgets.tokens, window_s=cfg.budgets.window_s),
        tenant_api_keys=tenant_keys,
        max_body_bytes=cfg.max_body_bytes,
        retry_after_cap_s=cfg.retry_after_cap_s,
        shutdown_grace_s=cfg.shutdown_grace_s,
        source_path=source,
    )

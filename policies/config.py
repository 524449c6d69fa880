"""Load the YAML configuration into frozen `policies.model.Config` values.

Errors name the key path, the bad value, why, and the line in the file:
``interlock.yaml:14: tools[0].cost_class = 'email': unknown cost class (defined: browser)``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from policies.config_checks import DEFAULT_CLASSES, check_config, merged_classes
from policies.config_schema import ConfigIn, LimitsIn, ToolRuleIn, UpstreamIn
from policies.config_yaml import MISSING, ConfigError, KeyPath, Loader, Reporter, dig, line_map
from policies.edge import normalised
from policies.header_syntax import breaks_header_line, is_header_name
from policies.model import (
    WORK_CLASSES,
    AdminSettings,
    BudgetSettings,
    ClassBand,
    Config,
    Defaults,
    DeferredSettings,
    EdgeSettings,
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

_DEFAULT_LIMITS = {
    "global": LimitsIn(max_running=256, max_pending=1024),
    "tenant": LimitsIn(max_running=32, max_pending=128),
    "run": LimitsIn(max_running=8),
}
_ENV_SECTIONS = ("admin", "ledger", "deferred", "telemetry", "defaults", "budgets")
_ENV_TOP_LEVEL = (
    "listen",
    "mode",
    "max_body_bytes",
    "max_response_bytes",
    "retry_after_cap_s",
    "shutdown_grace_s",
    "max_batch",
    "max_connections",
    "client_header_timeout_s",
    "client_body_timeout_s",
)
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


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
        root = yaml.compose(text, Loader=Loader)
        data = yaml.load(text, Loader=Loader)
    except ConfigError as exc:
        raise ConfigError(f"{source}:{exc.line}: {exc}", path=exc.path, line=exc.line) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}:{line}: not valid YAML: {problem}", line=line) from None
    reporter = Reporter(source, line_map(root))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise reporter.error((), data, "the configuration must be a mapping of keys")
    _apply_env_overrides(data, environ)
    try:
        parsed = ConfigIn.model_validate(data)
    except ValidationError as exc:
        path, message = _most_specific(exc, data)
        raise reporter.error(path, dig(data, path), message) from None
    check_config(parsed, reporter)
    return _build(parsed, reporter, environ, base_dir, source)


def _most_specific(exc: ValidationError, data: Any) -> tuple[KeyPath, str]:
    """The error that reaches deepest into the document, with its key path cleaned of the
    union-member tags pydantic inserts (`key: {window_s: -1}` is reported at `key.window_s`,
    not as "should be 'explicit', 'derived' or 'none'")."""
    error = max(exc.errors(), key=lambda e: len(e["loc"]))
    path: list[str | int] = []
    node: Any = data
    for index, part in enumerate(error["loc"]):
        in_document = (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and part < len(node)
        )
        if in_document:
            node = node[part]
        elif index < len(error["loc"]) - 1:
            continue  # a union member's tag, not a key of the document
        path.append(part)
    return tuple(path), error["msg"]


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


def _interpolate(value: str, path: KeyPath, reporter: Reporter, environ: Mapping[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise reporter.error(path, MISSING, f"environment variable {name} is not set")
        return environ[name]

    return _INTERPOLATION.sub(substitute, value)


def _header(
    key: str, value: str, path: KeyPath, reporter: Reporter, environ: Mapping[str, str]
) -> str:
    """A configured upstream header, checked the way it will be written into every request.

    The value is never shown in an error: after `${VAR}` it may be a secret."""
    if not is_header_name(key):
        raise reporter.error(
            path, MISSING, "not a header name (letters, digits and !#$%&'*+-.^_`|~)"
        )
    text = _interpolate(value, path, reporter, environ)
    if breaks_header_line(text):
        raise reporter.error(path, MISSING, "the value holds a line break or NUL (after ${VAR})")
    return text


def _limits(limits: LimitsIn) -> Limits:
    return Limits(
        limits.max_running,
        limits.max_pending,
        limits.max_wait_s,
        limits.rate_per_s,
        limits.burst,
    )


def _ledger_url(url: str, base_dir: Path | None) -> str:
    match = re.match(r"^(sqlite(?:\+\w+)?):///(.*)$", url)
    if match is None or base_dir is None:
        return url
    scheme, file = match.groups()
    if not file or file == ":memory:" or file.startswith("/"):
        return url
    return f"{scheme}:///{(base_dir / file).resolve()}"


def _build_upstream(
    name: str, up: UpstreamIn, reporter: Reporter, environ: Mapping[str, str]
) -> UpstreamSpec:
    headers = {
        key: _header(key, value, ("upstreams", name, "headers", key), reporter, environ)
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
        max_sessions=up.max_sessions,
        max_connections=up.max_connections,
        session_idle_s=up.session_idle_s,
        provider=up.kind,
        not_executed_statuses=frozenset(up.not_executed_statuses),
        allowed_methods=frozenset(method.upper() for method in up.allowed_methods),
    )


def _build_rule(index: int, rule: ToolRuleIn) -> ToolRule:
    key: KeyRecipe | None
    if rule.key is None:
        key = None
    elif isinstance(rule.key, str):
        key = KeyRecipe(mode=rule.key)
    elif rule.key.fields is not None:
        key = KeyRecipe(mode="fields", fields=tuple(rule.key.fields), window_s=rule.key.window_s)
    else:
        key = KeyRecipe(mode="derived", window_s=rule.key.window_s)
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
        redact=tuple(rule.redact),
    )


def _defers(cfg: ConfigIn, name: WorkClass) -> bool:
    """`classes.<name>.defer`, by default on for bulk only."""
    band = cfg.classes.get(name)
    if band is not None and band.defer is not None:
        return band.defer
    return name == "bulk"


def _build(
    cfg: ConfigIn,
    reporter: Reporter,
    environ: Mapping[str, str],
    base_dir: Path | None,
    source: str,
) -> Config:
    merged = merged_classes(cfg)
    classes: dict[WorkClass, ClassBand] = {
        name: ClassBand(
            name=name,
            share=merged[name][0],
            max_wait_s=merged[name][1],
            defer=_defers(cfg, name),
        )
        for name in WORK_CLASSES
    }
    limits: dict[str, LimitsIn] = dict(_DEFAULT_LIMITS)
    limits.update({str(name): value for name, value in cfg.limits.items()})
    tenant_keys = {
        _interpolate(key, ("tenants", "api_keys", key), reporter, environ): tenant
        for key, tenant in cfg.tenants.api_keys.items()
    }
    if cfg.ledger.commit_delay_ms > cfg.ledger.lease_s * 100:
        raise reporter.error(
            ("ledger", "commit_delay_ms"),
            cfg.ledger.commit_delay_ms,
            f"must be at most a tenth of ledger.lease_s ({cfg.ledger.lease_s:g} s): lease "
            "renewals are writes too, and one held that long could let its lease lapse",
        )
    ledger = cfg.ledger.model_dump()
    ledger["url"] = _ledger_url(cfg.ledger.url, base_dir)
    return Config(
        upstreams={n: _build_upstream(n, u, reporter, environ) for n, u in cfg.upstreams.items()},
        listen=cfg.listen,
        mode=cfg.mode,
        admin=AdminSettings(token_env=cfg.admin.token_env),
        ledger=LedgerSettings(**ledger),
        deferred=DeferredSettings(**cfg.deferred.model_dump()),
        telemetry=TelemetrySettings(**cfg.telemetry.model_dump()),
        defaults=Defaults(
            work_class=cfg.defaults.work_class,
            timeout_s=cfg.defaults.timeout_s,
            deadline_s=cfg.defaults.deadline_s,
            dedup_window_s=cfg.defaults.dedup_window_s,
        ),
        classes=classes,
        limits={name: _limits(value) for name, value in limits.items()},
        cost_classes={name: _limits(value) for name, value in cfg.cost_classes.items()},
        tools=tuple(_build_rule(i, rule) for i, rule in enumerate(cfg.tools)),
        budgets=BudgetSettings(tokens=cfg.budgets.tokens, window_s=cfg.budgets.window_s),
        tenant_api_keys=tenant_keys,
        edge=EdgeSettings(
            allowed_origins=normalised(cfg.allowed_origins),
            allowed_hosts=normalised(cfg.allowed_hosts),
            max_batch=cfg.max_batch,
            max_connections=cfg.max_connections,
            header_timeout_s=cfg.client_header_timeout_s,
            body_timeout_s=cfg.client_body_timeout_s,
        ),
        max_body_bytes=cfg.max_body_bytes,
        max_response_bytes=cfg.max_response_bytes,
        retry_after_cap_s=cfg.retry_after_cap_s,
        shutdown_grace_s=cfg.shutdown_grace_s,
        source_path=source,
    )

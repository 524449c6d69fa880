"""`interlock check-config`: print the effective policy as people read it (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from policies.model import Config, KeyRecipe, Limits, UpstreamSpec
from policies.retry import not_executed_statuses

__all__ = ["print_policy"]


def _num(value: float | int | None) -> str:
    return "∞" if value is None else f"{value:g}"


def _limits_row(scope: str, limits: Limits) -> list[str]:
    rate = "-" if limits.rate_per_s is None else f"{limits.rate_per_s:g}/s"
    if limits.rate_per_s is not None and limits.burst is not None:
        rate += f" (burst {limits.burst})"
    row = [_num(limits.max_running), _num(limits.max_pending), _num(limits.max_wait_s)]
    return [scope, *row, rate]


def print_policy(config: Config, console: Console | None = None) -> None:
    """Print limits per scope, classes, upstreams and tool rules (in match order)."""
    console = console or Console()
    console.print(f"[bold]Effective policy[/bold] from {config.source_path or '(text)'}")
    console.print(
        f"listen {config.listen} · mode {config.mode} · ledger {config.ledger.url} "
        f"(durability {config.ledger.durability}, lease {config.ledger.lease_s:g} s, "
        f"retention {config.ledger.retention_h:g} h) · body cap {config.max_body_bytes} bytes"
    )
    console.print(
        f"defaults: class {config.defaults.work_class}, attempt timeout "
        f"{config.defaults.timeout_s:g} s, deadline {config.defaults.deadline_s:g} s, "
        f"dedup window {config.defaults.dedup_window_s:g} s (derived keys)"
    )

    limits = Table(title="Limits per scope", title_justify="left")
    for column in ("scope", "max_running", "max_pending", "max_wait_s", "rate"):
        limits.add_column(column)
    for scope in ("global", "tenant", "run"):
        name = scope if scope == "global" else f"{scope} (each)"
        limits.add_row(*_limits_row(name, config.scope_limits(scope)))
    for name, spec in config.upstreams.items():
        limits.add_row(*_limits_row(f"upstream:{name}", spec.limits))
    for name, cost in config.cost_classes.items():
        limits.add_row(*_limits_row(f"cost_class:{name}", cost))
    console.print(limits)

    classes = Table(title="Work classes (priority order)", title_justify="left")
    for column in ("class", "share", "max_wait_s", "defer"):
        classes.add_column(column)
    for band in config.classes.values():
        defer = "yes" if band.defer else "no"
        classes.add_row(band.name, f"{band.share:.0%}", _num(band.max_wait_s), defer)
    console.print(classes)
    deferred = config.deferred
    console.print(
        f"Deferred work: requests up to {deferred.max_request_bytes} bytes, results up to "
        f"{deferred.max_result_bytes} bytes; at most {deferred.max_accepted_per_tenant} waiting "
        f"per tenant and {deferred.max_accepted_per_upstream} per upstream; callers poll every "
        f"{_num(deferred.poll_interval_s)} s"
    )

    upstreams = Table(title="Upstreams", title_justify="left")
    columns = ("name", "transport", "kind", "target", "not executed", "headers", "timeout_s")
    for column in (*columns, "retry"):
        upstreams.add_column(column)
    for spec in config.upstreams.values():
        upstreams.add_row(*_upstream_row(spec))
    console.print(upstreams)

    rules = Table(title="Tool rules (first match wins)", title_justify="left")
    columns = ("#", "match", "side_effect", "key", "cost_class", "retry_budget", "reject_as")
    for column in (*columns, "redact"):
        rules.add_column(column)
    for rule in config.tools:
        key = "default" if rule.key is None else _key(rule.key)
        side = "from annotations" if rule.side_effect is None else str(rule.side_effect).lower()
        rules.add_row(
            str(rule.index),
            rule.match,
            side,
            key,
            rule.cost_class or "-",
            _num(rule.retry_budget),
            rule.reject_as,
            ", ".join(rule.redact) or "-",
        )
    if not config.tools:
        rules.add_row("-", "(none: tool annotations, then built-in defaults)", *[""] * 6)
    console.print(rules)


def _upstream_row(spec: UpstreamSpec) -> list[str]:
    """One upstream: transport, model kind (HTTP only), the statuses that prove "not executed"
    (a side effect answered one of them is released, any other 5xx makes it unknown)."""
    target = spec.url or " ".join(spec.command)
    kind = spec.provider if spec.kind == "http" else "-"
    statuses = ", ".join(str(status) for status in sorted(not_executed_statuses(spec)))
    retry = f"{spec.retry.max_attempts} attempts, budget {spec.retry.budget_ratio:.0%}"
    headers = ", ".join(sorted(spec.headers)) or "-"  # names only: values are secrets
    return [spec.name, spec.kind, kind, target, statuses, headers, _num(spec.timeout_s), retry]


def _key(recipe: KeyRecipe) -> str:
    text = "fields: " + ", ".join(recipe.fields) if recipe.mode == "fields" else recipe.mode
    if recipe.window_s is not None:
        text += f", window {recipe.window_s:g} s"
    return text

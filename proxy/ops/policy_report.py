"""`interlock check-config`: print the effective policy as people read it (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from policies.model import Config, Limits

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
        f"{config.defaults.timeout_s:g} s, deadline {config.defaults.deadline_s:g} s"
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
    for column in ("class", "share", "max_wait_s"):
        classes.add_column(column)
    for band in config.classes.values():
        classes.add_row(band.name, f"{band.share:.0%}", _num(band.max_wait_s))
    console.print(classes)

    upstreams = Table(title="Upstreams", title_justify="left")
    for column in ("name", "kind", "target", "injected headers", "timeout_s", "retry"):
        upstreams.add_column(column)
    for spec in config.upstreams.values():
        target = spec.url or " ".join(spec.command)
        retry = f"{spec.retry.max_attempts} attempts, budget {spec.retry.budget_ratio:.0%}"
        headers = ", ".join(sorted(spec.headers)) or "-"  # names only: values are secrets
        upstreams.add_row(spec.name, spec.kind, target, headers, _num(spec.timeout_s), retry)
    console.print(upstreams)

    rules = Table(title="Tool rules (first match wins)", title_justify="left")
    for column in ("#", "match", "side_effect", "key", "cost_class", "retry_budget", "reject_as"):
        rules.add_column(column)
    for rule in config.tools:
        if rule.key is None:
            key = "default (derived)"
        elif rule.key.mode == "fields":
            key = "fields: " + ", ".join(rule.key.fields)
        else:
            key = rule.key.mode
        side = "from annotations" if rule.side_effect is None else str(rule.side_effect).lower()
        rules.add_row(
            str(rule.index),
            rule.match,
            side,
            key,
            rule.cost_class or "-",
            _num(rule.retry_budget),
            rule.reject_as,
        )
    if not config.tools:
        rules.add_row("-", "(none: tool annotations, then built-in defaults)", "", "", "", "", "")
    console.print(rules)

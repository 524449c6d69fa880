"""Shared by the MCP and HTTP proxies: upstream failures in the retry policy's words, and the
cooldown an upstream's 429/503/529 starts for every caller of that upstream."""

from __future__ import annotations

import time

from aiohttp import web
from opentelemetry.trace import Span

from policies.classify import Classification
from policies.retry import AttemptFailure, server_delay_s
from proxy.errors import (
    UpstreamAnswerTooLarge,
    UpstreamLost,
    UpstreamNotReached,
    UpstreamPressure,
    UpstreamRefused,
    UpstreamTimeout,
)
from proxy.state import SCHEDULER
from proxy.telemetry import metrics

__all__ = ["DEFAULT_COOLDOWN_S", "describe_failure", "retry_cap", "start_cooldown"]

DEFAULT_COOLDOWN_S = 1.0
"""Cooldown after a 429/503/529 that named no delay."""


def describe_failure(error: BaseException) -> AttemptFailure | None:
    """An upstream error in the retry policy's words (None: not a failure policy may retry).

    The delay an upstream asked for is left out on purpose: it is honoured by the cooldown it
    starts (the next attempt's admission waits it out if the caller's class may wait, or refuses
    with the remaining time). Sleeping it in the retry loop as well would hold a fail-fast caller
    for the whole cooldown. `x-should-retry` is kept: it is the upstream's verdict.
    """
    if isinstance(error, UpstreamNotReached):
        return AttemptFailure("not_sent")
    if isinstance(error, UpstreamPressure | UpstreamRefused):
        verdict = {k: v for k, v in error.headers.items() if k.lower() == "x-should-retry"}
        return AttemptFailure("answered", error.status, verdict)
    if isinstance(error, UpstreamTimeout):
        return AttemptFailure("timeout")
    if isinstance(error, UpstreamAnswerTooLarge):
        return None  # it answered: repeating the call would only bring the same answer again
    if isinstance(error, UpstreamLost):
        return AttemptFailure("lost")
    return None


def start_cooldown(
    app: web.Application, upstream: str, error: UpstreamPressure, span: Span
) -> None:
    """Put `upstream` into cooldown for as long as its answer asked (or a default second)."""
    delay = server_delay_s(error.headers, now=time.time())
    delay = DEFAULT_COOLDOWN_S if delay is None else delay
    if delay > 0:
        app[SCHEDULER].start_cooldown(upstream, delay)
        metrics.cooldown_started(upstream)
        span.set_attribute("interlock.cooldown_s", delay)


def retry_cap(policy: Classification) -> int | None:
    """A rule's `retry_budget` caps this call's attempts at 1 + that many (None: no rule cap)."""
    return None if policy.retry_budget is None else 1 + policy.retry_budget

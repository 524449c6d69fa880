"""Server-given delays and the "certainly not executed" predicate, from real header strings."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from multidict import CIMultiDict

from policies.model import RetrySettings, UpstreamSpec
from policies.retry import (
    AttemptFailure,
    backoff_s,
    certainly_not_executed,
    may_retry,
    not_executed_statuses,
    parse_duration_s,
    server_delay_s,
    should_retry_header,
)

NOW = datetime(2015, 10, 21, 7, 27, 30, tzinfo=UTC).timestamp()


def test_retry_after_delay_seconds() -> None:
    """`Retry-After: 120` asks for 120 seconds, whatever the header's case."""
    assert server_delay_s({"Retry-After": "120"}, now=NOW) == 120.0
    assert server_delay_s(CIMultiDict({"retry-after": " 7 "}), now=NOW) == 7.0


def test_retry_after_http_date() -> None:
    """`Retry-After` as an HTTP-date gives the seconds from now until then; a past date gives 0."""
    assert server_delay_s({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, now=NOW) == 30.0
    assert server_delay_s({"Retry-After": "Wed, 21 Oct 2015 07:00:00 GMT"}, now=NOW) == 0.0


def test_retry_after_ms_wins_over_retry_after() -> None:
    """`retry-after-ms` is the more precise header and takes precedence."""
    headers = {"retry-after-ms": "1500", "Retry-After": "2"}
    assert server_delay_s(headers, now=NOW) == 1.5


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("6m0s", 360.0), ("1s", 1.0), ("120ms", 0.12), ("2m59.56s", 179.56), ("1h2m3s", 3723.0)],
)
def test_openai_durations(text: str, seconds: float) -> None:
    """OpenAI's Go-style reset durations parse to seconds."""
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "6x", "1s2", "ms", "1.5"])
def test_bad_durations_are_ignored(text: str) -> None:
    """Malformed durations are not guessed at."""
    assert parse_duration_s(text) is None


def test_openai_reset_of_the_exhausted_limit() -> None:
    """With OpenAI headers, the reset of the limit whose remaining count is 0 is the delay."""
    headers = {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "6m0s",
        "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "120ms",
    }
    assert server_delay_s(headers, now=NOW) == pytest.approx(0.12)


def test_openai_reset_without_remaining_takes_the_longest() -> None:
    """When no header says which limit ran out, the longest reset is the safe delay."""
    headers = {"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "6m0s"}
    assert server_delay_s(headers, now=NOW) == 360.0


def test_anthropic_rfc3339_resets() -> None:
    """Anthropic's RFC 3339 reset times give the seconds until that instant."""
    headers = {
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2015-10-21T07:28:00Z",
        "anthropic-ratelimit-tokens-remaining": "8000",
        "anthropic-ratelimit-tokens-reset": "2015-10-21T07:29:00Z",
        "anthropic-ratelimit-input-tokens-reset": "2015-10-21T07:27:30.5+00:00",
    }
    assert server_delay_s(headers, now=NOW) == 30.0


def test_retry_after_beats_provider_resets_and_garbage_is_ignored() -> None:
    """Anthropic also sends retry-after; it wins. Unparseable values fall through to the next."""
    headers = {"retry-after": "4", "anthropic-ratelimit-requests-reset": "2015-10-21T07:28:00Z"}
    assert server_delay_s(headers, now=NOW) == 4.0
    garbage = {"Retry-After": "soon", "x-ratelimit-reset-requests": "2s"}
    assert server_delay_s(garbage, now=NOW) == 2.0
    assert server_delay_s({"Retry-After": "soon"}, now=NOW) is None
    assert server_delay_s({}, now=NOW) is None


def test_x_should_retry() -> None:
    """`x-should-retry` reads as true, false, or absent."""
    assert should_retry_header({"X-Should-Retry": "true"}) is True
    assert should_retry_header({"x-should-retry": "false"}) is False
    assert should_retry_header({"x-should-retry": "maybe"}) is None
    assert should_retry_header({}) is None


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (AttemptFailure("not_sent"), True),
        (AttemptFailure("answered", 429), True),
        (AttemptFailure("answered", 503), False),
        (AttemptFailure("answered", 529), False),
        (AttemptFailure("answered", 500), False),
        (AttemptFailure("answered", 502), False),
        (AttemptFailure("timeout"), False),
        (AttemptFailure("lost"), False),
    ],
)
def test_certainly_not_executed(failure: AttemptFailure, expected: bool) -> None:
    """By default only nothing-sent and a 429 count as certainly not executed."""
    assert certainly_not_executed(failure) is expected


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (UpstreamSpec("gw", "http", url="http://127.0.0.1:9"), {429}),
        (UpstreamSpec("ai", "http", url="http://127.0.0.1:9", provider="openai"), {429, 503, 529}),
        (
            UpstreamSpec("c", "http", url="http://127.0.0.1:9", provider="anthropic"),
            {429, 503, 529},
        ),
        (
            UpstreamSpec("gw", "http", url="http://127.0.0.1:9", not_executed_statuses={502}),
            {429, 502},
        ),
        (UpstreamSpec("mail", "mcp_http", url="http://127.0.0.1:9/mcp"), {429}),
    ],
)
def test_not_executed_statuses_of_an_upstream(spec: UpstreamSpec, expected: set[int]) -> None:
    """429 from anyone; 503/529 only from a declared model provider; plus the upstream's own."""
    assert not_executed_statuses(spec) == expected


def test_a_503_releases_a_side_effect_only_where_it_proves_nothing_ran() -> None:
    """A 503 to a side-effecting call is retried for a model provider, never for a gateway."""
    failure = AttemptFailure("answered", 503)
    provider = UpstreamSpec("ai", "http", url="http://127.0.0.1:9", provider="openai")
    gateway = UpstreamSpec("gw", "http", url="http://127.0.0.1:9")
    assert may_retry(failure, side_effect=True, not_executed=not_executed_statuses(provider))
    assert not may_retry(failure, side_effect=True, not_executed=not_executed_statuses(gateway))
    assert may_retry(failure, side_effect=False, not_executed=not_executed_statuses(gateway))


@pytest.mark.parametrize(
    ("failure", "side_effect", "expected"),
    [
        (AttemptFailure("not_sent"), True, True),
        (AttemptFailure("answered", 429), True, True),
        (AttemptFailure("timeout"), True, False),
        (AttemptFailure("lost"), True, False),
        (AttemptFailure("answered", 500, {"x-should-retry": "true"}), True, False),
        (AttemptFailure("answered", 429, {"x-should-retry": "false"}), True, False),
        (AttemptFailure("timeout"), False, True),
        (AttemptFailure("lost"), False, True),
        (AttemptFailure("answered", 502), False, True),
        (AttemptFailure("answered", 400), False, False),
        (AttemptFailure("answered", 400, {"x-should-retry": "true"}), False, True),
        (AttemptFailure("answered", 429, {"x-should-retry": "false"}), False, False),
    ],
)
def test_may_retry(failure: AttemptFailure, side_effect: bool, expected: bool) -> None:
    """Side effects retry only when not executed; read-only calls on transient failures."""
    assert may_retry(failure, side_effect=side_effect) is expected


def test_backoff_is_full_jitter_exponential_and_capped() -> None:
    """The jitter ceiling doubles per attempt up to max_delay_s; the server's delay is a floor."""
    settings = RetrySettings(base_delay_s=0.25, max_delay_s=2.0)
    assert [backoff_s(n, settings, random_unit=lambda: 1.0) for n in (1, 2, 3, 4, 5)] == [
        0.25,
        0.5,
        1.0,
        2.0,
        2.0,
    ]
    assert backoff_s(3, settings, random_unit=lambda: 0.5) == 0.5
    assert backoff_s(1, settings, random_unit=lambda: 0.0) == 0.0
    assert backoff_s(1, settings, server_delay=30.0, random_unit=lambda: 1.0) == 30.0
    assert backoff_s(10_000, settings, random_unit=lambda: 1.0) == 2.0

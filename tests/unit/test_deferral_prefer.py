"""`Prefer: respond-async` (RFC 7240): recognised among other preferences, and taken out of the
header a deferred HTTP call is later sent with (the upstream must answer it itself)."""

from __future__ import annotations

import pytest

from policies.deferral import prefers_async, without_respond_async


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["respond-async"], True),
        (["Respond-Async"], True),
        (["return=minimal, respond-async; x=1"], True),
        (["wait=10", " respond-async=yes "], True),
        (["respond-asynchronously"], False),
        (["return=respond-async"], False),
        ([], False),
    ],
)
def test_respond_async_is_a_preference_token(values: list[str], expected: bool) -> None:
    assert prefers_async(values) is expected


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("respond-async", ""),
        ("return=minimal, respond-async; x=1, wait=5", "return=minimal, wait=5"),
        ("RESPOND-ASYNC,, handling=strict", "handling=strict"),
        ("return=respond-async", "return=respond-async"),
    ],
)
def test_respond_async_is_taken_out_and_the_rest_kept(value: str, kept: str) -> None:
    assert without_respond_async(value) == kept

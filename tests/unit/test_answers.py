"""The caller-facing answers: codes, statuses, Retry-After, and the three renderings."""

from __future__ import annotations

from policies import answers


def test_refusal_is_429_with_a_whole_second_retry_after_never_zero():
    """A refusal carries retry_after_s > 0 even for a cooldown about to end, and Retry-After ≥ 1."""
    answer = answers.refused("cooldown", "upstream:mail", 0.0004, idempotency_key="k")
    assert answer.code == -32050
    assert answer.http_status == 429
    assert answer.data["retry_after_s"] > 0
    assert answer.retry_after_header == "1"
    assert answers.refused("overloaded", "global", 2.2).retry_after_header == "3"


def test_upstream_down_and_shutdown_are_503():
    """Cooldown past the deadline (upstream down) and shutting down answer 503."""
    assert answers.refused("cooldown", "upstream:m", 30, upstream_down=True).http_status == 503
    assert answers.refused("shutting_down", "global", 1).http_status == 503


def test_jsonrpc_error_carries_reason_and_applicable_fields():
    """data always has reason; state and entry_id where they apply."""
    error = answers.needs_reconciliation("k", "e1", "unknown").jsonrpc_error(7)
    assert error["id"] == 7
    assert error["error"]["code"] == -32052
    assert error["error"]["data"] == {
        "reason": "needs_reconciliation",
        "idempotency_key": "k",
        "state": "unknown",
        "entry_id": "e1",
    }


def test_tool_error_rendering_for_both_eras():
    """reject_as tool_error: isError result, one sentence, the object as structuredContent."""
    answer = answers.in_progress("k", "e1", "running")
    legacy = answer.tool_error_result(modern=False)
    modern = answer.tool_error_result(modern=True)
    assert legacy["isError"] is True
    assert legacy["structuredContent"]["reason"] == "in_progress"
    assert "resultType" not in legacy
    assert modern["resultType"] == "complete"


def test_http_body_uses_the_openai_style_envelope():
    """HTTP errors: {"error": {type, message, reason, retry_after_s, ...}}."""
    body = answers.refused("budget", "tenant:a", 30).http_body()
    assert body["error"]["type"] == "rate_limit_error"
    assert body["error"]["reason"] == "budget"
    assert body["error"]["retry_after_s"] == 30
    assert answers.outcome_unknown("k", "e", "timed out").http_status == 504
    assert answers.key_mismatch("k").http_status == 422
    assert answers.ledger_unavailable("disk full").http_status == 503


def test_outcome_not_retained_is_a_409_naming_the_state_and_entry():
    """A finished entry without its outcome answers -32056 / 409 with its state, never a 2xx."""
    answer = answers.outcome_not_retained("k", "e1", "failed")
    assert (answer.code, answer.http_status) == (-32056, 409)
    assert answer.data == {
        "reason": "outcome_not_retained",
        "idempotency_key": "k",
        "state": "failed",
        "entry_id": "e1",
    }

"""Unit tests of token usage extraction from OpenAI and Anthropic bodies and streams."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.http import usage as usage_module
from proxy.http.usage import StreamUsage, Usage, usage_from_json


def sse(*events: tuple[str | None, object]) -> bytes:
    out = []
    for event, data in events:
        if event:
            out.append(f"event: {event}\n")
        text = data if isinstance(data, str) else json.dumps(data)
        out.append(f"data: {text}\n\n")
    return "".join(out).encode()


OPENAI_CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "gpt-4o-mini-2024",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
}
ANTHROPIC_MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "model": "claude-sonnet",
    "content": [{"type": "text", "text": "hi"}],
    "usage": {
        "input_tokens": 10,
        "output_tokens": 7,
        "cache_creation_input_tokens": 3,
        "cache_read_input_tokens": 2,
    },
}
OPENAI_RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "model": "gpt-4.1",
    "usage": {"input_tokens": 8, "output_tokens": 4, "total_tokens": 12},
}


def test_openai_chat_json() -> None:
    """prompt/completion tokens of a Chat Completions body are read with the model."""
    assert usage_from_json(json.dumps(OPENAI_CHAT).encode()) == Usage(12, 5, "gpt-4o-mini-2024")


def test_anthropic_message_json_counts_cache_tokens_as_input() -> None:
    """Anthropic's cache creation and cache read tokens count as input tokens."""
    usage = usage_from_json(json.dumps(ANTHROPIC_MESSAGE).encode())
    assert usage == Usage(15, 7, "claude-sonnet")
    assert usage.total_tokens == 22


def test_openai_responses_json() -> None:
    """input/output tokens of a Responses API body are read."""
    assert usage_from_json(json.dumps(OPENAI_RESPONSE).encode()) == Usage(8, 4, "gpt-4.1")


def test_embeddings_json_has_input_only() -> None:
    """An embeddings body with prompt tokens only gives zero output tokens."""
    body = {"object": "list", "model": "emb", "usage": {"prompt_tokens": 9, "total_tokens": 9}}
    assert usage_from_json(json.dumps(body).encode()) == Usage(9, 0, "emb")


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[1, 2]", b'{"usage": null}', b'{"usage": {"prompt_tokens": "12"}}', b"\xff"],
)
def test_bodies_without_usable_usage_give_none(body: bytes) -> None:
    """Malformed or usage-less bodies give None instead of raising."""
    assert usage_from_json(body) is None


def test_openai_chat_stream_final_chunk() -> None:
    """The usage of an OpenAI stream's final chunk is read, whatever the chunk boundaries."""
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "gpt-x", "choices": []}
    stream = sse(
        (None, {**chunk, "choices": [{"delta": {"content": "he"}}], "usage": None}),
        (None, {**chunk, "choices": [{"delta": {"content": "llo"}}], "usage": None}),
        (None, {**chunk, "usage": {"prompt_tokens": 20, "completion_tokens": 2}}),
        (None, "[DONE]"),
    )
    for size in (1, 7, len(stream)):
        reader = StreamUsage()
        for i in range(0, len(stream), size):
            reader.feed(stream[i : i + size])
        assert reader.result() == Usage(20, 2, "gpt-x")


def test_openai_stream_without_usage_gives_none() -> None:
    """A stream whose caller did not ask for usage yields no usage (and no error)."""
    reader = StreamUsage()
    reader.feed(sse((None, {"model": "gpt-x", "choices": [], "usage": None}), (None, "[DONE]")))
    assert reader.result() is None
    assert reader.model == "gpt-x"


def test_anthropic_stream_takes_input_from_start_and_cumulative_output() -> None:
    """Anthropic's message_start input and the last message_delta output are combined."""
    stream = sse(
        (
            "message_start",
            {
                "type": "message_start",
                "message": {"model": "claude-x", "usage": {"input_tokens": 25, "output_tokens": 1}},
            },
        ),
        ("ping", {"type": "ping"}),
        ("content_block_delta", {"type": "content_block_delta", "delta": {"text": "hi"}}),
        ("message_delta", {"type": "message_delta", "usage": {"output_tokens": 6}}),
        ("message_delta", {"type": "message_delta", "usage": {"output_tokens": 11}}),
        ("message_stop", {"type": "message_stop"}),
    )
    reader = StreamUsage()
    reader.feed(stream)
    assert reader.result() == Usage(25, 11, "claude-x")


def test_openai_responses_stream_completed_event() -> None:
    """The usage inside `response.completed` of a Responses stream is read."""
    stream = sse(
        ("response.created", {"type": "response.created", "response": {"model": "gpt-4.1"}}),
        ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "x"}),
        (
            "response.completed",
            {
                "type": "response.completed",
                "response": {**OPENAI_RESPONSE, "usage": {"input_tokens": 30, "output_tokens": 3}},
            },
        ),
    )
    reader = StreamUsage()
    reader.feed(stream)
    assert reader.result() == Usage(30, 3, "gpt-4.1")


def test_crlf_lines_and_unterminated_last_line() -> None:
    """CRLF line endings and a final line without a newline are still read."""
    reader = StreamUsage()
    reader.feed(b'data: {"model": "m"}\r\n\r\n')
    reader.feed(b'data: {"usage": {"prompt_tokens": 1, "completion_tokens": 2}}')
    assert reader.result() == Usage(1, 2, "m")


def test_overlong_line_is_dropped_not_buffered() -> None:
    """A line longer than the cap is skipped, and later lines are still read."""
    reader = StreamUsage()
    reader.feed(b'data: {"model": "m"}\n\n')
    reader.feed(b"data: " + b"x" * (1 << 21))
    reader.feed(b"\n\n")
    reader.feed(b'data: {"usage": {"prompt_tokens": 4, "completion_tokens": 1}}\n\n')
    assert reader.result() == Usage(4, 1, "m")


def test_usage_line_before_an_overlong_line_in_one_chunk_is_read() -> None:
    """An overlong unfinished line drops itself only, not the complete line before it."""
    reader = StreamUsage()
    reader.feed(b'data: {"model": "m"}\n\n')
    usage = b'data: {"usage": {"prompt_tokens": 4, "completion_tokens": 1}}\n'
    reader.feed(usage + b"data: " + b"x" * (1 << 21))
    reader.feed(b"\n\n")
    assert reader.result() == Usage(4, 1, "m")


def test_chunks_without_usage_keep_their_unfinished_line() -> None:
    """Chunks skipped whole (no usage in them) still carry an unfinished line into the next."""
    reader = StreamUsage()
    reader.feed(b'data: {"model": "m", "choices": []}\n\ndata: {"choices": [], "us')
    reader.feed(b'age": {"prompt_tokens": 9, ')
    reader.feed(b'"completion_tokens": 3}}\n\ndata: [DONE]\n\n')
    assert reader.result() == Usage(9, 3, "m")


_CUT_STREAM = (
    b'data: {"model": "m", "choices": []}\r\n\r\n'
    + b'data: {"choices": [{"delta": {"content": "'
    + b"y" * 200
    + b'"}}]}\n\n'
    + b'data: {"usage": {"prompt_tokens": 7, "completion_tokens": 2}}\n\n'
    + b"data: [DONE]\n\n"
)


@given(st.lists(st.integers(min_value=0, max_value=len(_CUT_STREAM)), max_size=16))
def test_usage_does_not_depend_on_chunking_even_past_the_line_cap(cuts: list[int]) -> None:
    """However the stream is cut (a line longer than the cap in it), the same usage is read."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(usage_module, "_MAX_LINE_BYTES", 64)
        reader = StreamUsage()
        bounds = [0, *sorted(cuts), len(_CUT_STREAM)]
        for start, end in itertools.pairwise(bounds):
            reader.feed(_CUT_STREAM[start:end])
        assert reader.result() == Usage(7, 2, "m")

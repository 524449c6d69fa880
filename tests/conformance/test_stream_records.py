"""What the proxy keeps to resume event streams is found by event id and stays bounded."""

from __future__ import annotations

from proxy.mcp.transport.resumption import SessionStreams


def test_a_stream_is_found_by_any_of_its_event_ids_and_resumes_after_it() -> None:
    """`find` names the stream that carried the id and the position right after that event."""
    streams = SessionStreams()
    record = streams.open("s1")
    record.append("up-1", b"id: up-1\r\ndata: \r\n\r\n")
    minted = record.mint_id()
    record.append(minted, b"data: {}\r\n\r\n")
    assert streams.find("s1", "up-1") == (record, 1)
    assert streams.find("s1", minted) == (record, 2)
    assert streams.find("s2", "up-1") is None
    assert streams.find("s1", "never-sent") is None


def test_minted_ids_are_unique_across_streams_and_sessions() -> None:
    """Ids the proxy mints never repeat, so a Last-Event-ID names one stream only."""
    streams = SessionStreams()
    ids = [streams.open(s).mint_id() for s in ("a", "a", "b") for _ in range(3)]
    assert len(set(ids)) == len(ids)


def test_a_session_keeps_its_latest_streams_only() -> None:
    """Past `max_streams`, a session's oldest stream is forgotten."""
    streams = SessionStreams(max_streams=2)
    records = [streams.open("s") for _ in range(3)]
    for number, record in enumerate(records):
        record.append(f"e{number}", b"x")
    assert streams.find("s", "e0") is None
    assert streams.find("s", "e2") == (records[2], 1)


def test_all_sessions_together_stay_under_the_total_byte_cap() -> None:
    """Past `max_total_bytes` the least recently used sessions are forgotten."""
    streams = SessionStreams(max_bytes=100, max_total_bytes=250)
    for session in ("a", "b", "c", "d"):
        streams.open(session).append(f"{session}-1", b"x" * 100)
    assert streams.find("a", "a-1") is None
    assert streams.find("d", "d-1") is not None


def test_an_ended_session_keeps_nothing() -> None:
    """`forget` drops a session's records (DELETE, or the upstream said the session is gone)."""
    streams = SessionStreams()
    streams.open("s").append("e1", b"x")
    streams.forget("s")
    assert streams.find("s", "e1") is None


def test_a_live_stream_keeps_only_its_latest_bytes() -> None:
    """One stream that never ends (a tool reporting progress for hours) is bounded by the
    session's `max_bytes` while it is written, not only once a newer stream opens: the oldest
    frames are forgotten, resuming after a forgotten id is refused (`find` is None), and
    resuming after a kept one gives exactly the frames that followed it."""
    streams = SessionStreams(max_bytes=1000)
    record = streams.open("s")
    for number in range(10_000):
        record.append(f"e{number}", b"%05d" % number + b"x" * 95)
    assert record.size <= 1250
    assert streams.find("s", "e0") is None
    found = streams.find("s", "e9990")
    assert found is not None
    assert found[0] is record
    assert [frame[:5] for _, frame in record.since(found[1]) or []] == [
        b"%05d" % n for n in range(9991, 10_000)
    ]
    assert record.since(0) is None  # a reader that fell behind what is kept: those are gone

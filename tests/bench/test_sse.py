"""The server-sent-events decoder."""

from __future__ import annotations

from relaykv.bench.sse import SSEDecoder


def test_events_split_anywhere_reassemble() -> None:
    stream = 'data: {"a": "é"}\n\n: ping\n\ndata: [DONE]\n\n'.encode()
    for cut in range(len(stream)):
        dec = SSEDecoder()
        events = dec.feed(stream[:cut]) + dec.feed(stream[cut:]) + dec.close()
        assert events == ['{"a": "é"}', "[DONE]"], cut


def test_crlf_multiline_data_and_other_fields() -> None:
    dec = SSEDecoder()
    events = dec.feed(b"event: x\r\nid: 3\r\ndata: one\r\ndata:two\r\n\r\n")
    assert events == ["one\ntwo"]


def test_last_event_without_blank_line_is_flushed_on_close() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: tail") == []
    assert dec.close() == ["tail"]

"""Server-sent events: the frames servers write, the decoder clients read them with."""

from __future__ import annotations

import json

from relaykv.common.messages.api_errors import APIError
from relaykv.common.messages.sse import DONE, SSEDecoder, sse_error, sse_event


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


def test_frames_are_compact_utf8_json_and_errors_are_openai_bodies() -> None:
    assert sse_event({"text": "é", "n": [1, 2]}) == 'data: {"text":"é","n":[1,2]}\n\n'.encode()
    assert DONE == b"data: [DONE]\n\n"
    body = json.loads(SSEDecoder().feed(sse_error(APIError(400, "bad", "n")))[0])
    assert body["error"]["message"] == "bad" and body["error"]["param"] == "n"
    relayed = json.loads(SSEDecoder().feed(sse_error("engine ended early", 502))[0])
    assert relayed["error"] == {
        "message": "engine ended early", "type": "server_error", "param": None, "code": None
    }
    crashed = json.loads(SSEDecoder().feed(sse_error(RuntimeError("boom")))[0])
    assert crashed["error"]["message"] == "RuntimeError: boom"
    assert crashed["error"]["type"] == "server_error"

from servelab.targets.sse import SSEDecoder


def test_events_split_anywhere_across_reads_are_reassembled():
    stream = b'data: {"a":1}\n\ndata: {"b":2}\r\n\r\n: ping\n\nevent: x\ndata: [DONE]\n\n'
    for cut in range(1, len(stream)):
        dec = SSEDecoder()
        events = dec.feed(stream[:cut]) + dec.feed(stream[cut:]) + dec.close()
        assert events == [b'{"a":1}', b'{"b":2}', b"[DONE]"], cut


def test_multiline_data_is_joined_and_unterminated_last_event_kept():
    dec = SSEDecoder()
    assert dec.feed(b"data: one\ndata:two\n\ndata: tail") == [b"one\ntwo"]
    assert dec.close() == [b"tail"]
    assert dec.close() == []

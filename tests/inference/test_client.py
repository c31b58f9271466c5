"""SGLangClient without a working server behind it, and SGLang's response variants."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import h11
import pytest

from common.services import free_port
from inference.client import GenerateResult, InferenceError, SGLangClient


async def test_connection_errors_are_retried_with_backoff_then_raised():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    async with SGLangClient(url, retries=2, backoff_s=0.2, timeout_s=5) as c:
        t0 = time.monotonic()
        with pytest.raises(InferenceError) as ei:
            await c.generate([1, 2], {"max_new_tokens": 1})
        took = time.monotonic() - t0
        assert ei.value.status is None and "ConnectError" in ei.value.message
        assert 0.5 <= took < 5  # two backoffs (0.2 s, 0.4 s), bounded
        assert await c.health() is False
        with pytest.raises(InferenceError, match="ConnectError"):  # not sent: an update is retried too
            await c.update_weights_from_distributed(["w"], ["float32"], [[1]])


class HangUp:
    """A loopback server that reads each request and closes the connection without an answer."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                self.requests.append(self._read_request(conn))

    @staticmethod
    def _read_request(conn: socket.socket) -> str:
        """The request line, after reading the whole request (h11): closing with unread bytes
        sends a reset, which the client sees as ReadError instead of a clean end of stream
        (RemoteProtocolError) — the flake CI once hit."""
        parser, line = h11.Connection(h11.SERVER), ""
        while True:
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError:  # the client went away mid-request
                return line
            if event is h11.NEED_DATA:
                parser.receive_data(conn.recv(65536))  # b"" (the peer closed) ends the message
            elif isinstance(event, h11.Request):
                line = f"{event.method.decode()} {event.target.decode()} HTTP/{event.http_version.decode()}"
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return line

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def hang_up() -> Iterator[HangUp]:
    s = HangUp()
    yield s
    s.close()


async def test_sent_without_answer_generate_is_retried_a_weight_update_is_not(hang_up):
    async with SGLangClient(hang_up.url, retries=2, backoff_s=0.05, timeout_s=5) as c:
        with pytest.raises(InferenceError) as ei:
            await c.generate([1, 2], {"max_new_tokens": 1})
        assert ei.value.status is None and "RemoteProtocolError" in ei.value.message
        assert hang_up.requests == ["POST /generate HTTP/1.1"] * 3  # harmless to repeat
        hang_up.requests.clear()
        with pytest.raises(InferenceError, match="RemoteProtocolError"):
            await c.update_weights_from_distributed(["w"], ["float32"], [[1]])
        with pytest.raises(InferenceError, match="RemoteProtocolError"):
            await c.init_weights_update_group("127.0.0.1", 1, 1, 2)
        assert hang_up.requests == ["POST /update_weights_from_distributed HTTP/1.1",
                                    "POST /init_weights_update_group HTTP/1.1"]  # once each


def test_result_takes_ids_from_output_token_logprobs_when_output_ids_absent():
    raw = {"text": "ab", "meta_info": {
        "id": "x", "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 3,
        "completion_tokens": 2, "weight_version": "7", "e2e_latency": 0.5,
        "output_token_logprobs": [[-0.5, 11, None], [-1.25, 2, None]]}}
    r = GenerateResult.from_response(raw)
    assert r.output_ids == [11, 2] and r.output_logprobs == [-0.5, -1.25]
    assert r.weight_version == "7" and r.finish_reason == {"type": "stop", "matched": 2}
    assert (r.prompt_tokens, r.completion_tokens, r.e2e_latency, r.text) == (3, 2, 0.5, "ab")
    r2 = GenerateResult.from_response({**raw, "output_ids": [11, 2]})
    assert r2.output_ids == [11, 2]
    r3 = GenerateResult.from_response({"text": "", "output_ids": [5], "meta_info": {"finish_reason": None}})
    assert r3.output_ids == [5] and r3.output_logprobs == [] and r3.finish_reason == {}

"""An agent's command runs at most once. When envd (or the pool) dies after a request reached
it, the client must not send the exec again: the first copy may still be running in the
container (a SIGKILLed envd leaves its docker exec behind), and a second would apply the
agent's action twice. A real HTTP peer on loopback reads each request, counts it and drops the
connection without answering (what a SIGKILLed server does)."""

from __future__ import annotations

import asyncio

import pytest

from envd.client import EnvdClient, EnvError


@pytest.fixture
async def dropping_server():
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        seen.append(head.split(b" ")[1])
        writer.close()                      # no answer at all

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", seen
    server.close()
    await server.wait_closed()


@pytest.mark.parametrize("side", ["pool", "node"])
async def test_exec_is_never_sent_twice(dropping_server, side):
    url, seen = dropping_server
    client = EnvdClient.pool(url, "tok") if side == "pool" else EnvdClient.node(url, "tok")
    try:
        with pytest.raises(EnvError):
            await client.exec("target", "echo once >> log", timeout=5)
        assert len(seen) == 1, seen
        # reads are still sent again when the connection drops before an answer
        with pytest.raises(EnvError):
            await client.heartbeat("target")
        assert len(seen) > 2, seen
    finally:
        await client.aclose()

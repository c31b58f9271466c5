"""Weight updates on CPU server subprocesses: from disk, and distributed with this test process as
rank 0 of a gloo group (weight_sync's trainer side; SGLang's rank layout), including a server
acting as tensor-parallel size 2 beside a tp-1 server in one group."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import torch
from fixtures_inference import CpuServerHandle, start_cpu_server

from inference.client import SGLangClient
from inference.dist_group import first_difference
from inference.tiny_model import init_tiny
from inference.weights import checksum, named_weights, read_safetensors_dir
from weight_sync.update_group import UpdateGroup, session

PROMPT = [1, 846, 1045, 97, 300, 12]
GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory) -> Iterator[CpuServerHandle]:
    h = start_cpu_server(tiny_model_dir, log_dir=tmp_path_factory.mktemp("weights-server"))
    yield h
    h.stop()


@pytest.fixture(scope="module")
def other_model(tmp_path_factory):
    return init_tiny(tmp_path_factory.mktemp("other-model"), seed=7)


@pytest.fixture
async def client(server) -> AsyncIterator[SGLangClient]:
    async with SGLangClient(server.url, api_key=server.api_key, timeout_s=120, retries=1) as c:
        yield c


async def server_checksum(server) -> str:
    async with httpx.AsyncClient(base_url=server.url, timeout=30,
                                 headers={"Authorization": f"Bearer {server.api_key}"}) as http:
        return (await http.get("/swarl/weights_checksum")).json()["sha256"]


async def test_update_from_disk_changes_outputs_and_version(client, server, tiny_model_dir, other_model, tmp_path):
    base_sum = checksum(read_safetensors_dir(tiny_model_dir))
    assert await server_checksum(server) == base_sum
    before = await client.generate(PROMPT, GREEDY)

    bad = await client.update_weights_from_disk(str(tmp_path / "missing"), weight_version="9")
    assert bad["success"] is False and "does not exist" in bad["message"]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "model.safetensors").write_bytes(b"not safetensors")
    bad = await client.update_weights_from_disk(str(tmp_path / "broken"), weight_version="9")
    assert bad["success"] is False and "safetensors" in bad["message"]
    assert await client.get_weight_version() == "0" and await server_checksum(server) == base_sum

    ok = await client.update_weights_from_disk(str(other_model), weight_version="1")
    assert ok["success"] is True, ok
    after = await client.generate(PROMPT, GREEDY)
    assert after.weight_version == "1" and await client.get_weight_version() == "1"
    assert after.output_ids != before.output_ids
    assert await server_checksum(server) == checksum(read_safetensors_dir(other_model))

    ok = await client.update_weights_from_disk(str(tiny_model_dir), weight_version="2")
    assert ok["success"] is True
    assert (await client.generate(PROMPT, GREEDY)).output_ids == before.output_ids


async def _distributed_update(clients: list[SGLangClient], tp_sizes: list[int], tensors: dict[str, torch.Tensor],
                              group: str, version: int, bucket_bytes: int = 1 << 20) -> None:
    """Rank 0 of a group over `clients`, in a weight-update session on each: send every tensor
    (several buckets), then destroy the group."""
    async with contextlib.AsyncExitStack() as stack:
        for c in clients:
            await stack.enter_async_context(session(c, c.url, 60))
        g = UpdateGroup(name=group, members=[c.url for c in clients], clients=clients, tp_sizes=tp_sizes,
                        backend="gloo", timeout_s=90)
        await asyncio.wait_for(g.connect(), 120)
        try:
            await asyncio.wait_for(g.send(tensors.items(), version, bucket_bytes), 120)
        finally:
            await g.close()


async def test_update_from_distributed_is_bit_identical(client, server, tiny_model_dir, other_model):
    from transformers import AutoModelForCausalLM

    trainer = AutoModelForCausalLM.from_pretrained(other_model, dtype=torch.float32)
    tensors = named_weights(trainer)
    with torch.no_grad():  # weights no file holds: a trainer's step
        for t in tensors.values():
            t.add_(0.001)
    await _distributed_update([client], [1], tensors, "weight_update_group", 3)
    assert await server_checksum(server) == checksum(tensors)
    out = await client.generate(PROMPT, GREEDY)
    assert out.weight_version == "3"

    # a second group over the server's life (same name, after destroy) works as well
    base = read_safetensors_dir(tiny_model_dir)
    await _distributed_update([client], [1], base, "weight_update_group", 4)
    assert await server_checksum(server) == checksum(base)
    assert await client.get_weight_version() == "4"


async def test_distributed_update_with_wrong_names_keeps_weights(client, server):
    before = await server_checksum(server)
    with pytest.raises(RuntimeError, match="no_such"):
        await _distributed_update([client], [1], {"model.no_such.weight": torch.ones(3)}, "bad_group", 99)
    assert await server_checksum(server) == before and await client.get_weight_version() != "99"
    # outside a session it is refused before anything is received, as by SGLang 0.5.23
    outside = await client.update_weights_from_distributed(["x"], ["float32"], [[1]], group_name="nope")
    assert outside == {"success": False, "message": "update_weights_from_distributed must run between "
                       "begin_weight_update() and end_weight_update()"}
    async with session(client, "cpu", 10):
        missing = await client.update_weights_from_distributed(["x"], ["float32"], [[1]], group_name="nope")
    assert missing["success"] is False and "nope" in missing["message"]


@pytest.fixture(scope="module")
def tp2_server(tiny_model_dir, tmp_path_factory) -> Iterator[CpuServerHandle]:
    h = start_cpu_server(tiny_model_dir, tp_size=2, log_dir=tmp_path_factory.mktemp("tp2-server"))
    yield h
    h.stop()


async def test_a_tp2_and_a_tp1_server_in_one_group_receive_the_same_weights(client, server, tp2_server,
                                                                            other_model):
    from transformers import AutoModelForCausalLM

    trainer = AutoModelForCausalLM.from_pretrained(other_model, dtype=torch.float32)
    tensors = named_weights(trainer)
    with torch.no_grad():
        for t in tensors.values():
            t.mul_(1.01)
    async with SGLangClient(tp2_server.url, api_key=tp2_server.api_key, timeout_s=120, retries=1) as tp2:
        # world_size 4: trainer 0, the tp-2 server at ranks 1..2, the tp-1 server at rank 3
        await _distributed_update([tp2, client], [2, 1], tensors, "mixed_tp_group", 11)
        assert await server_checksum(tp2_server) == checksum(tensors) == await server_checksum(server)
        assert await tp2.get_weight_version() == "11" == await client.get_weight_version()
        assert "weight_group_joined group=mixed_tp_group ranks=1..2 world_size=4" in tp2_server.log()
        assert (await tp2.get_server_info())["tp_size"] == 2

        # the same servers the other way round: the tp-2 server at ranks 2..3
        base = read_safetensors_dir(other_model)
        await _distributed_update([client, tp2], [1, 2], base, "mixed_tp_group", 12)
        assert await server_checksum(tp2_server) == checksum(base) == await server_checksum(server)
        assert "weight_group_joined group=mixed_tp_group ranks=2..3 world_size=4" in tp2_server.log()


async def test_a_refused_join_ends_rank_0s_join_at_once(tp2_server):
    from weight_sync.protocols import ServerRefused

    async with SGLangClient(tp2_server.url, api_key=tp2_server.api_key, retries=0) as c:
        # a trainer that takes the tp-2 server for tp 1: the server refuses while rank 0 waits for it
        g = UpdateGroup(name="wrong-size", members=["tp2"], clients=[c], tp_sizes=[1], backend="gloo",
                        timeout_s=5)
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(ServerRefused, match="exceeds world_size 2"):
            await g.connect()
        assert asyncio.get_running_loop().time() - t0 < 3  # not rank 0's join timeout
        assert g.broken and g.pg is None


@pytest.mark.parametrize(("rank_offset", "world_size", "why"), [
    (0, 3, "rank_offset 0 must be at least 1 (rank 0 is the trainer)"),
    (2, 3, "rank_offset 2 + tp_size 2 exceeds world_size 3: this server's ranks 2..3 must lie in 1..2"),
    (1, 2, "rank_offset 1 + tp_size 2 exceeds world_size 2"),  # a trainer that took it for tp 1
])
async def test_ranks_that_do_not_fit_the_group_are_refused(tp2_server, rank_offset, world_size, why):
    async with SGLangClient(tp2_server.url, api_key=tp2_server.api_key, retries=0) as c:
        ans = await c.init_weights_update_group("127.0.0.1", 1, rank_offset, world_size, group_name="g")
        assert ans["success"] is False and why in ans["message"], ans
        async with session(c, "tp2", 10):
            missing = await c.update_weights_from_distributed(["x"], ["float32"], [[1]], group_name="g")
        assert missing["success"] is False and "no weight update group 'g'" in missing["message"]


def test_ranks_that_received_other_bytes_are_named():
    names = ["a", "b"]
    same = [[torch.ones(2), torch.zeros(())], [torch.ones(2), torch.zeros(())]]
    assert first_difference(names, same, [1, 2]) == ""
    flipped = torch.zeros(())
    flipped.reshape(1).view(torch.uint8)[0] = 1  # one bit of a float: a denormal, other bytes
    assert first_difference(names, [same[0], [torch.ones(2), flipped]], [3, 4]) == \
        "b: rank 4 received other bytes than rank 3"
    assert first_difference(names, [same[0], [torch.ones(2, dtype=torch.float64), torch.zeros(())]], [1, 2]) \
        == "a: rank 2 received other bytes than rank 1"


async def test_pause_aborts_in_flight_and_new_requests_wait_for_continue(client):
    long = asyncio.create_task(client.generate(PROMPT, {"max_new_tokens": 100_000, "ignore_eos": True}))
    for _ in range(500):
        if (await client.get_server_info())["internal_states"][0]["num_running"]:
            break
        await asyncio.sleep(0.02)
    paused = await client.pause_generation()
    assert paused == {"message": "Generation paused successfully.", "status": "ok"}
    res = await asyncio.wait_for(long, 30)
    assert res.finish_reason["type"] == "abort" and res.output_ids
    assert len(res.output_logprobs) == len(res.output_ids)

    waiting = asyncio.create_task(client.generate(PROMPT, GREEDY))
    await asyncio.sleep(1.0)
    assert not waiting.done()
    assert await client.flush_cache() is True  # nothing running while paused
    cont = await client.continue_generation()
    assert cont["status"] == "ok"
    res = await asyncio.wait_for(waiting, 30)
    assert res.finish_reason == {"type": "length", "length": 16}


async def test_abort_request_by_rid_and_update_weight_version(client):
    task = asyncio.create_task(client.generate(PROMPT, {"max_new_tokens": 100_000, "ignore_eos": True},
                                               rid="r-1"))
    for _ in range(500):
        if (await client.get_server_info())["internal_states"][0]["num_running"]:
            break
        await asyncio.sleep(0.02)
    await client.abort_request(rid="r-1")
    res = await asyncio.wait_for(task, 30)
    assert res.finish_reason["type"] == "abort"
    ans = await client.update_weight_version("17")
    assert ans["success"] is True and await client.get_weight_version() == "17"
    assert (await client.get_model_info())["weight_version"] == "17"


async def test_weight_update_sessions_as_sglang(client):
    from inference.update_lock import NO_SESSION, SESSION_OPEN

    assert await client.end_weight_update() == {"success": False, "message": NO_SESSION}
    long = asyncio.create_task(client.generate(PROMPT, {"max_new_tokens": 100_000, "ignore_eos": True}))
    for _ in range(500):
        if (await client.get_server_info())["internal_states"][0]["num_running"]:
            break
        await asyncio.sleep(0.02)
    # begin waits for the model-update lock: until the request in flight has ended
    begin = asyncio.create_task(client.begin_weight_update())
    await asyncio.sleep(1.0)
    assert not begin.done() and not long.done()
    await client.abort_request(abort_all=True)
    assert (await asyncio.wait_for(long, 30)).finish_reason["type"] == "abort"
    assert await asyncio.wait_for(begin, 30) == {"success": True, "message": "Success"}
    try:
        assert await client.begin_weight_update() == {"success": False, "message": SESSION_OPEN}
        # a session does not hold generation back
        assert (await client.generate(PROMPT, GREEDY)).completion_tokens == 16
    finally:
        assert await client.end_weight_update() == {"success": True, "message": "Success"}


async def _running(client: SGLangClient) -> None:
    for _ in range(500):
        if (await client.get_server_info())["internal_states"][0]["num_running"]:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the request never ran")


async def test_a_retracted_request_finishes_under_the_weights_loaded_while_paused(client, tiny_model_dir,
                                                                                   other_model):
    """In-flight mode's update (weight_sync.coordinator.PAUSE_MODE): pause retract, load, continue;
    the request is not cut, it goes on under the new weights and answers their version. The same
    with in_place fails the update's cache flush, as in SGLang 0.5.23."""
    from inference.cpu_server import NOT_FLUSHED

    assert (await client.update_weights_from_disk(str(tiny_model_dir), weight_version="0"))["success"]
    n = 120
    greedy = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
    base = await client.generate(PROMPT, greedy)
    other_start = (await client.update_weights_from_disk(str(other_model), weight_version="1"))
    assert other_start["success"]
    other = await client.generate(PROMPT, greedy)
    assert (await client.update_weights_from_disk(str(tiny_model_dir), weight_version="0"))["success"]

    task = asyncio.create_task(client.generate(PROMPT, greedy))
    await _running(client)
    await client.pause_generation("retract")
    ok = await client.update_weights_from_disk(str(other_model), weight_version="5")  # skips the lock
    assert ok["success"] is True, ok
    await client.continue_generation()
    res = await asyncio.wait_for(task, 60)
    assert res.finish_reason == {"type": "length", "length": n} and res.weight_version == "5"
    k = next(i for i, (a, b) in enumerate(zip(res.output_ids, base.output_ids, strict=True)) if a != b)
    assert k >= 1 and res.output_ids != other.output_ids  # started on the old weights, ended on the new

    task = asyncio.create_task(client.generate(PROMPT, {**greedy, "max_new_tokens": 100_000}))
    await _running(client)
    await client.pause_generation("in_place")
    held = await client.update_weights_from_disk(str(tiny_model_dir), weight_version="6")
    assert held["success"] is False and held["message"] == NOT_FLUSHED
    await client.continue_generation()
    await client.abort_request(abort_all=True)
    assert (await asyncio.wait_for(task, 30)).finish_reason["type"] == "abort"
    assert (await client.update_weights_from_disk(str(tiny_model_dir), weight_version="0"))["success"]

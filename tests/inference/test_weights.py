"""Weight updates on a CPU server subprocess: from disk, and distributed with this test process
as rank 0 of a gloo group (SGLang's rank layout)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import torch
from fixtures_inference import CpuServerHandle, start_cpu_server

from common.services import free_port
from inference.client import SGLangClient
from inference.dist_group import broadcast, destroy_group, new_group
from inference.tiny_model import init_tiny
from inference.weights import checksum, named_weights, read_safetensors_dir

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


async def _distributed_update(client, tensors: dict[str, torch.Tensor], group: str, version: str) -> dict:
    port = free_port()
    ans = await client.init_weights_update_group("127.0.0.1", port, rank_offset=1, world_size=2,
                                                 group_name=group, backend="gloo")
    assert ans["success"] is True, ans
    pg = await asyncio.wait_for(asyncio.to_thread(new_group, "127.0.0.1", port, 0, 2, group, "gloo", 60), 90)
    try:
        names = list(tensors)

        def send() -> None:
            for n in names:
                broadcast(pg, tensors[n].contiguous(), src=0)

        res, _ = await asyncio.wait_for(asyncio.gather(
            client.update_weights_from_distributed(
                names, [str(tensors[n].dtype) for n in names], [list(tensors[n].shape) for n in names],
                group_name=group, weight_version=version),
            asyncio.to_thread(send)), 120)
    finally:
        destroyed = await client.destroy_weights_update_group(group)
        destroy_group(pg)
    assert destroyed["success"] is True
    return res


async def test_update_from_distributed_is_bit_identical(client, server, tiny_model_dir, other_model):
    from transformers import AutoModelForCausalLM

    trainer = AutoModelForCausalLM.from_pretrained(other_model, dtype=torch.float32)
    tensors = named_weights(trainer)
    with torch.no_grad():  # weights no file holds: a trainer's step
        for t in tensors.values():
            t.add_(0.001)
    res = await _distributed_update(client, tensors, "weight_update_group", "3")
    assert res["success"] is True, res
    assert await server_checksum(server) == checksum(tensors)
    out = await client.generate(PROMPT, GREEDY)
    assert out.weight_version == "3"

    # a second group over the server's life (same name, after destroy) works as well
    base = read_safetensors_dir(tiny_model_dir)
    res = await _distributed_update(client, base, "weight_update_group", "4")
    assert res["success"] is True, res
    assert await server_checksum(server) == checksum(base)
    assert await client.get_weight_version() == "4"


async def test_distributed_update_with_wrong_names_keeps_weights(client, server):
    before = await server_checksum(server)
    res = await _distributed_update(client, {"model.no_such.weight": torch.ones(3)}, "bad_group", "99")
    assert res["success"] is False and "no_such" in res["message"]
    assert await server_checksum(server) == before and await client.get_weight_version() != "99"
    missing = await client.update_weights_from_distributed(["x"], ["float32"], [[1]], group_name="nope")
    assert missing["success"] is False and "nope" in missing["message"]


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

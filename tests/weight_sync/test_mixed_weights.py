"""No turn runs on a half-loaded model, against real CPU server processes over gloo and a real
Redis. SGLang 0.5.23 (and the CPU server alike) loads each bucket of a distributed update into
the live model as it arrives, takes the writer lock per HTTP call only, and labels the version
only with the last bucket: between two buckets, or after an update that failed half way, a
request would run on a mix of two versions and report the old one.

Probes generate one greedy token from a fixed prompt again and again while the updates run;
every answer must be exactly what the version it reports produces (its token and logprob, taken
from the server before and after). The new versions are far from the old (noise of 0.5), so a
mixed model answers differently."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import torch
from polling import wait_for
from ws_helpers import API_KEY, all_at, expected_checksum, server_checksum

from broker.registry import ServerRegistry
from inference.client import SGLangClient
from weight_sync.protocols import ServerRefused
from weight_sync.update_group import UpdateGroup, session

PROMPT = [1, 2, 3, 4]
GREEDY = {"max_new_tokens": 1, "temperature": 0}


def far_tensors(model_dir: Path, seed: int) -> list[tuple[str, torch.Tensor]]:
    """The base model's tensors moved far (noise of 0.5): a model half of whose tensors are
    these answers unlike either version."""
    from safetensors.torch import load_file

    base: dict[str, torch.Tensor] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        base.update(load_file(f))
    g = torch.Generator().manual_seed(seed)
    return [(n, (t.float() + 0.5 * torch.randn(t.shape, generator=g)).to(t.dtype)) for n, t in sorted(base.items())]


async def _answer(client: SGLangClient) -> tuple[str, list[int], list[float]]:
    g = await client.generate(PROMPT, GREEDY)
    return str(g.weight_version), g.output_ids, g.output_logprobs


async def _probe(client: SGLangClient, stop: asyncio.Event, seen: list[tuple[str, list[int], list[float]]]) -> None:
    while not stop.is_set():
        seen.append(await _answer(client))


def _mixed(seen: list[tuple[str, list[int], list[float]]],
           refs: dict[str, tuple[list[int], list[float]]]) -> list[tuple[str, list[int], list[float]]]:
    """Answers unlike what the version they report produces."""
    return [(v, ids, lps) for v, ids, lps in seen
            if v not in refs or ids != refs[v][0] or abs(lps[0] - refs[v][1][0]) > 1e-3]


class LosesItsGroup(SGLangClient):
    """A real client whose server loses its weight-update group after the 3rd bucket (as when an
    operator or a scheduler restart destroys it): the 4th is refused with 3 loaded."""

    buckets = 0

    async def update_weights_from_distributed(self, *args: Any, **kw: Any) -> dict:
        ans = await super().update_weights_from_distributed(*args, **kw)
        LosesItsGroup.buckets += 1
        if LosesItsGroup.buckets == 3:
            await self.destroy_weights_update_group(group_name=kw["group_name"])
        return ans


async def _setup(ws_cfg, aredis, keys, start_servers, **ws: Any):
    for k, v in {"transport": "distributed", "backend": "gloo", "bucket_mb": 0.02, **ws}.items():
        setattr(ws_cfg.weight_sync, k, v)
    (srv,) = start_servers(1)
    registry = ServerRegistry(aredis, keys)
    await wait_for(lambda: all_at(registry, 1, 0), 60, "server ready at 0")
    return srv, registry


async def test_in_flight_a_failed_update_keeps_generation_paused_until_reloaded_from_disk(
        ws_cfg, aredis, keys, start_servers, tiny_model_dir):
    from weight_sync import make_publisher

    srv, registry = await _setup(ws_cfg, aredis, keys, start_servers, rollout_mode="in-flight")
    t1 = far_tensors(tiny_model_dir, 1)
    pub = make_publisher(ws_cfg.weight_sync, aredis, keys, ws_cfg.run.dir, str(tiny_model_dir),
                         client_factory=lambda url: LosesItsGroup(url, api_key=API_KEY, timeout_s=60, retries=1))
    stop, seen = asyncio.Event(), []
    async with SGLangClient(srv.url, api_key=API_KEY, timeout_s=120) as client:
        v0 = await _answer(client)
        probes = [asyncio.create_task(_probe(client, stop, seen)) for _ in range(2)]
        try:
            await wait_for(lambda: len(seen) > 4, 30, "probes answering")
            await pub.publish(1, 1, lambda: iter(t1))
            await wait_for(lambda: all_at(registry, 1, 1), 60, "v1 (from disk)")
            n = len(seen)
            await wait_for(lambda: len(seen) > n + 4, 30, "probes answering after the reload")
        finally:
            stop.set()
            await asyncio.gather(*probes, return_exceptions=True)
            await pub.close()
        v1 = await _answer(client)
    refs = {"0": v0[1:], "1": v1[1:]}
    assert refs["0"] != refs["1"]
    assert not _mixed(seen, refs), f"answers on a half-loaded model: {_mixed(seen, refs)[:3]}"
    assert {v for v, _, _ in seen} == {"0", "1"}
    assert LosesItsGroup.buckets >= 3
    history = pub.coordinator.history()
    assert [(r.version, r.transport, r.ok) for r in history] == [(1, "distributed", False), (1, "disk", True)]
    assert "after 3 buckets were loaded" in history[0].error
    assert await server_checksum(srv.url) == expected_checksum(t1)
    assert pub.metrics()["held_paused"] == 1


async def test_pinned_proceed_pauses_generation_so_no_turn_runs_between_buckets(
        ws_cfg, aredis, keys, start_servers, publisher_factory, tiny_model_dir):
    srv, registry = await _setup(ws_cfg, aredis, keys, start_servers, drain_timeout_s=0.3,
                                 drain_timeout_action="proceed")
    t1 = far_tensors(tiny_model_dir, 1)
    held = await registry.pin("stubborn")  # an episode that outlives the drain timeout
    assert held is not None
    stop, seen = asyncio.Event(), []
    async with SGLangClient(srv.url, api_key=API_KEY, timeout_s=120) as client:
        v0 = await _answer(client)
        probes = [asyncio.create_task(_probe(client, stop, seen)) for _ in range(2)]
        try:
            await wait_for(lambda: len(seen) > 4, 30, "probes answering")
            pub = publisher_factory(ws_cfg)
            await pub.publish(1, 1, lambda: iter(t1))
            assert await all_at(registry, 1, 1)
            n = len(seen)
            await wait_for(lambda: len(seen) > n + 4, 30, "probes answering after the update")
        finally:
            stop.set()
            await asyncio.gather(*probes, return_exceptions=True)
        v1 = await _answer(client)
    await registry.unpin(held.id, "stubborn")
    refs = {"0": v0[1:], "1": v1[1:]}
    assert not _mixed(seen, refs), f"answers on a half-loaded model: {_mixed(seen, refs)[:3]}"
    assert {v for v, _, _ in seen} == {"0", "1"}
    last = pub.coordinator.history()[-1]
    assert (last.version, last.transport, last.ok, last.pins_at_update) == (1, "distributed", True, 1)
    assert pub.metrics()["paused_s"] > 0


async def test_a_refused_group_leaves_no_thread_of_rank_0_past_the_bound(cpu_server_factory, tiny_model_dir):
    # a server of tp_size 2 refuses a group laid out for tp 1 (its ranks would not fit): rank 0's
    # side of the set-up, already waiting for its peers, must end within the group's bound
    srv = cpu_server_factory.start(tiny_model_dir, api_key=API_KEY, tp_size=2)
    async with SGLangClient(srv.url, api_key=API_KEY, timeout_s=30, retries=0) as client:
        group = UpdateGroup(name="refused-join", members=["s"], clients=[client], tp_sizes=[1],
                            backend="gloo", timeout_s=3)
        async with session(client, "s", 10):
            t0 = time.monotonic()
            with contextlib.suppress(ServerRefused):
                await group.connect()
            assert group.broken and time.monotonic() - t0 < 2  # the refusal, not the bound
            await wait_for(lambda: group.running == 0, 5, "rank 0's set-up thread to end")
            assert time.monotonic() - t0 < 4.5  # the bound (3 s), not twice it


async def test_a_turn_across_an_update_says_which_tokens_each_version_made(cpu_server, tiny_model_dir):
    """meta_info.weight_versions (SGLang 0.5.23's spans): a request retracted by the pause, the
    weights loaded as version 7, generation continued: its first tokens are the old version's,
    the rest 7's; the client gives one version per token."""
    async with SGLangClient(cpu_server.url, api_key=cpu_server.api_key, timeout_s=120, retries=0) as client:
        before = await client.get_weight_version()
        long = asyncio.create_task(client.generate(PROMPT, {"max_new_tokens": 400, "ignore_eos": True,
                                                            "temperature": 0}))

        async def tokens() -> int:
            return int((await client.server_info())["internal_states"][0]["tokens_generated"])

        start = await tokens()
        await wait_for(lambda: _more(tokens, start + 20), 30, "the long request generating")
        try:
            await client.pause_generation("retract")
            ans = await client.update_weights_from_disk(str(tiny_model_dir), weight_version="7")
            assert ans["success"], ans
        finally:
            await client.continue_generation()
        g = await long
        await client.update_weights_from_disk(str(tiny_model_dir), weight_version=before)
    spans = g.raw["meta_info"]["weight_versions"]
    assert [s["version"] for s in spans] == [before, "7"] and spans[0]["start"] == 0
    k = spans[0]["end"]
    assert 0 < k < 400 and spans[1] == {"version": "7", "start": k, "end": 400}
    assert g.weight_version == "7" and g.raw["meta_info"]["num_retractions"] == 1
    assert g.token_versions == [before] * k + ["7"] * (400 - k)


async def _more(tokens, than: int) -> bool:
    return await tokens() > than

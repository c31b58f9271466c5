import asyncio

import pytest

from broker.registry import ActorRegistry, PolicyRegistry, ServerMeta, ServerRegistry

META = ServerMeta(kind="scripted")


async def test_policy_publish_is_monotonic(aredis, keys):
    p = PolicyRegistry(aredis, keys)
    assert await p.current() == 0
    await p.publish(2, {"path": "/w/v2", "format": "hf-safetensors"})
    await p.publish(1, {"path": "/w/v1"})  # a late, older manifest never lowers current
    assert await p.current() == 2
    assert (await p.manifest(2))["path"] == "/w/v2"
    assert sorted(await p.manifests()) == [1, 2]
    await p.delete_manifest(1)
    assert await p.manifest(1) is None


async def test_pin_prefers_newest_version_then_fewest_pins(aredis, keys):
    reg = ServerRegistry(aredis, keys)
    await reg.register("a", "http://a", 1, meta=META, state="ready")
    await reg.register("b", "http://b", 1, meta=META, state="ready")
    await reg.register("c", "http://c", 0, meta=META, state="ready")
    await reg.register("d", "http://d", 2, meta=META, state="draining")
    picks = [(await reg.pin(f"p{i}")).id for i in range(4)]
    assert sorted(picks) == ["a", "a", "b", "b"]  # v1 beats v0; draining v2 takes no pins
    assert await reg.pin_count("a") == 2
    assert (await reg.pin("p9", min_version=2)) is None
    on_a = [f"p{i}" for i, sid in enumerate(picks) if sid == "a"]
    await reg.unpin("a", on_a[0])
    assert await reg.pin_count("a") == 1
    listed = {s.id: s for s in await reg.list()}
    assert listed["b"].pins == 2 and listed["d"].state == "draining"


async def test_expired_pins_and_stale_servers_do_not_count(aredis, keys):
    reg = ServerRegistry(aredis, keys)
    await reg.register("a", "http://a", 0, meta=META, state="ready")
    assert (await reg.pin("short", ttl_s=0.2)).id == "a"
    assert await reg.renew_pin("a", "short", ttl_s=0.2) is True
    assert await reg.pin_count("a") == 1
    await asyncio.sleep(0.3)
    assert await reg.pin_count("a") == 0  # the holder died: its pin lapsed
    assert await reg.renew_pin("a", "short") is False  # a lapsed pin is not revived
    # a server whose heartbeat is stale takes no pins
    await aredis.hset(keys.server("a"), "heartbeat", 1.0)
    assert await reg.pin("p") is None
    assert (await reg.list(alive_only=True)) == []
    await reg.heartbeat("a")
    assert (await reg.pin("p")).id == "a"


async def test_states_are_checked_and_remove(aredis, keys):
    reg = ServerRegistry(aredis, keys)
    with pytest.raises(ValueError, match="weird"):
        await reg.register("a", "http://a", 0, meta=META, state="weird")
    await reg.register("a", "http://a", None, meta=META)
    s = await reg.get("a")
    assert s.version is None and s.state == "starting"
    await aredis.hset(keys.server("a"), "heartbeat", 1.0)
    await reg.set_state("a", "failed", error="bad checkpoint")
    s = await reg.get("a")
    assert s.error == "bad checkpoint" and not s.alive  # a state change is not a heartbeat
    await reg.remove("a")
    assert await reg.get("a") is None


async def test_actor_registry_expiry(aredis, keys):
    reg = ActorRegistry(aredis, keys)
    await reg.register("act-1", "host", 123, 4)
    await reg.register("act-2", "host", 124, 4)
    await reg.heartbeat("act-1", running=3, totals={"episodes": 5})
    await aredis.delete(keys.actor("act-2"))  # as if its TTL ran out
    actors = await reg.list()
    assert [a["id"] for a in actors] == ["act-1"]
    assert actors[0]["running"] == 3 and actors[0]["totals"] == {"episodes": 5}
    assert await aredis.smembers(keys.actors) == {b"act-1"}
    assert 0 < await aredis.ttl(keys.actor("act-1")) <= 30


async def test_server_meta_is_typed(aredis, keys):
    reg = ServerRegistry(aredis, keys)
    with pytest.raises(ValueError, match="tp_size"):
        ServerMeta(kind="sglang")  # an SGLang server must say how many ranks join its group
    await reg.register("g", "http://g", 0, meta=ServerMeta(kind="sglang", tp_size=2), state="ready")
    (g,) = await reg.list()
    assert g.meta == ServerMeta(kind="sglang", tp_size=2) and g.meta_error == ""
    # a hash written by anything else (the old `tp` field) is read as invalid, never as tp 1
    await aredis.hset(keys.server("g"), "meta", '{"kind": "sglang", "tp": 2}')
    (g,) = await reg.list()
    assert g.meta is None and "tp" in g.meta_error


async def test_updates_never_recreate_a_lost_entry(aredis, keys):
    reg = ServerRegistry(aredis, keys)
    await reg.register("s", "http://s", 1, meta=META, state="ready")
    assert await reg.heartbeat("s", version=2) and await reg.set_state("s", "draining")
    await aredis.flushall()  # e.g. Redis restarted without its append-only file
    assert not await reg.heartbeat("s", version=2)
    assert not await reg.set_state("s", "ready")
    assert await reg.list() == [] and await aredis.hgetall(keys.server("s")) == {}
    await reg.register("s", "http://s", 2, meta=META, state="ready")
    (s,) = await reg.list()
    assert (s.url, s.version, s.state, s.meta) == ("http://s", 2, "ready", META)


async def test_prm_servers_are_a_pool_of_their_own(aredis, keys):
    """A judge (role prm) is listed in its own pool and never pinned, however new its version."""
    reg = ServerRegistry(aredis, keys)
    await reg.register("judge", "http://j", 9, meta=ServerMeta(kind="scripted", role="prm"), state="ready")
    assert await reg.pin("p0") is None  # only a judge is ready: an episode gets no server
    await reg.register("pol", "http://p", 0, meta=META, state="ready")
    assert (await reg.pin("p1")).id == "pol"  # v0 policy beats a v9 judge: judges never qualify
    assert [s.id for s in await reg.list(role="prm")] == ["judge"]
    assert [s.id for s in await reg.list(role="policy")] == ["pol"]
    assert {s.id: s.role for s in await reg.list()} == {"judge": "prm", "pol": "policy"}
    # the role is its own hash field: known even when the meta is unreadable
    await aredis.hset(keys.server("judge"), "meta", "{not json")
    judge = await reg.get("judge")
    assert judge.meta is None and judge.role == "prm"
    with pytest.raises(ValueError, match="role"):
        ServerMeta(kind="scripted", role="critic")


async def test_status_shows_the_policy_and_prm_pools(aredis, keys):
    from rich.console import Console

    from broker.config import AdmissionConfig, ReplayConfig
    from broker.status import gather, render

    reg = ServerRegistry(aredis, keys)
    await reg.register("pol-0", "http://p0", 0, meta=META, state="ready")
    await reg.register("judge-0", "http://j0", 0, meta=ServerMeta(kind="sglang", tp_size=1, role="prm"),
                       state="ready")
    await aredis.hincrby(keys.stats, "samples_written", 3)
    await aredis.hincrbyfloat(keys.stats, "rollout_busy_s", 1.25)  # a float total reads too
    st = await gather(aredis, keys, ReplayConfig(), AdmissionConfig())
    assert {s["id"]: s["role"] for s in st["servers"]} == {"pol-0": "policy", "judge-0": "prm"}
    assert st["stats"]["samples_written"] == 3 and st["stats"]["rollout_busy_s"] == 1.25
    console = Console(record=True, width=200)
    console.print(render(st))
    text = console.export_text()
    policy_table, judge_table = text.split("inference servers (policy)")[1].split("PRM judge servers")
    assert "pol-0" in policy_table and "judge-0" not in policy_table
    assert "judge-0" in judge_table.split("actors")[0]


async def test_status_accounts_for_every_generated_token(aredis, keys):
    from rich.console import Console

    from broker.config import AdmissionConfig, ReplayConfig
    from broker.status import gather, render

    for field, n in {"tokens_generated": 1000, "tokens_written": 700, "tokens_trained": 500,
                     "tokens_wasted/stale_stopped": 120, "tokens_wasted/infra": 30,
                     "tokens_wasted/dropped_late": 50}.items():
        await aredis.hincrby(keys.stats, field, n)
    st = await gather(aredis, keys, ReplayConfig(), AdmissionConfig())
    t = st["tokens"]
    assert t["wasted"] == {"dropped_late": 50, "infra": 30, "stale_stopped": 120}
    assert (t["generated"], t["trained"], t["wasted_total"], t["in_flight"]) == (1000, 500, 200, 300)
    assert t["wasted_fraction"] == 0.2
    console = Console(record=True, width=200)
    console.print(render(st))
    text = console.export_text()
    assert "tokens wasted" in text and "200 (20.0%)" in text and "stale_stopped 120" in text

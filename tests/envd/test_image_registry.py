"""Task images at cluster scale, all real: a Docker registry on loopback, two dockerd daemons
standing for two nodes (each with its envd, pulling from the registry), one pool over both,
Redis. Images are tiny (a few MB, fixtures_images.py) so pulls take about a second."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import pytest
from polling import wait_until
from prometheus_client.parser import text_string_to_metric_families

from envd.client import EnvdClient, EnvError

pytestmark = pytest.mark.docker


def metric(svc, name: str, **labels: str) -> float:
    r = httpx.get(f"{svc.url}/metrics", headers={"Authorization": f"Bearer {svc.token}"}, timeout=10)
    total = 0.0
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def node_images(svc) -> set[str]:
    r = httpx.get(f"{svc.url}/images", headers={"Authorization": f"Bearer {svc.token}"}, timeout=10)
    return set(r.json()["images"])


def pool_client(pool) -> EnvdClient:
    return EnvdClient.pool(pool.url, pool.token, timeout_s=60, allocate_wait_s=30)


async def test_a_node_without_the_image_pulls_it_on_the_first_lease(image_nodes, pool_factory, redis_url,
                                                                   tiny_images, aredis, keys) -> None:
    (image,) = tiny_images(1)
    a, b = image_nodes()
    assert image not in node_images(a) | node_images(b)
    pool = pool_factory([a.url, b.url], redis_url)
    client = pool_client(pool)
    try:
        body = await client.call("POST", "/allocate", {"image": image, "instance_id": "t1", "wait_s": 30},
                                 timeout_s=120)
        assert body["pulled"] is True and body["pull_s"] > 0 and body["create_s"] > 0
        node = a if body["node_url"] == a.url else b
        assert image in node_images(node)
        assert metric(node, "envd_image_pulls_total", result="ok") == 1
        assert metric(node, "envd_image_pull_bytes_total") > 1e6  # progress counted as it came
        # the pool now knows where it is: the next lease goes there and pulls nothing
        assert await aredis.hget(keys.image_nodes(image), node.node_id) == b"ready"
        await client.close(body["lease_id"])
        again = await client.call("POST", "/allocate", {"image": image, "instance_id": "t1"}, timeout_s=120)
        assert again["node_url"] == node.url and again["pulled"] is False and again["pull_s"] == 0
        await client.close(again["lease_id"])
    finally:
        await client.aclose()


async def test_ten_simultaneous_leases_of_an_uncached_image_cause_one_pull(image_nodes, pool_factory, redis_url,
                                                                           tiny_images) -> None:
    (image,) = tiny_images(1, payload_mb=8)
    a, b = image_nodes()
    pool = pool_factory([a.url, b.url], redis_url, sets=["pool.max_per_node=10"])
    client = pool_client(pool)
    try:
        leases = await asyncio.gather(*(client.allocate(image, f"t{i}", wait_s=30) for i in range(10)))
        assert len({lease.node_url for lease in leases}) == 1  # all joined the one pull's node
        pulls = [metric(n, "envd_image_pulls_total", result="ok") for n in (a, b)]
        assert sum(pulls) == 1, pulls
        assert sum(1 for lease in leases if lease.pull_s > 0) >= 2  # others waited for that pull
        await asyncio.gather(*(client.close(lease.lease_id) for lease in leases))
    finally:
        await client.aclose()


async def test_leases_go_to_the_node_holding_the_image_while_it_has_room(image_nodes, pool_factory, redis_url,
                                                                         tiny_images) -> None:
    (image,) = tiny_images(1)
    a, b = image_nodes()
    # b alone has it (a prefetch through its envd)
    node_b = EnvdClient.node(b.url, b.token)
    try:
        got = await node_b.pull(image)
        assert got["pulled"] is True and got["node_id"] == b.node_id
        assert (await node_b.pull(image))["pulled"] is False
    finally:
        await node_b.aclose()
    pool = pool_factory([a.url, b.url], redis_url, sets=["pool.max_per_node=2"])
    client = pool_client(pool)
    try:
        leases = [await client.allocate(image, f"t{i}", wait_s=30) for i in range(3)]
        assert [lease.node_url for lease in leases[:2]] == [b.url, b.url]
        assert leases[2].node_url == a.url and leases[2].pull_s > 0  # b full: a pulls
        for lease in leases:
            await client.close(lease.lease_id)
    finally:
        await client.aclose()


async def test_a_registry_that_is_down_is_an_infrastructure_failure_with_the_reason(
        image_nodes, pool_factory, redis_url, tiny_images, aredis, keys) -> None:
    from common.services import free_port

    (image,) = tiny_images(1)
    a, b = image_nodes(registry_host=f"127.0.0.1:{free_port()}")  # nothing listens there
    pool = pool_factory([a.url, b.url], redis_url)
    client = pool_client(pool)
    try:
        t0 = time.monotonic()
        with pytest.raises(EnvError) as err:
            await client.allocate(image, "t1", wait_s=30)
        assert time.monotonic() - t0 < 25  # answered at once, not after the capacity wait
        assert err.value.status == 502 and err.value.reason == "pull_failed"
        assert "pull of " + image in str(err.value) and "connection refused" in str(err.value).lower()
        assert sum(metric(n, "envd_image_pulls_total", result="failed") for n in (a, b)) == 1
        assert await aredis.hgetall(keys.image_nodes(image)) == {}  # no pulling mark left behind
        status = await client.status()
        assert status["leases"] == 0
        # an actor counts it as infrastructure (its job is retried), never as a -1
        from actors.backends import PoolEnv
        from actors.config import ActorConfig
        from actors.episode import EpisodeJob
        from actors.leased import LeasedEpisodes
        from actors.protocols import InfraError

        episodes = LeasedEpisodes(ActorConfig(), client, owner="t", tokenizer=None, traj_dir=None)
        job = EpisodeJob("j", {"instance_id": "t1", "image_name": image}, "g", 0)
        with pytest.raises(InfraError) as infra:
            # actor.lease_ahead: the allocation's error reaches the episode at its first command
            async with episodes._lease(job) as alloc:
                await PoolEnv(client, alloc, job.instance, "/testbed", {}).exec("true", 5)
        assert infra.value.reason == "image_pull_failed" and "connection refused" in infra.value.detail.lower()
    finally:
        await client.aclose()


async def test_the_budget_evicts_the_lru_unused_image_never_one_in_use(image_nodes, docker_nodes, pool_factory,
                                                                       redis_url, tiny_images, aredis,
                                                                       keys) -> None:
    from pathlib import Path

    node = docker_nodes[0]
    with contextlib.closing(node.client()) as c:  # node-a's image store holds just this test's images
        for ctr in c.containers.list(all=True, ignore_removed=True):
            ctr.remove(force=True)
        for img in c.api.images():
            c.images.remove(img["Id"], force=True)
    payload_mb = 4
    (keep,) = tiny_images(1, prefix="keep", payload_mb=payload_mb)
    in_use, lru, newest = tiny_images(3, payload_mb=payload_mb)
    per_image = payload_mb * 1e6 + sum(Path(p).resolve().stat().st_size for p in (
        "/usr/bin/sleep", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"))
    (a,) = image_nodes(only=["node-a"], sets=[
        f"envd.image_budget={int(per_image * 3.5)}", 'envd.image_keep=["swarl-test/keep-*"]',
        "envd.image_gc_interval_s=3600"])
    pool = pool_factory([a.url], redis_url)
    client = pool_client(pool)
    node_a = EnvdClient.node(a.url, a.token)
    try:
        assert (await node_a.pull(keep))["pulled"]  # the oldest, but protected
        held = await client.allocate(in_use, "t-held")  # older than lru, but in use throughout
        for image in (lru, newest):
            lease = await client.allocate(image, "t")
            await client.close(lease.lease_id)
        # four images > 3.5: after newest's pull exactly one goes, the LRU one nobody uses
        wait_until(lambda: metric(a, "envd_image_evictions_total") >= 1, 30, "the first eviction")
        await asyncio.sleep(1)  # a second eviction, if any, would come now
        assert metric(a, "envd_image_evictions_total") == 1
        assert node_images(a) >= {keep, in_use, newest} and lru not in node_images(a)
        assert await aredis.hget(keys.image_nodes(lru), "node-a") is None
        assert await aredis.hget(keys.image_nodes(newest), "node-a") == b"ready"
        assert set(await aredis.hkeys(keys.envd_images("node-a"))) == {keep.encode(), in_use.encode(),
                                                                        newest.encode()}
        assert "image_evicted" in a.log() and lru in a.log()
        await client.close(held.lease_id)
    finally:
        await node_a.aclose()
        await client.aclose()


def test_prefetch_spreads_the_runs_images_over_the_nodes(image_nodes, tiny_images, tmp_path) -> None:
    import json
    import os
    import subprocess

    from fixtures_envd import SWARL

    first, second, third = tiny_images(3)
    a, b = image_nodes()
    rows = [{"instance_id": f"t-{i}", "repo": "o/n", "problem_statement": "x", "FAIL_TO_PASS": ["t"],
             "PASS_TO_PASS": [], "eval_script": "true", "image_name": img}
            for i, img in enumerate([first, second, first])]  # first twice: pulled once per node
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n{not json\n")
    env = {**os.environ, "SWARL_ENVD_TOKEN": a.token, "SWARL_REDIS_URL": ""}

    def prefetch(*args: str) -> tuple[int, str, dict]:
        p = subprocess.run([SWARL, "images", "prefetch", "--data", str(data), "--nodes", f"{a.url},{b.url}",
                            *args], capture_output=True, text=True, env=env, timeout=300)
        return p.returncode, p.stdout + p.stderr, json.loads(p.stdout.strip().splitlines()[-1])

    code, out, summary = prefetch("--copies", "2")
    assert code == 0, out
    assert "skipped rows.jsonl line 4" in out  # the bad line is named, the rest goes on
    assert summary["pulled"] == 4 and summary["failed"] == 0 and summary["bytes"] > 4e6
    assert {first, second} <= node_images(a) and {first, second} <= node_images(b)
    code, out, summary = prefetch("--copies", "2")
    assert code == 0 and summary["pulled"] == 0 and summary["present"] == 4, out
    # one copy of a new image goes to one node only
    data.write_text(json.dumps({**rows[0], "image_name": third}) + "\n")
    code, out, summary = prefetch()
    assert code == 0 and summary["pulled"] == 1, out
    assert (third in node_images(a)) != (third in node_images(b))


@pytest.mark.slow
@pytest.mark.registry
def test_push_puts_bundled_task_images_where_envd_pulls_them(registry, image_nodes, task_images) -> None:
    import os
    import subprocess

    from fixtures_envd import SWARL

    iid, image = sorted(task_images.items())[0]
    p = subprocess.run([SWARL, "images", "push", "--registry", registry.host, "--only", iid],
                       capture_output=True, text=True, timeout=900,
                       env={**os.environ, "SWARL_REDIS_URL": ""})
    assert p.returncode == 0, p.stdout + p.stderr
    repo, tag = image.rsplit(":", 1)
    tags = httpx.get(f"http://{registry.host}/v2/{repo}/tags/list", timeout=10).json()
    assert tag in tags["tags"]
    (a,) = image_nodes(only=["node-a"])
    with contextlib.closing(__import__("docker").DockerClient(base_url=os.environ["DOCKER_HOST"])) as c:
        assert image in {t for img in c.api.images() for t in (img.get("RepoTags") or [])}  # the pushed tag is gone, not the image
    assert image not in node_images(a)

    async def pull() -> dict:
        node = EnvdClient.node(a.url, a.token)
        try:
            return await node.pull(image)
        finally:
            await node.aclose()

    got = asyncio.run(pull())
    assert got["pulled"] and image in node_images(a)


async def test_registry_credentials_from_the_config_or_dockers_config_json_never_logged(
        image_nodes, auth_registry, tiny_images, tmp_path) -> None:
    import base64
    import json

    mine, theirs = tiny_images(2, to=auth_registry)
    user, password = auth_registry.username, auth_registry.password
    assert user and password
    # node-a: user in the config, password in the environment (as an env file would hold it)
    (a,) = image_nodes(only=["node-a"], registry_host=auth_registry.host,
                       sets=[f"envd.registry_username={user}"], env={"SWARL_ENVD__REGISTRY_PASSWORD": password})
    # node-b: nothing in swarl's config; Docker's own config.json (DOCKER_CONFIG) has the login
    cfg_dir = tmp_path / "docker-config"
    cfg_dir.mkdir()
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    (cfg_dir / "config.json").write_text(json.dumps({"auths": {auth_registry.host: {"auth": token}}}))
    (b,) = image_nodes(only=["node-b"], registry_host=auth_registry.host, env={"DOCKER_CONFIG": str(cfg_dir)})
    for svc, image in ((a, mine), (b, theirs)):
        node = EnvdClient.node(svc.url, svc.token)
        try:
            assert (await node.pull(image))["pulled"]
        finally:
            await node.aclose()
        assert image in node_images(svc)
        assert password not in svc.log() and token not in svc.log()
    # and without any credentials the registry says no: an infrastructure failure naming why
    (c,) = image_nodes(only=["node-a"], registry_host=auth_registry.host)
    node = EnvdClient.node(c.url, c.token)
    try:
        with pytest.raises(EnvError) as err:
            await node.pull(theirs)
        assert err.value.reason == "pull_failed" and "no basic auth credentials" in str(err.value)
    finally:
        await node.aclose()


async def test_a_registry_that_hangs_fails_the_pull_within_its_bound(image_nodes, tiny_images) -> None:
    import socket
    import threading

    (image,) = tiny_images(1)
    # a "registry" that accepts connections and never answers
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        (a,) = image_nodes(only=["node-a"], registry_host=f"127.0.0.1:{srv.getsockname()[1]}",
                           sets=["envd.pull_stall_s=3", "envd.pull_timeout_s=8"])
        node = EnvdClient.node(a.url, a.token)
        try:
            t0 = time.monotonic()
            with pytest.raises(EnvError) as err:
                await node.pull(image)
            took = time.monotonic() - t0
        finally:
            await node.aclose()
        assert err.value.reason == "pull_failed" and image in str(err.value)
        assert 2 < took < 30, took  # the stall bound, not dockerd's own (minutes)
        assert metric(a, "envd_image_pulls_running") == 0
    finally:
        stop.set()
        t.join(timeout=5)
        for s in held:
            s.close()
        srv.close()


async def test_pulls_on_a_node_wait_for_a_free_pull_slot(image_nodes, tiny_images) -> None:
    images = tiny_images(3, payload_mb=6)
    (a,) = image_nodes(only=["node-a"], sets=["envd.max_concurrent_pulls=1"])
    node = EnvdClient.node(a.url, a.token)
    try:
        got = await asyncio.gather(*(node.pull(image) for image in images))
    finally:
        await node.aclose()
    assert all(g["pulled"] for g in got)
    events = [(line.split("pull_")[1].split()[0].strip('",:'), image)
              for line in a.log().splitlines() for image in images
              if image in line and ("pull_started" in line or "pull_done" in line)]
    assert [e for e, _ in events] == ["started", "done"] * 3, events  # one at a time
    assert metric(a, "envd_image_pulls_total", result="ok") == 3

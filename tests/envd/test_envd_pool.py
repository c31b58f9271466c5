"""The lease pool over real envd nodes and Redis: lifecycle, restart, expiry, caps, nodes."""

from __future__ import annotations

import asyncio

import docker
import httpx
import pytest
from fixtures_envd import EVAL_SCRIPT, GOOD_PATCH, SWARL

from envd.client import EnvdClient, EnvError, EnvRequestError, LeaseLost

pytestmark = pytest.mark.docker


async def _swarl(*args: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(SWARL, *args, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    _out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, err.decode()


def _exists(docker_url: str, cid: str) -> bool:
    client = docker.DockerClient(base_url=docker_url)
    try:
        client.containers.get(cid)
        return True
    except docker.errors.NotFound:
        return False
    finally:
        client.close()


async def test_lifecycle_through_the_pool(pool_server, test_image, docker_url):
    async with httpx.AsyncClient() as anon:
        assert (await anon.get(pool_server.url + "/status")).status_code == 401
    pool = EnvdClient.pool(pool_server.url, pool_server.token)
    try:
        lease = await pool.allocate(test_image, "calc-1", owner="actor-test")
        assert lease.node_url and _exists(docker_url, lease.container_id)
        res = await pool.exec(lease.lease_id, "cat calc.py; echo $X", env={"X": "y"})
        assert res.returncode == 0 and "return a - b" in res.output and res.output.strip().endswith("y")
        assert (await pool.exec(lease.lease_id, "sleep 5", timeout=1)).timed_out
        await pool.exec(lease.lease_id, "sed -i 's/a - b/a + b/' calc.py")
        patch = await pool.diff(lease.lease_id)
        assert "+    return a + b" in patch
        ev = await pool.evaluate(lease.lease_id, GOOD_PATCH, eval_script=EVAL_SCRIPT)
        assert ev.resolved and ev.returncode == 0
        ev = await pool.evaluate(lease.lease_id, "not a diff", eval_script=EVAL_SCRIPT)
        assert not ev.resolved and "not a git diff" in ev.error
        await pool.heartbeat(lease.lease_id)
        st = await pool.status()
        assert st["leases"] == 1 and st["nodes"][lease.node_url]["leases"] == 1
        await pool.close(lease.lease_id)
        assert not _exists(docker_url, lease.container_id)
        with pytest.raises(LeaseLost):
            await pool.exec(lease.lease_id, "true")
        await pool.close(lease.lease_id)  # closing twice is fine
        with pytest.raises(EnvRequestError) as e:
            await pool.allocate("swarl/no-such-image:1", "x", wait_s=1)
        assert e.value.status == 404 and "swarl/no-such-image:1" in str(e.value)
        with pytest.raises(EnvRequestError) as e:
            await pool.call("POST", "/exec", {"command": "true"})
        assert e.value.status == 422 and "lease_id" in str(e.value)
        assert (await pool.status())["leases"] == 0
    finally:
        await pool.aclose()


async def test_pool_restart_keeps_leases(pool_factory, envd_server, redis_url, test_image, docker_url):
    first = pool_factory([envd_server.url], redis_url)
    pool = EnvdClient.pool(first.url, first.token)
    lease = await pool.allocate(test_image, "calc-restart")
    await pool.exec(lease.lease_id, "touch /testbed/mark")
    await pool.aclose()
    first.kill()
    second = pool_factory([envd_server.url], redis_url, port=first.port)
    pool = EnvdClient.pool(second.url, second.token)
    try:
        res = await pool.exec(lease.lease_id, "ls /testbed/mark")
        assert res.returncode == 0
        await pool.close(lease.lease_id)
        assert not _exists(docker_url, lease.container_id)
    finally:
        await pool.aclose()


async def test_expired_lease_is_closed_and_destroyed(pool_factory, envd_server, redis_url, test_image, docker_url):
    svc = pool_factory([envd_server.url], redis_url, sets=["pool.lease_ttl_s=1.5", "pool.reap_interval_s=0.3"])
    pool = EnvdClient.pool(svc.url, svc.token)
    try:
        idle = await pool.allocate(test_image, "idle")
        kept = await pool.allocate(test_image, "kept")
        for _ in range(6):
            await asyncio.sleep(0.5)
            await pool.heartbeat(kept.lease_id)
        assert not _exists(docker_url, idle.container_id)
        with pytest.raises(LeaseLost):
            await pool.exec(idle.lease_id, "true")
        assert (await pool.exec(kept.lease_id, "true")).returncode == 0
        await pool.close(kept.lease_id)
    finally:
        await pool.aclose()


async def test_caps_hold_across_two_pools_and_allocate_waits(pool_factory, envd_server, redis_url, test_image):
    sets = ["pool.max_concurrent=3", "pool.max_per_node=2"]
    a = pool_factory([envd_server.url], redis_url, sets=sets)
    b = pool_factory([envd_server.url], redis_url, sets=sets)
    ca, cb = EnvdClient.pool(a.url, a.token), EnvdClient.pool(b.url, b.token)
    leases = []
    try:
        got = await asyncio.gather(*(c.allocate(test_image, f"cap-{i}", wait_s=1)
                                     for i, c in enumerate([ca, cb, ca, cb])), return_exceptions=True)
        leases = [g for g in got if not isinstance(g, BaseException)]
        errors = [g for g in got if isinstance(g, BaseException)]
        assert len(leases) == 2 and len(errors) == 2  # one node: per-node cap 2
        assert all(isinstance(e, EnvError) and "no capacity" in str(e) for e in errors)
        # a waiting allocate gets the slot a close frees
        waiter = asyncio.create_task(cb.allocate(test_image, "waiter", wait_s=20))
        await asyncio.sleep(1.0)
        assert not waiter.done()
        await ca.close(leases.pop().lease_id)
        leases.append(await asyncio.wait_for(waiter, 20))
    finally:
        for lease in leases:
            await ca.close(lease.lease_id)
        await ca.aclose()
        await cb.aclose()


async def test_add_and_remove_node_while_running(pool_factory, envd_server, envd_factory, redis_url, test_image):
    svc = pool_factory([envd_server.url], redis_url, sets=["pool.max_per_node=1", "pool.health_interval_s=0.5"])
    pool = EnvdClient.pool(svc.url, svc.token)
    second = envd_factory(node_id="test-pool-second")
    env = {"SWARL_ENVD_TOKEN": svc.token, "SWARL_REDIS_URL": "", "PATH": "/usr/bin:/bin"}
    leases = []
    try:
        leases.append(await pool.allocate(test_image, "n1", wait_s=1))
        with pytest.raises(EnvError):
            await pool.allocate(test_image, "n2", wait_s=0.5)
        # a node that does not answer is health-checked as such and never allocated to
        from common.services import free_port

        dead = f"http://127.0.0.1:{free_port()}"
        await pool.add_node(dead)
        st = await pool.status()
        assert st["nodes"][dead]["healthy"] is False and st["nodes"][dead]["error"]
        with pytest.raises(EnvError):
            await pool.allocate(test_image, "n2", wait_s=0.5)
        await pool.remove_node(dead)
        code, err = await _swarl("pool", "add-node", second.url, "--pool-url", svc.url, env=env)
        assert code == 0, err
        lease2 = await pool.allocate(test_image, "n2", wait_s=5)
        leases.append(lease2)
        assert {lease.node_url for lease in leases} == {envd_server.url, second.url}
        # remove-node through Redis directly (no --pool-url): the running pool sees it
        redis_env = {**env, "SWARL_REDIS_URL": redis_url, "SWARL_RUN_ID": "test"}
        code, err = await _swarl("pool", "remove-node", second.url, env=redis_env)
        assert code == 0, err
        st = await pool.status()
        assert st["nodes"][second.url]["state"] == "draining"
        assert (await pool.exec(lease2.lease_id, "echo still")).output.strip() == "still"  # draining keeps leases
        await pool.close(leases.pop(0).lease_id)
        lease3 = await pool.allocate(test_image, "n3", wait_s=5)  # never on the draining node
        leases.append(lease3)
        assert lease3.node_url == envd_server.url
        await pool.close(lease2.lease_id)
        leases.remove(lease2)
        for _ in range(30):  # the health loop forgets a drained node with no leases
            if second.url not in (await pool.status())["nodes"]:
                break
            await asyncio.sleep(0.5)
        assert second.url not in (await pool.status())["nodes"]
    finally:
        for lease in leases:
            await pool.close(lease.lease_id)
        await pool.aclose()


async def test_client_connection_errors_are_env_errors():
    from common.services import free_port

    pool = EnvdClient.pool(f"http://127.0.0.1:{free_port()}", "t", retries=1)
    try:
        with pytest.raises(EnvError):
            await pool.allocate("img", "x", wait_s=0)
    finally:
        await pool.aclose()

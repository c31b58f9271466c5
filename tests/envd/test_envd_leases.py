"""envd leases: kill -9 + restart reclaims orphans, Redis leases survive a restart, expiry."""

from __future__ import annotations

import time

import docker
import httpx
import pytest
import redis

from broker.keys import Keys

pytestmark = pytest.mark.docker


def _post(svc, path: str, body: dict) -> httpx.Response:
    return httpx.post(svc.url + path, json=body, headers={"Authorization": f"Bearer {svc.token}"},
                      timeout=60)


def _owned(docker_url: str, node_id: str) -> set[str]:
    client = docker.DockerClient(base_url=docker_url)
    try:
        return {c["Id"] for c in client.api.containers(all=True, filters={"label": f"swarl.owner={node_id}"})}
    finally:
        client.close()


def test_kill9_then_restart_destroys_orphans(envd_factory, test_image, docker_url):
    svc = envd_factory(node_id="test-orphans")
    ids = {_post(svc, "/container/create", {"image": test_image}).json()["container_id"] for _ in range(2)}
    assert ids <= _owned(docker_url, "test-orphans")
    svc.kill()
    assert ids <= _owned(docker_url, "test-orphans")  # leaked until envd comes back
    back = envd_factory(node_id="test-orphans", port=svc.port)
    assert _owned(docker_url, "test-orphans") == set()
    assert httpx.get(back.url + "/status", headers={"Authorization": f"Bearer {back.token}"}).json()[
        "active_containers"] == 0


def test_redis_leases_keep_live_containers_across_restart(envd_factory, test_image, docker_url, redis_url):
    svc = envd_factory(node_id="test-redis-leases", redis_url=redis_url)
    keep = _post(svc, "/container/create", {"image": test_image}).json()["container_id"]
    gone = _post(svc, "/container/create", {"image": test_image}).json()["container_id"]
    r = redis.Redis.from_url(redis_url)
    key = Keys("swarl", "test").envd_leases("test-redis-leases")
    assert r.zscore(key, keep) > time.time()
    svc.kill()
    r.zadd(key, {gone: time.time() - 1})  # this one's lease ran out while envd was down
    back = envd_factory(node_id="test-redis-leases", redis_url=redis_url, port=svc.port)
    assert _owned(docker_url, "test-redis-leases") == {keep}
    out = _post(back, "/container/exec", {"container_id": keep, "command": "echo alive"}).json()
    assert out["output"].strip() == "alive"
    assert _post(back, "/container/exec", {"container_id": gone, "command": "true"}).status_code == 404
    assert _post(back, "/container/destroy", {"container_id": keep}).json()["ok"]
    assert r.zscore(key, keep) is None
    r.close()


def test_expired_lease_is_destroyed_heartbeat_keeps_it(envd_factory, test_image, docker_url):
    svc = envd_factory(node_id="test-expiry", sets=["envd.lease_ttl_s=2", "envd.reap_interval_s=0.3"])
    idle = _post(svc, "/container/create", {"image": test_image}).json()["container_id"]
    kept = _post(svc, "/container/create", {"image": test_image}).json()["container_id"]
    for _ in range(8):
        time.sleep(0.5)
        assert _post(svc, "/container/heartbeat", {"container_id": kept}).json()["ok"]
    assert _owned(docker_url, "test-expiry") == {kept}
    assert _post(svc, "/container/exec", {"container_id": idle, "command": "true"}).status_code == 404
    metrics = httpx.get(svc.url + "/metrics", headers={"Authorization": f"Bearer {svc.token}"}).text
    assert 'envd_containers_destroyed_total{reason="expired"} 1.0' in metrics


def test_token_file_and_no_auth(envd_factory, tmp_path, docker_url, envd_token):
    from fixtures_envd import start_service

    tf = tmp_path / "tok"
    tf.write_text("file-token\n")
    env = {"DOCKER_HOST": docker_url, "SWARL_REDIS_URL": ""}
    svc = start_service(["envd", "serve", "--node-id", "test-tokfile", "--token-file", str(tf)],
                        "file-token", tmp_path / "logs", env=env)
    try:
        assert httpx.get(svc.url + "/healthz", headers={"Authorization": f"Bearer {envd_token}"}).status_code == 401
        assert httpx.get(svc.url + "/healthz", headers={"Authorization": "Bearer file-token"}).status_code == 200
    finally:
        svc.stop()
    svc = start_service(["envd", "serve", "--node-id", "test-noauth", "--no-auth"], "", tmp_path / "logs",
                        env=env)
    try:
        assert httpx.get(svc.url + "/healthz").status_code == 200
        assert "auth_disabled" in svc.log()
    finally:
        svc.stop()


def test_silent_exec_outlives_the_docker_client_timeout(envd_factory, test_image):
    # Docker calls time out after envd.create_timeout_s; a quiet exec must not.
    svc = envd_factory(node_id="test-quiet", sets=["envd.create_timeout_s=4"])
    cid = _post(svc, "/container/create", {"image": test_image}).json()["container_id"]
    out = _post(svc, "/container/exec", {"container_id": cid, "command": "sleep 6; echo done"}).json()
    assert out["returncode"] == 0 and out["output"].strip() == "done"
    _post(svc, "/container/destroy", {"container_id": cid})


def test_sigterm_with_memory_leases_destroys_its_containers(envd_factory, test_image, docker_url):
    svc = envd_factory(node_id="test-sigterm")
    cid = _post(svc, "/container/create", {"image": test_image}).json()["container_id"]
    assert _owned(docker_url, "test-sigterm") == {cid}
    svc.stop()  # SIGTERM: nobody could renew an in-memory lease after this
    assert _owned(docker_url, "test-sigterm") == set()

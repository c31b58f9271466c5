"""Faults on a live run (envd with real containers, pool, two CPU servers, learner, two actors):
Redis SIGKILLed and restarted from its AOF, an inference server SIGKILLed mid-episode and
restarted, the learner SIGKILLed mid-publish and restarted with --resume; and, on Sentinel, the
primary killed. After each fault the run goes on by itself (new policy versions), what was lost
is counted from an independent record (a watcher of the stream) and bounded, no server is left
draining, and at the end no container is left.

Figures (recovery times, losses) are printed as `chaos-figures {json}` lines (pytest -s) and
recorded in docs/reliability.md."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from live_run import KEYS, LiveRun

from weight_sync import checkpoints

pytestmark = [pytest.mark.chaos, pytest.mark.docker, pytest.mark.timeout(2400)]
FIRST_VERSIONS = 2


def _figures(name: str, **kw: object) -> None:
    print(f"chaos-figures {json.dumps({'fault': name, **kw})}", flush=True)


def _start(redis_url, envd_factory, pool_factory, model, image, tmp_path) -> LiveRun:
    envd = envd_factory(redis_url=redis_url)
    pool = pool_factory([envd.url], redis_url)
    run = LiveRun(redis_url, tmp_path, model, envd, pool)
    run.pool_image = image
    return run.start()


def _redis_crash(run: LiveRun, kill, restart, name: str, pause_s: float) -> None:
    """Kill Redis (or its primary) at a version >= FIRST_VERSIONS, bring it back after
    `pause_s`, and require a newer version; the ids seen in the stream before the kill and gone
    afterwards (neither in the stream nor trained) must all be from the last ~second."""
    run.wait(lambda: run.version() >= FIRST_VERSIONS, 900, f"version {FIRST_VERSIONS}")
    seen_at = dict(run.seen_at)
    v0 = run.version()
    t_kill = time.time()
    kill()
    time.sleep(pause_s)
    restart()
    t_back = time.time()
    run.wait(lambda: run.version() > v0, 600, f"a version after {v0} once Redis was back")
    recovery_s = time.time() - t_kill
    gone = {i for i in seen_at if seen_at[i] < t_kill} - run.stream_ids() - set(run.trained())
    ages = sorted(round(t_kill - seen_at[i], 2) for i in gone)
    _figures(name, outage_s=round(t_back - t_kill, 1), version_before=v0,
             first_new_version_after_s=round(recovery_s, 1), samples_seen_before=len(seen_at),
             samples_lost=len(gone), lost_ages_s=ages)
    # AOF everysec: only what reached Redis in the second (+ the watcher's 0.1 s poll) before
    assert all(a <= 2.5 for a in ages), (gone, ages)


def _no_container_left(run: LiveRun) -> None:
    run.stop()
    with httpx.Client(timeout=10) as http:
        deadline = time.monotonic() + 120
        while True:
            st = (http.get(f"{run.envd.url}/status",
                                 headers={"Authorization": f"Bearer {run.envd.token}"})).json()
            if st["active_containers"] == 0:
                return
            assert time.monotonic() < deadline, st
            time.sleep(1)


def _trained_once(run: LiveRun) -> int:
    ids = run.trained()
    assert len(ids) == len(set(ids)), "a sample was trained twice"
    return len(ids)


def test_redis_restart_server_kill_and_learner_kill_mid_publish(
        aof_redis, envd_factory, pool_factory, tiny_model_dir, test_image, tmp_path) -> None:
    run = _start(aof_redis.url, envd_factory, pool_factory, tiny_model_dir, test_image, tmp_path)
    try:
        # 1. Redis SIGKILL, restarted 5 s later from its AOF
        _redis_crash(run, aof_redis.kill, aof_redis.restart, "redis_sigkill_aof_restart", 5.0)

        # 2. an inference server SIGKILLed while it holds pinned episodes, restarted
        def pinned_server() -> str | None:
            r = run.redis()
            try:
                for sid in run.servers:
                    if r.zcount(KEYS.server_pins(sid), time.time(), "+inf") > 0:
                        return sid
            finally:
                r.close()
            return None

        sid = run.wait(pinned_server, 300, "a server holding pins")
        infra0 = run.stats().get("episodes_infra_retried", 0)
        t_kill = time.time()
        run.kill_server(sid)
        run.wait(lambda: run.stats().get("episodes_infra_retried", 0) > infra0, 180,
                 "the interrupted episodes to end as infrastructure failures")
        run.wait(lambda: run.redis().zcount(KEYS.server_pins(sid), time.time(), "+inf") == 0, 120,
                 "the dead server's pins released")
        pins_released_s = time.time() - t_kill
        run.start_server(sid)
        states = []

        def rejoined() -> bool:
            h = run.server_hash(sid)
            states.append((h.get("state"), h.get("version")))
            return h.get("state") == "ready" and int(h.get("version") or -1) >= run.version() - 0

        run.wait(rejoined, 300, f"{sid} back at the newest version")
        first_state = next(s for s in states if s[0] is not None)
        assert first_state[0] in ("starting", "updating"), states[:5]  # no pins before it caught up
        v_at_rejoin = run.version()
        _figures("inference_server_sigkill", pins_released_after_s=round(pins_released_s, 1),
                 rejoined_after_s=round(time.time() - t_kill, 1),
                 infra_retried=run.stats().get("episodes_infra_retried", 0) - infra0,
                 states_seen=sorted({s for s, _ in states if s}))
        # the interrupted attempts left no reward: their trajectories carry the InfraError only
        infra_trajs = [json.loads(p.read_text()) for p in (run.run_dir / "trajectories").rglob("traj.json")]
        infra_trajs = [t for t in infra_trajs if (t.get("error") or {}).get("type") == "InfraError"]
        assert infra_trajs and all("reward" not in t for t in infra_trajs)

        # 3. the learner SIGKILLed mid-publish (a server draining or updating for it)
        def publishing() -> str | None:
            for s in run.servers:
                h = run.server_hash(s)
                if h.get("state") in ("draining", "updating") and h.get("lease_until"):
                    return s
            return None

        deadline = time.monotonic() + 600
        while (caught := publishing()) is None:
            assert time.monotonic() < deadline, "no publish caught in 10 min"
            time.sleep(0.05)
        v_before = run.version()
        t_kill = time.time()
        run.kill_learner()
        state_at_kill = run.server_hash(caught).get("state")

        def serving_again() -> bool:
            """ready, or its lease lapsed (the pin script serves it): by Redis's clock."""
            r = run.redis()
            try:
                sec, usec = r.time()
            finally:
                r.close()
            h = run.server_hash(caught)
            lease = h.get("lease_until")
            return h.get("state") == "ready" or (bool(lease) and float(lease) < sec + usec / 1e6)

        run.wait(serving_again, 60, f"{caught} pinnable again")
        lapsed_s = time.time() - t_kill
        run.start_learner(resume=True)
        run.wait(lambda: run.version() > v_before, 600, "a version after the learner's restart")
        run.wait(lambda: all(run.server_hash(s).get("state") == "ready" for s in run.servers), 300,
                 "every server ready")
        _figures("learner_sigkill_mid_publish", server_state_at_kill=state_at_kill,
                 serving_again_after_s=round(lapsed_s, 1),
                 new_version_after_s=round(time.time() - t_kill, 1), version_before=v_before,
                 version_at_rejoin=v_at_rejoin)
        # every version a server reports is a whole, verified checkpoint
        for s in run.servers:
            v = int(run.server_hash(s).get("version") or 0)
            if v:
                checkpoints.verify(checkpoints.read_manifest(run.run_dir, v), v)
        n = _trained_once(run)
        _figures("live_run_totals", samples_trained=n, versions=run.version(), stats=run.stats())
    finally:
        _no_container_left(run)


def test_sentinel_failover_mid_run(sentinel_set, envd_factory, pool_factory, tiny_model_dir,
                                         test_image, tmp_path) -> None:
    run = _start(sentinel_set.url, envd_factory, pool_factory, tiny_model_dir, test_image, tmp_path)
    try:
        old: list[int] = []

        def kill() -> None:
            old.append(sentinel_set.kill_primary())

        def wait_failover() -> None:
            sentinel_set.wait_failover(old[0])

        _redis_crash(run, kill, wait_failover, "sentinel_primary_sigkill_failover", 0.0)
        _trained_once(run)
    finally:
        _no_container_left(run)

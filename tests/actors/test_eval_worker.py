"""The eval worker (actors/eval_worker.py) on a real Redis and real checkpoints: a version whose
weights are gone is recorded as skipped, never evaluated on other weights (no eval server is even
looked for); a restarted worker runs nothing finished again; the row rules that keep a score to
one version; the sink that puts results into metrics.jsonl once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from actors.config import ActorConfig, EvalConfig
from actors.eval_worker import EvalWorker, clean, drop_rows
from broker.evals import EvalBoard
from broker.registry import PolicyRegistry
from learner.metrics_log import EVAL_VERSION, EvalLog, eval_metrics, read_metrics
from weight_sync.checkpoints import verify, write_checkpoint

ROW = {"instance_id": "x__y-1", "image_name": "img"}


def worker(aredis, keys, tmp_path: Path, **cfg: object) -> EvalWorker:
    ev = EvalConfig(every_versions=2, rows="rows.jsonl", poll_interval_s=0.1, **cfg)  # type: ignore[arg-type]
    return EvalWorker(ev, ActorConfig(), aredis, keys, [ROW], out_dir=tmp_path / "evals",
                      pool_url="http://127.0.0.1:9", pool_token=None, api_key=None, verify=verify)


async def test_versions_without_their_weights_are_skipped_not_evaluated(aredis, keys, tmp_path) -> None:
    policy = PolicyRegistry(aredis, keys)
    run_dir = tmp_path / "run"
    # v2: its directory was deleted (retention) after it was published
    m2 = write_checkpoint(run_dir, 2, 20, [("w", torch.ones(3))], None)
    await policy.publish(2, m2)
    for f in Path(m2["path"]).iterdir():
        f.unlink()
    Path(m2["path"]).rmdir()
    # v4: a file no longer matches its sha256
    m4 = write_checkpoint(run_dir, 4, 40, [("w", torch.ones(3))], None)
    await policy.publish(4, m4)
    (Path(m4["path"]) / "model.safetensors").write_bytes(b"not the weights")
    # v6: the manifest itself is gone (retention removes it from the registry too)
    m6 = write_checkpoint(run_dir, 6, 60, [("w", torch.ones(3))], None)
    await policy.publish(6, m6)
    await policy.delete_manifest(6)

    w = worker(aredis, keys, tmp_path)
    got = [await w.step() for _ in range(3)]
    assert [r["version"] for r in got if r] == [2, 4, 6]
    assert all(r["status"] == "skipped" and r["reason"].startswith("weights gone: ") for r in got if r)
    assert "checkpoint directory" in got[0]["reason"]  # type: ignore[index]
    assert "corrupt" in got[1]["reason"]  # type: ignore[index]
    assert "no manifest" in got[2]["reason"]  # type: ignore[index]
    assert w.server is None  # no eval server was looked for, none loaded
    assert await EvalBoard(aredis, keys).begin_try(2) == 1  # no try was begun for them
    assert await w.step() is None
    # restarted: nothing finished runs again
    assert await worker(aredis, keys, tmp_path).step() is None
    assert sorted(await EvalBoard(aredis, keys).results()) == [2, 4, 6]


async def test_a_version_with_weights_waits_for_an_eval_server(aredis, keys, tmp_path) -> None:
    policy = PolicyRegistry(aredis, keys)
    m = write_checkpoint(tmp_path / "run", 2, 20, [("w", torch.ones(3))], None)
    await policy.publish(2, m)
    w = worker(aredis, keys, tmp_path)
    assert await w.step() is None  # no eval server registered: nothing recorded, no try counted
    board = EvalBoard(aredis, keys)
    assert await board.pending() == [2] and await board.running() == {}
    assert await board.results() == {}
    assert await board.begin_try(2) == 1


async def test_a_version_published_again_with_other_weights_is_due_again(aredis, keys, tmp_path) -> None:
    """A learner resumed from an earlier checkpoint publishes the numbers after it again, with
    other weights: their results describe weights that are gone, so they are evaluated again."""
    from actors.eval_worker import weights_id

    policy, board = PolicyRegistry(aredis, keys), EvalBoard(aredis, keys)
    first = write_checkpoint(tmp_path / "run", 2, 2, [("w", torch.ones(3))], None)
    await policy.publish(2, first)
    await board.schedule(2, 2)
    assert await board.take("old-worker") == 2
    assert await board.record(2, "old-worker", {"status": "done", "weights": weights_id(first)})
    w = worker(aredis, keys, tmp_path)
    assert await w.step() is None and await board.pending() == []  # same weights: left alone
    again = write_checkpoint(tmp_path / "run", 2, 2, [("w", torch.zeros(3))], None)
    assert weights_id(again) != weights_id(first)
    await policy.publish(2, again)
    assert await w.step() is None        # reopened; no eval server to run it on yet
    assert await board.pending() == [2] and await board.results() == {}
    sink = EvalLog(tmp_path, tensorboard=False)
    for weights in (weights_id(first), weights_id(again), weights_id(again)):
        sink({"version": 2, "status": "done", "step": 2, "weights": weights, "summary": {"resolve_rate": 0.5}})
    assert [r["eval_weights"] for r in read_metrics(tmp_path / "metrics.jsonl")] == \
        [weights_id(first), weights_id(again)]


def test_only_rows_all_at_the_version_count() -> None:
    assert clean({"weight_versions": ["3"], "resolved": True}, 3)
    assert clean({"weight_versions": ["3", "3"]}, 3)
    assert not clean({"weight_versions": ["2", "3"]}, 3)  # a turn on another policy
    assert not clean({"weight_versions": ["2"]}, 3)
    assert not clean({"weight_versions": [], "error": "inference_unreachable"}, 3)
    assert not clean({}, 3)


def test_drop_rows_rewrites_results(tmp_path) -> None:
    p = tmp_path / "results.jsonl"
    rows = [{"key": "a#0", "weight_versions": ["3"]}, {"key": "b#0", "weight_versions": ["2", "3"]}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert drop_rows(p, lambda r: clean(r, 3)) == 1
    assert [json.loads(x)["key"] for x in p.read_text().splitlines()] == ["a#0"]
    assert drop_rows(p, lambda r: clean(r, 3)) == 0


def test_eval_log_writes_each_evaluated_version_once(tmp_path) -> None:
    result = {"version": 4, "status": "done", "step": 8, "started": 100.0, "finished": 112.5,
              "summary": {"episodes": 4, "resolved": 1, "resolve_rate": 0.25, "pass_at_k": {"1": 0.25, "2": 0.5},
                          "errors": {"inference_unreachable": 1}, "endings": {"submitted": 3}}}
    assert eval_metrics(result) == {"eval/episodes": 4, "eval/resolved": 1, "eval/resolve_rate": 0.25,
                                    "eval/pass@1": 0.25, "eval/pass@2": 0.5, "eval/errors": 1,
                                    "eval/duration_s": 12.5}
    sink = EvalLog(tmp_path, tensorboard=True)
    sink(result)
    sink(result)                                   # handed over again (a restarted worker)
    sink({"version": 6, "status": "skipped", "reason": "weights gone: ..."})  # no numbers
    sink.close()
    again = EvalLog(tmp_path, tensorboard=False)   # a new process reads what is there
    again(result)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows == [{"step": 8, EVAL_VERSION: 4, **eval_metrics(result)}]
    assert list((tmp_path / "tb").iterdir())       # TensorBoard events written


@pytest.mark.parametrize("bad", [{"every_versions": 2}, {"every_versions": -1, "rows": "x"}])
def test_eval_config_names_what_is_wrong(bad) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"rows|every_versions"):
        EvalConfig(**bad)


def test_plot_has_the_eval_curve(tmp_path) -> None:
    from learner.metrics_log import MetricsLog
    from learner.plot import plot_run

    log = MetricsLog(tmp_path, tensorboard=False)
    for step in (1, 2, 3, 4):
        log.log(step, {"version": step, "reward_mean": 0.1 * step})
    log.log_eval(4, 4, {"eval/resolve_rate": 0.5})
    log.log_eval(2, 2, {"eval/resolve_rate": 0.25})  # finished after a later version's evaluation
    paths = {p.name: p for p in plot_run(tmp_path)}
    assert "eval.png" in paths and paths["eval.png"].stat().st_size > 0


@pytest.mark.docker
async def test_episodes_with_a_turn_at_another_version_are_run_again(
        aredis, keys, redis_url, envd_factory, pool_factory, cpu_server_factory, tiny_model_dir, test_image,
        tmp_path) -> None:
    """An eval server whose weight version changes under the evaluation (the test moves it to 99
    once the first episode is in): the episodes that ran on it are not counted for version 1; they
    run again on a fresh load, and the result holds only episodes whose every turn was at 1."""
    import asyncio

    import httpx
    from actor_services import actor_config, actor_sets, calc_row
    from fixtures_inference import wait_for
    from transformers import AutoModelForCausalLM

    from inference.client import SGLangClient

    envd = envd_factory()
    pool = pool_factory([envd.url], redis_url)
    key = "eval-worker-key"
    server = cpu_server_factory.start(tiny_model_dir, redis_url=redis_url, run_id="test", api_key=key,
                                      server_id="eval-0", extra_args=["--role", "eval"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    manifest = write_checkpoint(tmp_path / "run", 1, 1, list(model.state_dict().items()), tiny_model_dir)
    await PolicyRegistry(aredis, keys).publish(1, manifest)
    actor = actor_config(actor_sets(redis_url, tmp_path / "run", pool.url, pool.token, tiny_model_dir, key,
                                    **{"actor.step_limit": 2, "actor.sampling.max_new_tokens": 16,
                                       "actor.max_context_len": 2048})).actor
    rows = [calc_row(test_image, n) for n in range(1, 4)]
    ev = EvalConfig(every_versions=1, rows="x", max_concurrent=1, max_tries=2, poll_interval_s=0.1)
    w = EvalWorker(ev, actor, aredis, keys, rows, out_dir=tmp_path / "evals", pool_url=pool.url,
                   pool_token=pool.token, api_key=key, verify=verify, tokenizer=str(tiny_model_dir))
    results = tmp_path / "evals" / "v000001" / "results.jsonl"

    async def move_the_server() -> None:
        await wait_for(lambda: results.exists() and results.read_text().strip(), within_s=300, every=0.05)
        async with SGLangClient(server.url, api_key=key) as c:
            await c.update_weight_version("99", abort_all_requests=False)

    async def registered() -> bool:
        return any(s.state == "ready" for s in await w.servers.list(alive_only=True, role="eval"))

    await wait_for(registered, within_s=60)
    mover = asyncio.create_task(move_the_server())
    assert await w.step() is None  # try 1: episodes after the move were at 99, not 1
    await mover
    kept = [json.loads(x) for x in results.read_text().splitlines()]
    assert 1 <= len(kept) < len(rows) and all(clean(r, 1) for r in kept), kept
    result = await w.step()        # try 2: reloaded at 1, the dropped episodes run again
    assert result is not None and result["status"] == "done" and result["tries"] == 2, result
    assert result["weight_version_before"] == result["weight_version_after"] == "1"
    assert result["turn_versions"] == ["1"] and result["summary"]["episodes"] == len(rows)
    final = [json.loads(x) for x in results.read_text().splitlines()]
    assert sorted(r["key"] for r in final) == sorted(f"{r['instance_id']}#0" for r in rows)
    assert all(r["weight_versions"] == ["1"] for r in final), final
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as http:
        assert (await http.get(f"{server.url}/model_info")).json()["weight_version"] == "1"

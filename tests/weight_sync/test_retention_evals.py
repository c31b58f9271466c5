"""Retention keeps the versions due for evaluation (eval.every_versions) until an eval worker
has recorded them; then they go like any other. A real Redis and the real publisher with its
coordinator (no servers needed: retention runs on every coordinator pass)."""

from __future__ import annotations

from polling import wait_for
from ws_helpers import learner_tensors

from broker.evals import EvalBoard
from weight_sync import checkpoints, make_publisher


async def test_due_versions_stay_until_evaluated(ws_cfg, aredis, keys, tiny_model_dir) -> None:
    ws = ws_cfg.weight_sync
    ws.keep_versions = 1
    ws.wait_rollout = False
    pub = make_publisher(ws, aredis, keys, ws_cfg.run.dir, str(tiny_model_dir), api_key=ws_cfg.inference.api_key,
                         redis_cfg=ws_cfg.redis, eval_every=2)
    try:
        for v in (1, 2, 3, 4, 5):
            await pub.publish(v, v, lambda v=v: iter(learner_tensors(tiny_model_dir, v)))
        on_disk = lambda: checkpoints.on_disk_versions(ws_cfg.run.dir)  # noqa: E731

        async def settled(want: list[int]) -> bool:
            return on_disk() == want

        # 1 and 3 are not due: deleted; 2 and 4 are due: kept; 5 is the newest
        await wait_for(lambda: settled([2, 4, 5]), 20, f"due versions kept: {on_disk()}")
        board = EvalBoard(aredis, keys)
        assert await board.pending() == [2, 4]
        got = await board.take("worker-a")
        assert got == 2
        assert await board.record(2, "worker-a", {"status": "done", "resolve_rate": 0.5})
        await pub.publish(6, 6, lambda: iter(learner_tensors(tiny_model_dir, 6)))
        # v2 evaluated: deleted; v6 is due (every 2nd) and the newest
        await wait_for(lambda: settled([4, 6]), 20, f"evaluated version deleted: {on_disk()}")
    finally:
        await pub.close()

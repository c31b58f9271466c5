"""A real arq worker (broker.tasks' SwarlWorker) for the Redis outage tests:
`python chaos_worker.py REDIS_URL OUTAGE_S`. Each job XADDs its id to `chaos:out` and sleeps a
little, so a run spans the outage."""

import asyncio
import sys

from broker.tasks import create_worker, worker_settings
from common.logs import setup_logging
from swarl.config import load_config


def main() -> None:
    url, outage_s = sys.argv[1], sys.argv[2]
    setup_logging("info")
    cfg = load_config(None, [f"redis.url={url}", "run.id=test", "queue.claim_ttl_s=10",
                             "queue.claim_renew_s=1", "queue.poll_delay_s=0.2", "queue.max_tries=3",
                             f"redis.outage_s={outage_s}"], environ={})

    async def rollout(ctx, payload):
        await asyncio.sleep(0.3)
        await ctx["redis"].xadd("chaos:out", {"job": payload["job_id"], "try": ctx["job_try"]})
        return {"ok": True}

    create_worker(worker_settings(cfg.queue, cfg.keys, url, rollout, max_jobs=2, redis_cfg=cfg.redis)).run()


if __name__ == "__main__":
    main()

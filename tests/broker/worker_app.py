"""A real arq worker process for the queue tests: `python worker_app.py REDIS_URL MODE`.

MODE hang: the first try records itself and sleeps (to be SIGKILLed); later tries finish.
MODE fail: every try raises (bounded retries, then recorded as failed for good).
"""

import asyncio
import os
import sys

from arq.worker import run_worker

from broker.tasks import worker_settings
from swarl.config import load_config


def main() -> None:
    url, mode = sys.argv[1], sys.argv[2]
    cfg = load_config(None, [f"redis.url={url}", "run.id=test", "queue.claim_ttl_s=3",
                             "queue.claim_renew_s=1", "queue.poll_delay_s=0.2", "queue.max_tries=3"],
                      environ={})

    async def rollout(ctx, payload):
        redis = ctx["redis"]
        await redis.rpush("test:tries", f"{os.getpid()}:{ctx['job_try']}:{payload['job_id']}")
        if mode == "fail":
            raise RuntimeError("envd unreachable")
        if mode == "hang" and ctx["job_try"] == 1:
            await asyncio.sleep(3600)
        return {"ok": True}

    run_worker(worker_settings(cfg.queue, cfg.keys, url, rollout, max_jobs=2))


if __name__ == "__main__":
    main()

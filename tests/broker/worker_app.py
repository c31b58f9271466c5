"""A real arq worker process for the queue tests: `python worker_app.py REDIS_URL MODE`.

MODE hang: the first try records itself and sleeps (to be SIGKILLed); later tries finish.
MODE fail: every try raises (bounded retries, then recorded as failed for good).
MODE write-hang: every try writes the episode's samples the way an actor does, then the first
  try hangs in its clean-up (to be SIGKILLed between the write and the job's end).
MODE slow: every try outlives queue.job_timeout_s (2 s here).
"""

import asyncio
import os
import sys

import numpy as np

from broker.replay import ReplayWriter
from broker.tasks import create_worker, worker_settings
from broker.wire import Sample
from swarl.config import load_config


def main() -> None:
    url, mode = sys.argv[1], sys.argv[2]
    cfg = load_config(None, [f"redis.url={url}", "run.id=test", "queue.claim_ttl_s=3",
                             "queue.claim_renew_s=1", "queue.poll_delay_s=0.2", "queue.max_tries=3",
                             *(["queue.job_timeout_s=2"] if mode == "slow" else [])],
                      environ={})

    async def rollout(ctx, payload):
        redis = ctx["redis"]
        await redis.rpush("test:tries", f"{os.getpid()}:{ctx['job_try']}:{payload['job_id']}")
        if mode == "fail":
            raise RuntimeError("envd unreachable")
        if mode == "hang" and ctx["job_try"] == 1:
            await asyncio.sleep(3600)
        if mode == "slow":
            await asyncio.sleep(3600)
        if mode == "write-hang":
            sample = Sample(tokens=np.arange(4), loss_mask=np.ones(4), rollout_logprobs=np.zeros(4),
                            prompt_len=0, reward=1.0, group_id="g", sample_index=0, instance_id="i",
                            policy_version=0, sample_id=f"{payload['job_id']}:0")
            await ReplayWriter(redis, cfg.keys).add([sample], done_job=payload["job_id"])
            if ctx["job_try"] == 1:
                await asyncio.sleep(3600)  # e.g. unpinning against a loaded Redis
        return {"ok": True}

    create_worker(worker_settings(cfg.queue, cfg.keys, url, rollout, max_jobs=2)).run()


if __name__ == "__main__":
    main()

"""The scripted server's pause_generation / continue_generation (SGLang 0.5.23's modes), which
weight_sync's in-flight mode drives on the whole-loop test's and the benchmark's servers: a
request in flight during a retract pause is answered after continue at the version loaded while
it waited; an abort pause ends it at once with finish_reason abort."""

from __future__ import annotations

import asyncio
import json

from inference.client import SGLangClient

ROW = {"instance_id": "pause__t-1", "problem_statement": "[pause] nothing", "swarl_fix_command": "true"}
SLOW = json.dumps({"turns_median": 1, "turns_sigma": 0, "max_turns": 1,
                   "token_s_median": 0.1, "token_s_sigma": 0})


async def test_retract_waits_and_answers_the_new_version_abort_cuts(cpu_server_factory, tiny_model_dir):
    from transformers import AutoTokenizer

    h = cpu_server_factory.start_scripted(tiny_model_dir, [ROW], weight_version="1",
                                          extra_args=["--latency-profile", SLOW])
    ids = AutoTokenizer.from_pretrained(tiny_model_dir)("[pause] nothing")["input_ids"]
    async with SGLangClient(h.url, api_key=h.api_key, timeout_s=60) as c:
        task = asyncio.create_task(c.generate(ids, {"max_new_tokens": 64}, rid="ep:0"))
        await asyncio.sleep(0.3)
        assert (await c.pause_generation("retract"))["status"] == "ok"
        ok = await c.update_weights_from_disk("/nowhere", weight_version="2")
        assert ok["success"] is True
        await asyncio.sleep(1.0 + 0.1 * len(ids))  # past the answer's delay: still held
        assert not task.done()
        await c.continue_generation()
        res = await asyncio.wait_for(task, 30)
        assert res.weight_version == "2" and res.finish_reason["type"] == "stop" and res.output_ids

        task = asyncio.create_task(c.generate(ids, {"max_new_tokens": 64}, rid="ep2:0"))
        await asyncio.sleep(0.3)
        await c.pause_generation("abort")
        res = await asyncio.wait_for(task, 5)
        assert res.finish_reason["type"] == "abort" and res.output_ids == []
        waiting = asyncio.create_task(c.generate(ids, {"max_new_tokens": 64}, rid="ep3:0"))
        await asyncio.sleep(0.5)
        assert not waiting.done()  # new requests wait while paused
        await c.continue_generation()
        assert (await asyncio.wait_for(waiting, 30)).finish_reason["type"] == "stop"

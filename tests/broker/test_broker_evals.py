"""The eval schedule on a real Redis (broker.evals): which versions get an evaluation, who runs
each, one result per version, and what a restarted worker does."""

from __future__ import annotations

import asyncio

import pytest

from broker.evals import EvalBoard


async def test_every_nth_version_is_scheduled_once(aredis, keys) -> None:
    board = EvalBoard(aredis, keys)
    assert await board.schedule(7, 3) == [3, 6]
    assert await board.schedule(7, 3) == []       # looked at already
    assert await board.schedule(5, 3) == []       # the published version never goes down, but a stale read may
    assert await board.schedule(9, 3) == [9]
    assert await board.pending() == [3, 6, 9]
    assert await board.schedule(10, 3) == []      # 10 is not a multiple of 3
    assert await board.schedule(12, 3) == [12]
    with pytest.raises(ValueError, match="every_versions"):
        await board.schedule(20, 0)


async def test_oldest_first_one_worker_per_version_one_result(aredis, keys) -> None:
    board = EvalBoard(aredis, keys)
    await board.schedule(6, 2)                     # 2, 4, 6
    assert await board.take("A") == 2
    assert await board.take("B") == 4
    assert await board.running() == {2: "A", 4: "B"}
    # only the holder records, once; the version then leaves the pending set
    assert not await board.record(2, "B", {"status": "done"})
    assert await board.record(2, "A", {"status": "done", "summary": {"resolve_rate": 0.5}})
    assert not await board.record(2, "A", {"status": "done"})
    assert await board.pending() == [4, 6]
    assert (await board.results())[2] == {"version": 2, "status": "done", "summary": {"resolve_rate": 0.5}}
    # a try without a result gives the version back: it is the oldest again
    await board.release(4, "B")
    assert await board.take("C") == 4
    assert await board.take("C") == 6
    assert await board.take("C") is None
    with pytest.raises(ValueError, match="status"):
        await board.record(6, "C", {"status": "maybe"})


async def test_a_dead_workers_version_is_taken_over_and_a_finished_one_never_rerun(aredis, keys) -> None:
    board = EvalBoard(aredis, keys)
    await board.schedule(4, 2)                     # 2, 4
    assert await board.take("dead", ttl_s=1) == 2
    assert await board.record(4, "nobody-held-it", {"status": "skipped", "reason": "weights gone"})
    assert await board.take("B") is None           # 2 is held, 4 is finished
    await asyncio.sleep(1.3)                        # the dead worker's claim lapses
    assert await board.take("B") == 2
    assert await board.begin_try(2) == 1 and await board.begin_try(2) == 2
    assert await board.record(2, "B", {"status": "done"})
    # a worker that restarts (a new board, a new process) schedules nothing finished again
    again = EvalBoard(aredis, keys)
    assert await again.schedule(4, 2) == []
    assert await again.take("B2") is None
    assert sorted(await again.results()) == [2, 4]
    # even if the marker were lost (a version with a result is never made pending again)
    await aredis.delete(keys.eval_scheduled)
    assert await again.schedule(6, 2) == [6]
    assert await again.pending() == [6]


async def test_an_eval_server_is_held_by_one_worker(aredis, keys) -> None:
    board = EvalBoard(aredis, keys)
    assert await board.claim_server("eval-0", "A")
    assert not await board.claim_server("eval-0", "B")
    assert await board.claim_server("eval-0", "A")   # renewed
    await board.release_server("eval-0", "B")          # not B's: nothing happens
    assert not await board.claim_server("eval-0", "B")
    await board.release_server("eval-0", "A")
    assert await board.claim_server("eval-0", "B")
    assert await aredis.ttl(keys.eval_server_claim("eval-0")) > 0


async def test_status_shows_the_evaluations(aredis, keys) -> None:
    from rich.console import Console

    from broker.config import AdmissionConfig, ReplayConfig
    from broker.status import gather, render, to_json

    board = EvalBoard(aredis, keys)
    await board.schedule(6, 2)
    await board.record(2, "A", {"status": "done", "server": "eval-0",
                                "summary": {"resolve_rate": 0.5, "episodes": 4, "errors": {}}})
    await board.record(4, "A", {"status": "skipped", "reason": "weights gone: version 4: no manifest"})
    assert await board.take("A") == 6
    st = await gather(aredis, keys, ReplayConfig(), AdmissionConfig())
    assert st["evals"]["pending"] == [6] and st["evals"]["running"] == {6: "A"}
    assert st["evals"]["results"][2]["summary"]["resolve_rate"] == 0.5
    assert '"evals"' in to_json(st)
    console = Console(record=True, width=200)
    console.print(render(st))
    text = console.export_text()
    assert "evaluation during training" in text
    assert "0.500" in text and "weights gone" in text and "running" in text and "by A" in text


async def test_reopen_only_the_result_that_was_read(aredis, keys) -> None:
    board = EvalBoard(aredis, keys)
    await board.schedule(2, 2)
    assert await board.take("A") == 2
    await board.begin_try(2)
    assert await board.record(2, "A", {"status": "done", "weights": "aaa"})
    was = (await board.results())[2]
    assert not await board.reopen(2, {**was, "weights": "other"})  # not what is there
    assert await board.reopen(2, was)
    assert await board.pending() == [2] and await board.results() == {}
    assert await board.tries(2) == 0
    assert not await board.reopen(2, was)                            # gone already

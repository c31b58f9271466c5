import asyncio

from broker.admission import Admission
from broker.config import AdmissionConfig
from broker.connection import connect
from broker.keys import ARQ_IN_PROGRESS_PREFIX


async def test_fifty_concurrent_claimers_never_overshoot(redis_url, keys):
    cfg = AdmissionConfig(max_staleness=2, batch_size=4)  # capacity (2 + 0 + 1) * 4 = 12
    clients = [connect(redis_url) for _ in range(50)]
    try:
        adms = [Admission(c, keys, cfg) for c in clients]

        async def claim(a: Admission) -> int:
            won = 0
            for _ in range(5):
                won += await a.try_start()
            return won

        results = await asyncio.gather(*(claim(a) for a in adms))
        assert sum(results) == 12
        cap = await adms[0].capacity()
        assert cap["started"] == 12 and cap["capacity"] == 12 and cap["free"] == 0
        # a new policy version opens one more batch
        await clients[0].set(keys.policy_current, 1)
        results = await asyncio.gather(*(claim(a) for a in adms))
        assert sum(results) == 4
        # a failed rollout gives its slot back
        await adms[0].release()
        assert await adms[1].try_start()
        assert not await adms[1].try_start()
    finally:
        for c in clients:
            await c.aclose()


async def test_synchronous_mode_one_batch_per_version(aredis, keys):
    a = Admission(aredis, keys, AdmissionConfig(max_staleness=0, batch_size=3))
    assert [await a.try_start() for _ in range(4)] == [True, True, True, False]


async def test_release_never_negative(aredis, keys):
    a = Admission(aredis, keys, AdmissionConfig(max_staleness=0, batch_size=1))
    await a.release()
    assert (await a.capacity())["started"] == 0


async def test_release_n_gives_back_at_most_what_was_started(aredis, keys):
    a = Admission(aredis, keys, AdmissionConfig(max_staleness=0, batch_size=4))
    assert all([await a.try_start() for _ in range(4)]) and not await a.try_start()
    await a.release(3)
    assert (await a.capacity())["free"] == 3
    await a.release(10)
    assert (await a.capacity())["started"] == 0
    await a.release(0)
    assert (await a.capacity())["started"] == 0


async def test_a_version_of_several_steps_admits_each_steps_rollouts(aredis, keys):
    """learner.update_every 2 at max_staleness 0: a version is two batches of rollouts; admitting
    one batch only left the learner's second step of the version waiting forever."""
    a = Admission(aredis, keys, AdmissionConfig(max_staleness=0, batch_size=3))
    await a.set_per_version(2)
    assert [await a.try_start() for _ in range(7)] == [True] * 6 + [False]
    assert (await a.capacity())["per_version"] == 6


async def test_a_groups_first_rollout_reserves_its_siblings_slots(aredis, keys):
    """Jobs arrive out of group order (arq workers racing for a job can both skip it). Admitting
    single episodes let the first members of three groups fill a quota of two groups: at
    max_staleness 0 neither could complete and the learner waited forever."""
    a = Admission(aredis, keys, AdmissionConfig(max_staleness=0, batch_size=8))
    order = ["A", "A", "A", "B", "B", "B", "B", "C", "A"]
    assert [await a.try_start(g, 4) for g in order] == [True] * 7 + [False, True]
    assert (await a.capacity())["started"] == 8
    assert int(await aredis.get(keys.admission_group("A"))) == 0
    # the single-episode path is unchanged for jobs without a group
    assert not await a.try_start()


async def test_a_member_that_runs_again_takes_a_slot_of_its_own(aredis, keys):
    a = Admission(aredis, keys, AdmissionConfig(max_staleness=0, batch_size=4))
    assert all([await a.try_start("A", 2) for _ in range(2)])  # the whole group A
    assert await a.try_start("B", 2)  # B reserves the last two slots
    await a.release()  # a member of A failed and gave its slot back
    assert await a.try_start("A", 2)  # its retry: A's reservation is used up, one slot of its own
    assert not await a.try_start("A", 2)
    assert await a.try_start("B", 2)  # B's sibling still has its reserved slot
    assert (await a.capacity())["started"] == 4


async def test_a_group_reserves_only_when_it_fits(aredis, keys):
    a = Admission(aredis, keys, AdmissionConfig(max_staleness=0, batch_size=6))
    assert await a.try_start("A", 4)
    assert not await a.try_start("B", 4)  # 4 + 4 > 6: B waits for the next version
    await aredis.set(keys.policy_current, 1)  # capacity 12
    assert await a.try_start("B", 4)
    assert (await a.capacity())["started"] == 8


async def test_forfeit_hands_back_what_members_never_started_had_reserved(aredis, keys):
    a = Admission(aredis, keys, AdmissionConfig(max_staleness=0, batch_size=8))
    assert await a.try_start("A", 4) and await a.try_start("A", 4)
    assert await a.try_start("B", 4)
    assert not await a.try_start("C", 4)
    assert await a.forfeit("A") == 2  # the learner closed A with two members never started
    assert await a.forfeit("A") == 0  # once
    assert await a.forfeit("unknown") == 0
    assert (await a.capacity())["started"] == 6
    assert await a.try_start("A", 4)  # a member of A that starts after all: one slot of its own
    assert not await a.try_start("C", 4)  # 7 + 4 > 8
    assert 0 < await aredis.ttl(keys.admission_group("A")) <= 24 * 3600


async def test_forfeit_marks_the_group_closed_for_the_actors(aredis, keys):
    """Actors stop (or never start) the members of a group the learner closed without them."""
    a = Admission(aredis, keys, AdmissionConfig(max_staleness=0, batch_size=8))
    assert await a.try_start("A", 4) and await a.try_start("B", 4)
    assert await a.closed(["A", "B", "C"]) == set() and await a.closed([]) == set()
    await a.forfeit("A")
    await a.forfeit("C")  # closed before any member started: marked all the same
    assert await a.closed(["A", "B", "C"]) == {"A", "C"}
    assert 0 < await aredis.ttl(keys.admission_closed("A")) <= 24 * 3600


async def test_admit_answers_closed_in_the_same_call_and_takes_no_slot(aredis, keys):
    """An actor waiting for admission polls once per round: the slot, or "closed" (its group was
    closed meanwhile: it never starts), or "wait"."""
    a = Admission(aredis, keys, AdmissionConfig(max_staleness=0, batch_size=4))
    assert await a.admit("A", 4, unless_closed=True) == "started"
    assert await a.admit("B", 4, unless_closed=True) == "wait"  # A's reservation fills the batch
    await a.forfeit("A")  # three of A's slots go back; A is closed
    assert await a.admit("A", 4, unless_closed=True) == "closed"
    assert (await a.capacity())["started"] == 1  # "closed" took nothing
    assert await a.admit("A", 4) == "started"  # without unless_closed the mark is not looked at
    await a.forfeit("C")
    assert await a.admit("C", 1, unless_closed=True) == "closed"  # single episodes too
    assert await a.admit("D", 1, unless_closed=True) == "started"
    assert await a.admit(None, unless_closed=True) == "started"  # no group: nothing to be closed
    assert (await a.capacity())["started"] == 4
    assert await a.admit("E", 1, unless_closed=True) == "wait"
    off = Admission(aredis, keys, AdmissionConfig(enabled=False))
    assert await off.admit("C", 1, unless_closed=True) == "closed"
    assert await off.admit("E", 1, unless_closed=True) == "started"


async def test_a_job_keeps_its_slot_across_its_tries(aredis, keys):
    """At max_staleness 0 a member of the batch that failed and would run again gave its slot
    back; a job of the next version's group took it, and the batch never completed. A SIGKILLed
    actor's job never gave its slot back at all, and its re-run took a second one."""
    a = Admission(aredis, keys, AdmissionConfig(max_staleness=0, batch_size=5))
    assert await a.admit("A", 2, job_id="a0") == "started"
    assert await a.admit("A", 2, job_id="a1") == "started"
    assert await a.admit("B", 2, job_id="b0") == "started"
    assert await a.admit("S", 1, job_id="s0") == "started"
    assert (await a.capacity())["started"] == 5
    # a0 failed (arq runs it again) and s0's actor was SIGKILLed: neither gave anything back
    assert await a.admit("C", 1, job_id="c0") == "wait" and not await a.try_start(None)
    assert await a.admit("A", 2, job_id="a0") == "started"  # the re-runs start on their own slots
    assert await a.admit("S", 1, job_id="s0") == "started"
    assert await a.admit("B", 2, job_id="b1") == "started"  # B's sibling on B's reservation
    assert (await a.capacity())["started"] == 5
    # a job that ends without trainable samples gives its slot back, once
    assert await a.release_job("a0") and not await a.release_job("a0")
    assert (await a.capacity())["started"] == 4
    # a job whose samples were written keeps its slot; its record goes
    await a.finished("b0")
    assert not await a.release_job("b0") and (await a.capacity())["started"] == 4
    # a held slot of a group the learner closed goes back when the job runs again
    await a.forfeit("S")
    assert await a.admit("S", 1, unless_closed=True, job_id="s0") == "closed"
    assert (await a.capacity())["started"] == 3
    assert not await a.release_job("s0")
    # with admission off `started` is only a count, kept by the same records
    off = Admission(aredis, keys, AdmissionConfig(enabled=False))
    assert await off.admit("D", 1, job_id="d0") == "started" and await off.admit("D", 1, job_id="d0") == "started"
    assert (await a.capacity())["started"] == 4
    assert await off.release_job("d0") and not await off.release_job("d0")
    assert (await a.capacity())["started"] == 3


async def test_admissible_picks_the_queued_jobs_that_can_start_now(aredis, keys):
    from broker.admission import register_groups

    a = Admission(aredis, keys, AdmissionConfig(max_staleness=0, batch_size=4))
    await register_groups(aredis, keys, {"A": 2, "B": 2, "C": 2, "S": 1, "E": 2, "F": 2})

    def q(*groups: str | None) -> list[tuple[str, str | None]]:
        return [(f"{g}{i}", g) for i, g in enumerate(groups)]

    assert await a.admissible(q("C", "A", "S"), 5) == [0, 1]  # C and A fill the batch: S must wait
    assert await a.admissible(q("C", "A", "S"), 1) == [0]
    assert (await a.capacity())["started"] == 0  # it only looks
    # jobs the caller took that have not asked admit yet count first (and are not answered)
    assert await a.admissible(q("A", "S"), 5) == [0, 1]
    assert await a.admissible(q("A", "S"), 5, taken=[("c9", "C")]) == [0]
    for job, g in [("a0", "A"), ("a1", "A"), ("b0", "B")]:
        assert await a.admit(g, 2, job_id=job) == "started"
    # a0 will run again: it holds its slot; next-version groups stay queued; B's sibling is taken
    queued = [("c0", "C"), ("s0", "S"), ("x", None), ("a0", "A"), ("b1", "B"), ("b1", "B")]
    assert await a.admissible(queued, 5) == [3, 4]
    await a.forfeit("C")
    assert await a.admissible(q("C", "S"), 5) == []
    assert await a.admissible(q("C", "S"), 5, unless_closed=True) == [0]  # it ends at once
    await aredis.set(keys.policy_current, 1)  # four more slots
    # D (unregistered: one), S and E fill them; E's sibling has its reservation, F must wait
    assert await a.admissible(q("D", "S", "E", "F", "E"), 5) == [0, 1, 2, 4]
    off = Admission(aredis, keys, AdmissionConfig(enabled=False))
    assert await off.admissible(q("C", "S", "A"), 2) == [0, 1]
    await aredis.set(keys.policy_current, 2)  # eight free slots from here
    assert await a.admissible(q("E", "F", "F", "G"), 5) == [0, 1, 2, 3]
    # another worker runs F1 (arq keeps it queued till it ends): it is counted, not answered
    await aredis.set(ARQ_IN_PROGRESS_PREFIX + "F1", 1)
    assert await a.admissible(q("E", "F", "F", "G"), 5) == [0, 2, 3]
    # this worker's own job, taken and queued still, is counted once (as taken)
    assert await a.admissible(q("G", "G", "G"), 9, taken=[("G1", "G"), ("x", None)]) == [0, 2]
    assert await a.admissible([], 3) == [] and await a.admissible(q("S"), 0) == []

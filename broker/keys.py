"""Every Redis key swarl uses, in one place (docs/redis-keys.md documents each one).

All keys live under `<prefix>:{<run>}:` — the run id in a hash tag, so one Redis can hold
several runs and, on Redis Cluster, all of a run's keys share a slot (Lua and MULTI work).
arq's own keys (`arq:job:<id>`, `arq:in-progress:<id>`, `arq:result:<id>`, `arq:retry:<id>`)
cannot take a prefix; swarl's job ids carry the run id instead.
"""

from __future__ import annotations

from dataclasses import dataclass

# TTLs and intervals that more than one module relies on (seconds).
ACTOR_TTL_S = 30           # an actor's registry entry lives this long past its last heartbeat
SERVER_TTL_S = 30          # an inference server's heartbeat goes stale after this
PIN_TTL_S = 120            # a pin lives this long past its holder's last renewal
# envd's lease (envd_leases) on a pool's container is this many pool leases long (pool.lease_ttl_s),
# renewed by every call the pool forwards: a container whose pool lease vanished still expires.
POOL_CONTAINER_TTL_FACTOR = 2
ARQ_IN_PROGRESS_PREFIX = "arq:in-progress:"
EVAL_CLAIM_TTL_S = 60      # an eval worker's claim on a version or an eval server, renewed while it works


@dataclass(frozen=True)
class Keys:
    """The key names of one run. Built from the config in one place (SwarlConfig.keys); every
    process of a run must agree on both parts, so neither has a default."""

    prefix: str
    run: str

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{{self.run}}}"

    # -- task queue (arq) -------------------------------------------------------------
    @property
    def queue(self) -> str:
        """arq queue: sorted set of job ids (score = enqueue time ms)."""
        return f"{self.base}:queue"

    @staticmethod
    def group_id(instance_id: str, group: int) -> str:
        """A group of samples of one instance (group = the epoch that enqueued it)."""
        return f"{instance_id}:g{group}"

    def job_id(self, instance_id: str, group: int, index: int) -> str:
        """Deterministic job id: enqueueing the same data twice adds nothing. `group_of` reads
        the group back."""
        return f"{self.run}:{self.group_id(instance_id, group)}:s{index}"

    @property
    def jobs_failed(self) -> str:
        """Hash job_id -> JSON {reason, tries, time}: jobs that failed for good."""
        return f"{self.base}:jobs:failed"

    @property
    def jobs_retrying(self) -> str:
        """Sorted set job_id -> when its next try is due (ms): jobs swarl sent back with arq's
        Retry. arq's retry moves a job to the back of the queue, past the ids a worker reads in one
        poll (its queue_read_limit); workers look at these first (broker.tasks.SwarlWorker)."""
        return f"{self.base}:jobs:retrying"

    @property
    def jobs_done(self) -> str:
        """Set of job ids whose samples reached the replay stream."""
        return f"{self.base}:jobs:done"

    # -- replay stream ----------------------------------------------------------------
    @property
    def replay(self) -> str:
        """Stream of encoded samples (field `s`), read by the learner's consumer group."""
        return f"{self.base}:replay"

    @property
    def replay_dead(self) -> str:
        """Dead-letter stream: entries that failed to decode, with the error."""
        return f"{self.base}:replay:dead"

    # -- policy versions --------------------------------------------------------------
    @property
    def policy_current(self) -> str:
        """String: the newest published policy version (int)."""
        return f"{self.base}:policy:current"

    @property
    def policy_manifests(self) -> str:
        """Hash version -> JSON manifest {path, format, files{name: sha256}, step, time}."""
        return f"{self.base}:policy:manifests"

    # -- inference servers ------------------------------------------------------------
    @property
    def servers(self) -> str:
        """Set of server ids."""
        return f"{self.base}:servers"

    def server(self, server_id: str) -> str:
        """Hash: url, version, state (starting/ready/draining/updating/failed), heartbeat, error,
        lease_until (the coordinator's draining/updating lease, Redis time)."""
        return f"{self.base}:server:{server_id}"

    def server_pins(self, server_id: str) -> str:
        """Sorted set pin_id -> expiry (unix s): episodes pinned to this server."""
        return f"{self.base}:server:{server_id}:pins"

    @property
    def weight_groups(self) -> str:
        """Hash server_id -> the name of the weight-update group a learner made with that server
        (weight_sync's distributed transport): the next learner destroys it on the server if the
        last one died without doing so."""
        return f"{self.base}:weight_sync:groups"

    # -- actors -----------------------------------------------------------------------
    @property
    def actors(self) -> str:
        """Set of actor ids (members whose hash expired are pruned by readers)."""
        return f"{self.base}:actors"

    def actor(self, actor_id: str) -> str:
        """Hash with TTL: host, pid, started, heartbeat, running, totals."""
        return f"{self.base}:actor:{actor_id}"

    # -- admission (staleness control) ------------------------------------------------
    @property
    def admission_started(self) -> str:
        """Counter: rollouts started (and not released) since the run began."""
        return f"{self.base}:admission:started"

    @property
    def admission_per_version(self) -> str:
        """Int: episodes the learner trains per policy version (batch_size x update_every);
        absent: admission.batch_size."""
        return f"{self.base}:admission:per_version"

    def admission_group(self, group_id: str) -> str:
        """Int with TTL: slots a group's first rollout reserved for its siblings, not yet taken
        (0: all taken)."""
        return f"{self.base}:admission:group:{group_id}"

    @property
    def group_sizes(self) -> str:
        """Hash group_id -> its number of members, written at enqueue: how many slots a group's
        first member reserves, looked up before a job is taken from the queue."""
        return f"{self.base}:admission:group_sizes"

    def group_of(self, job_id: str) -> str | None:
        """The group id within a job id made by `job_id` (None if it is not one)."""
        head, sep, tail = job_id.rpartition(":s")
        if not sep or not tail.isdigit() or not head.startswith(f"{self.run}:"):
            return None
        return head[len(self.run) + 1:]

    def admission_job(self, job_id: str) -> str:
        """"1" with TTL: the job was admitted and holds its slot across its tries, until it ends
        without trainable samples (the slot goes back) or with them (the record is dropped)."""
        return f"{self.base}:admission:job:{job_id}"

    def admission_closed(self, group_id: str) -> str:
        """"1" with TTL: the learner closed the group before all its members arrived (trained
        without them, or dropped); a member still running or not started can only be dropped."""
        return f"{self.base}:admission:closed:{group_id}"

    # -- running episodes (broker.running) ----------------------------------------------
    @property
    def running_oldest(self) -> str:
        """Sorted set job_id -> the oldest policy version the running episode may have generated
        with (its version at pin): the learner holds a step that would make one stale."""
        return f"{self.base}:running:oldest"

    @property
    def running_seen(self) -> str:
        """Sorted set job_id -> when its actor last refreshed it (Redis time, ms): entries of a
        dead actor lapse after broker.running.RUNNING_TTL_S."""
        return f"{self.base}:running:seen"

    @property
    def running_started(self) -> str:
        """Sorted set job_id -> when it was listed (pinned; Redis time, ms): how long it has run."""
        return f"{self.base}:running:started"

    @property
    def running_last_turn(self) -> str:
        """Sorted set job_id -> when its last turn was generated (Redis time, ms); absent while
        it generates. Past it, the episode grades."""
        return f"{self.base}:running:last_turn"

    @property
    def running_tokens(self) -> str:
        """Sorted set job_id -> tokens its server generated so far (refreshed with `seen`)."""
        return f"{self.base}:running:tokens"

    @property
    def running_ended(self) -> str:
        """List, newest first, of the last broker.running.ENDED_KEPT listings that ended:
        "<ms listed> <ms from its last turn, -1: none> <1: it ran to its end, 0: stopped>" — the
        run's own episode durations, which the learner's hold rule weighs (learner.hold)."""
        return f"{self.base}:running:ended"

    # -- stats --------------------------------------------------------------------------
    @property
    def stats(self) -> str:
        """Hash of run-wide counters (samples_written, episodes_*, dropped_*, ...)."""
        return f"{self.base}:stats"

    @property
    def samples_rate(self) -> str:
        """Sorted set of per-minute buckets `minute:count`, for samples/min in `swarl status`."""
        return f"{self.base}:stats:samples_per_min"

    # -- envd pool ----------------------------------------------------------------------
    @property
    def pool_nodes(self) -> str:
        """Hash node_url -> JSON {state: active/draining, added, healthy, checked, error, running,
        node_id (the envd's own id, from its /healthz: image_nodes is keyed by it)}."""
        return f"{self.base}:pool:nodes"

    @property
    def pool_leases(self) -> str:
        """Sorted set lease_id -> expiry (unix s)."""
        return f"{self.base}:pool:leases"

    def pool_lease(self, lease_id: str) -> str:
        """Hash: container_id, node_url, state (creating/active), image, instance_id, owner, created."""
        return f"{self.base}:pool:lease:{lease_id}"

    @property
    def pool_load(self) -> str:
        """Hash node_url -> number of leases on it; kept by the pool's reserve and release
        scripts, in step with pool_leases."""
        return f"{self.base}:pool:load"

    def image_nodes(self, image: str) -> str:
        """Hash node_id -> `ready`, or `pulling:<unix s>` (a lease was placed there and the
        node is pulling). Written by envd as images arrive and leave (and by the pool's reserve
        script for `pulling`); read by the reserve script to place leases where the image is."""
        return f"{self.base}:images:{image}"

    def envd_images(self, node_id: str) -> str:
        """Hash image -> last use (unix s) of the task images envd on `node_id` manages: its
        own record, for LRU eviction and to withdraw its entries from image_nodes."""
        return f"{self.base}:envd:{node_id}:images"

    def envd_leases(self, node_id: str) -> str:
        """Sorted set container_id -> lease expiry, kept by the envd on node `node_id`."""
        return f"{self.base}:envd:{node_id}:leases"

    # -- evaluation during training (broker.evals) ---------------------------------------
    @property
    def eval_pending(self) -> str:
        """Sorted set version -> version: versions due for evaluation (every eval.every_versions-th
        published one) without a result yet; the oldest is taken first."""
        return f"{self.base}:eval:pending"

    @property
    def eval_scheduled(self) -> str:
        """Int: the newest policy version the eval schedule has looked at (versions up to it were
        added to eval_pending once, never again)."""
        return f"{self.base}:eval:scheduled"

    def eval_claim(self, version: int) -> str:
        """String with TTL (EVAL_CLAIM_TTL_S): the id of the eval worker evaluating `version`,
        renewed while it runs; a worker that dies lets it lapse and another takes the version."""
        return f"{self.base}:eval:claim:{version}"

    def eval_server_claim(self, server_id: str) -> str:
        """String with TTL (EVAL_CLAIM_TTL_S): the id of the eval worker that owns eval server
        `server_id`: only it loads weights there."""
        return f"{self.base}:eval:server:{server_id}"

    @property
    def eval_tries(self) -> str:
        """Hash version -> tries begun (a try ends in a result, or in a failure that leaves the
        version pending until eval.max_tries)."""
        return f"{self.base}:eval:tries"

    @property
    def eval_results(self) -> str:
        """Hash version -> JSON {version, status (done/skipped/failed), reason, step, server, weights,
        weight_version_before/after, turn_versions, summary, started, finished}: one per version,
        written once (dropped when the version is published again with other weights)."""
        return f"{self.base}:eval:results"

    # -- learner ------------------------------------------------------------------------
    @property
    def learner_state(self) -> str:
        """Hash: step, version, consumed, held, last_ack_id, heartbeat, status, holding."""
        return f"{self.base}:learner"

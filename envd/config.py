"""Config sections owned by envd: the exec daemon and the lease pool."""

from __future__ import annotations

from typing import Literal

from pydantic import ByteSize, Field

from common.settings import Section

# Of Docker's default set these stay; dropped: NET_RAW, NET_BIND_SERVICE (no network), MKNOD (no
# device nodes), SYS_CHROOT, SETPCAP, SETFCAP (file capabilities: moot under no-new-privileges),
# AUDIT_WRITE. CapEff 0x00000000000000fb.
TASK_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")


class EnvdConfig(Section):
    host: str = Field("127.0.0.1", description="Bind address of `swarl envd serve`.")
    port: int = Field(5000, description="Port of `swarl envd serve`.")
    token: str | None = Field(None, description="Bearer token envd and the pool require (or SWARL_ENVD_TOKEN).")
    node_id: str | None = Field(
        None, description="This node's id (container label swarl.owner, lease key); default <hostname>-<port>.")
    docker_url: str | None = Field(
        None, description="Docker engine URL; default DOCKER_HOST, the system socket or swarl's private dockerd.")
    network: str = Field("none", description="Docker network mode of task containers (none = no network).")
    network_disabled: bool = Field(
        True, description="With network `none`: containers are created with Docker's NetworkDisabled, which "
        "leaves Docker's network stack out (no libnetwork sandbox or endpoint, no prestart hook running dockerd "
        "again per start): runc still gives each container a network namespace of its own with only loopback "
        "up, and the container's first process writes the /etc/hosts Docker would have (localhost). A third "
        "less CPU per container (benchmarks/RESULTS.md docker_op_cost), and out of reach of Docker "
        "20.10's endpoint deadlock under container churn (moby/moby#46661). false: Docker's own `none` "
        "network. Other network modes ignore it.")
    memory: str = Field("4g", description="Memory limit per container (docker syntax, e.g. 4g).")
    pids_limit: int = Field(1024, description="Max processes per container.")
    cpus: float = Field(1.0, description="CPU limit per container (cores).")
    cap_add: list[str] = Field(
        default_factory=lambda: list(TASK_CAPS),
        description="Capabilities task containers keep (all others dropped; docs/security.md): root's file "
                    "semantics (CHOWN, DAC_OVERRIDE, FOWNER, FSETID) and uid changes (SETUID, SETGID) as the "
                    "official harness has them, and KILL so timeouts reach processes that changed uid.")
    lease_ttl_s: float = Field(
        1800.0, description="A container is destroyed this long after its last use or heartbeat.")
    leases_in_redis: bool = Field(
        True, description="Keep leases in Redis (envd_leases key) when redis.url is set, so a "
                          "restarted envd keeps its live containers; else leases are in memory.")
    reap_interval_s: float = Field(5.0, description="How often expired containers are destroyed.")
    exec_threads: int = Field(64, description="Max Docker calls running at once (worker threads).")
    output_cap_bytes: int = Field(
        262144, description="Max exec output returned; beyond it head and tail are kept, the middle marked cut.")
    eval_output_tail: int = Field(20000, description="Characters of an evaluation log returned (the tail).")
    kill_grace_s: float = Field(
        5.0, description="After a timeout, how long envd waits for the killed command before killing its process tree.")
    create_timeout_s: float = Field(120.0, description="Default bound on creating and starting a container.")
    exec_shell: bool = Field(
        True, description="Agents' containers run a shell server as their main process and envd runs their "
        "commands through it (envd/shell.py): no `docker exec` per command. Grading containers never do.")
    warm_per_image: int = Field(
        0, ge=0, description="Started containers kept ready per recently created image, handed out "
        "by the next create (its own and the grading one) instead of creating on the episode's "
        "path (envd.warm). 0: off.")
    warm_max: int = Field(16, ge=0, description="At most this many warm containers on the node in all.")
    warm_idle_s: float = Field(
        300.0, gt=0, description="Warm containers of an image no create asked for this long are destroyed.")
    grade_cache_entries: int = Field(
        1024, ge=0, description="Verdicts of graded rows kept in envd's memory and answered again when the same "
        "patch is graded against the same image, row, eval script, cwd and time bound (envd.grade_cache): a "
        "grading of a key already running is waited for, not run twice. Kept only where the tests ran to their "
        "own exit in time (or the patch was refused as a reward hack); a flaky test's first outcome stands for "
        "that patch while the entry lives. 0: every evaluation grades afresh.")
    grade_cache_ttl_s: float = Field(3600.0, gt=0, description="How long a kept verdict is answered again.")
    reuse_per_image: int = Field(
        0, ge=0, description="Containers of an image kept after their lease, reset to the image's state "
        "and handed to the next create that allows it (the pool's leases; never a grading container): "
        "restarted (no process survives), nothing outside the repository changed in Docker's view of "
        "the writable layer, the repository restored and checked against the fresh container's "
        "(envd.reuse). A container that fails any check is destroyed. 0: off (measured no faster than "
        "a fresh create on the demo: benchmarks/RESULTS.md demo_episode_cost).")
    reuse_max: int = Field(16, ge=0, description="At most this many containers kept or being reset for reuse on the node.")
    reuse_max_uses: int = Field(8, ge=2, description="Leases one container serves at most before it is destroyed.")
    reuse_idle_s: float = Field(120.0, gt=0, description="A reset container no create took for this long is destroyed.")
    reuse_max_repo_bytes: ByteSize = Field(
        ByteSize(64 * 1024 * 1024), description="Largest repository (the lease's cwd, as a tar) kept in "
        "memory per image to restore it; an image with a larger one is not reused.")
    eval_timeout_s: float = Field(3600.0, description="Default bound on running an evaluation script.")
    grader_off: list[Literal["static", "canaries", "audit"]] = Field(
        default_factory=list,
        description="Layers of the reward-hack defence left out, for tests that show each other layer "
                    "alone (docs/security.md): the static look at the patch, the referee's canaries, its "
                    "audit hook. Never for training: envd logs a warning when it is set.")
    max_body_bytes: int = Field(16 * 1024 * 1024, description="Larger request bodies get 413.")
    registry: str | None = Field(
        None, description="Registry (host[:port][/namespace]) missing task images are pulled from when "
                          "their name has no registry host or names docker.io; none: pull by the name as given.")
    registry_username: str | None = Field(
        None, description="Registry user; unset: Docker's own credentials (~/.docker/config.json, DOCKER_CONFIG).")
    registry_password: str | None = Field(None, description="Registry password or token (never logged).")
    max_concurrent_pulls: int = Field(2, ge=1, description="Image pulls at once on this node (more wait their turn).")
    pull_timeout_s: float = Field(
        1800.0, description="Bound on one image pull (waiting for a pull slot included); beyond it the "
                            "create fails as an infrastructure error.")
    pull_stall_s: float = Field(120.0, description="A pull whose progress stream stays silent this long fails.")
    pull_log_interval_s: float = Field(10.0, description="How often a running pull logs its progress.")
    image_budget: ByteSize = Field(
        ByteSize(0), description="Disk budget of the node's image store (docker system df's layer bytes, "
                                 "e.g. 200GB); over it, the least recently used task images no container "
                                 "uses are removed. 0: no budget.")
    image_keep: list[str] = Field(
        default_factory=lambda: ["swarl/base:*", "*sweb.base.*", "*sweb.env.*"],
        description="Image name patterns (fnmatch) the budget never removes (base images).")
    image_gc_interval_s: float = Field(60.0, description="How often the image budget is checked (also after each pull).")


class PoolConfig(Section):
    host: str = Field("127.0.0.1", description="Bind address of `swarl pool serve`.")
    port: int = Field(18090, description="Port of `swarl pool serve`.")
    exec_urls: list[str] = Field(default_factory=list, description="envd URLs the pool leases from.")
    url: str | None = Field(None, description="Where actors reach the pool.")
    max_concurrent: int = Field(128, description="Max leases at once over all nodes (all pool processes together).")
    max_per_node: int = Field(15, description="Max leases at once on one node (all pool processes together).")
    lease_ttl_s: float = Field(300.0, description="A lease expires this long after its last use or heartbeat.")
    allocate_wait_s: float = Field(60.0, description="How long /allocate waits for capacity before 503.")
    health_interval_s: float = Field(5.0, description="How often each node's /healthz is checked.")
    health_stale_s: float = Field(20.0, description="A node whose last good check is older is not allocated to.")
    reap_interval_s: float = Field(2.0, description="How often expired leases are closed.")
    image_affinity: bool = Field(
        True, description="Place a lease on a node that holds (or is pulling) its image while one has "
                          "room; false: always the least-loaded node.")
    pulling_stale_s: float = Field(
        2400.0, description="A node marked as pulling an image for this long without it arriving no "
                            "longer attracts that image's leases (above envd.pull_timeout_s).")
    node_timeout_s: float = Field(30.0, description="HTTP timeout for short calls to nodes (exec adds its own timeout).")
    max_body_bytes: int = Field(16 * 1024 * 1024, description="Larger request bodies get 413.")

"""Config section owned by weight_sync."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from common.settings import Section


class WeightSyncConfig(Section):
    transport: Literal["disk", "distributed"] = Field(
        "disk",
        description="How a new version reaches running servers: disk (safetensors + "
        "/update_weights_from_disk) or distributed (torch.distributed broadcast, NCCL on GPU, "
        "gloo on CPU). A checkpoint is written to disk either way: servers that join or restart "
        "load from it, and so does a server whose registered meta is missing or invalid (its "
        "tensor-parallel size, the size of its group, is unknown).",
    )
    rollout_mode: Literal["pinned", "in-flight"] = Field(
        "pinned",
        description="pinned: an episode keeps one server at one version from its first turn to "
        "its last; a server is updated once its pinned episodes have ended (draining). in-flight: "
        "a server is updated without draining (generation paused in SGLang's retract mode, the "
        "version loaded, generation continued): running episodes go on under the new weights, each "
        "token records the version that produced it, and the staleness bound applies to a sample's "
        "oldest trained token. See docs/weight_sync.md, 'Rollout modes'.",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="Distributed backend: auto = nccl when the learner has CUDA "
        "(torch.cuda.is_available(); each bucket is moved to its GPU before the broadcast), else gloo.",
    )
    keep_versions: int = Field(
        3, ge=1, description="Checkpoints kept under <run.dir>/weights; older ones are deleted "
        "only when no server is at, or being updated to, them, and (eval.every_versions) no evaluation of them is due.",
    )
    bucket_mb: float = Field(512.0, gt=0, description="Distributed: bytes per broadcast bucket (MiB).")
    shard_mb: float = Field(
        4096.0, gt=0, description="Disk: largest safetensors shard (MiB); bigger models get an index file."
    )
    max_updating: int = Field(
        1, ge=1, description="Servers loading a version at the same time, and servers still "
        "taking new pins drained at the same time; the rest keep serving. A server behind a newer "
        "ready one takes no new pins: it drains at once, without counting here.",
    )
    min_ready: int = Field(
        1, ge=0, description="Ready servers kept taking pins during a rollout: a server is drained "
        "only while at least this many others stay ready (a lone server is still updated). "
        "0: up to max_updating servers at once, whatever is left serving.",
    )
    drain_timeout_s: float = Field(
        300.0, gt=0, description="How long a draining server waits for its pinned episodes to end."
    )
    drain_timeout_action: Literal["wait", "proceed"] = Field(
        "wait",
        description="At drain_timeout_s: wait (keep waiting, logged every drain_timeout_s) or "
        "proceed (update anyway, with generation paused around the load as in-flight mode does, so "
        "no turn runs on a half-loaded model; the episodes still pinned are counted in "
        "weights_episodes_version_changed, and their next answer carries the new version, which a "
        "pinned actor refuses: weight_version_mismatch ends the episode as an infrastructure failure).",
    )
    lease_s: float = Field(
        20.0, gt=0, description="A server the coordinator drains or updates holds that state only "
        "while the coordinator renews this lease (every lease_s / 4); a coordinator that dies "
        "(the learner killed mid-publish) leaves a lease that lapses, and the server then takes "
        "pins again at the version it reports, until the next coordinator brings it forward.",
    )
    update_timeout_s: float = Field(
        600.0, gt=0, description="Bound on one server's load (disk request or all buckets)."
    )
    verify_timeout_s: float = Field(
        30.0, gt=0, description="Bound on checking that a server reports the new weight_version."
    )
    retry_failed_s: float = Field(
        30.0, gt=0, description="A server whose update failed is tried again after this long."
    )
    poll_interval_s: float = Field(
        1.0, gt=0, description="How often the coordinator looks at the server registry."
    )
    master_address: str = Field(
        "127.0.0.1", description="Distributed: address servers use to reach the learner's rank 0."
    )
    group_timeout_s: float = Field(
        60.0, gt=0, description="Distributed: bound on making a group and on each bucket (the "
        "server's answer and the completion of rank 0's broadcast together). A gloo group's own "
        "timeout is this bound; an NCCL group's is twice it, so rank 0 gives up, and aborts the "
        "group, before NCCL's watchdog would end the learner.",
    )
    begin_timeout_s: float = Field(
        60.0, gt=0, description="Distributed: bound on a server's /begin_weight_update answer (SGLang "
        "answers once its requests in flight have ended). Past it, or on a refusal, nothing has been "
        "sent: the server keeps its weights and is updated from disk.",
    )
    group_store_prefix: bool = Field(
        True, description="Distributed: wrap the rendezvous store in PrefixStore(group_name), as "
        "SGLang servers do on their side; both sides of a group must agree.",
    )
    disk_write_defer_s: float = Field(
        30.0, ge=0, description="Distributed: the disk copy (for servers that join later) is written "
        "once the broadcasts that could start at publish time are done, or after this many seconds.",
    )
    verify_own_checkpoints: bool = Field(
        False, description="Re-hash a checkpoint this learner process has just written before "
        "servers load it (its sha256s were computed from the very bytes written). Checkpoints "
        "from anywhere else (another or a restarted learner) are always verified.",
    )
    wait_rollout: bool = Field(
        False, description="publish() returns only after every live server has tried the new "
        "version (tests, synchronous runs); else the rollout runs in the background.",
    )
    stop_rollout_timeout_s: float = Field(
        60.0, ge=0, description="On a clean stop (SIGTERM), the learner waits up to this long for "
        "the last version it published to reach every live server before its coordinator stops, "
        "so servers are not left a version behind the registry's current one (0: stop at once; "
        "the next learner or coordinator brings them forward either way).",
    )
    api_key: str | None = Field(
        None, description="Bearer token for the inference servers (else inference.api_key or "
        "SWARL_INFERENCE_API_KEY).",
    )

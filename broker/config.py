"""Config sections owned by the broker: Redis connection, queue, replay stream, admission."""

from __future__ import annotations

from pydantic import Field

from common.settings import Section


class RedisConfig(Section):
    url: str | None = Field(
        None,
        description="redis://, rediss://, unix:// or redis+sentinel://host:port[,host:port]/master[/db]. "
        "Unset: a command that needs Redis starts a private redis-server for its lifetime.",
    )
    prefix: str = Field("swarl", description="First component of every key: <prefix>:{<run>}:...")
    socket_timeout_s: float = Field(30.0, description="Per-command socket timeout (seconds).")
    connect_timeout_s: float = Field(5.0, description="TCP connect timeout (seconds).")
    outage_s: float = Field(120.0, gt=0, description="How long a command keeps retrying while Redis is "
                            "unreachable (restart, failover, network blip), with backoff and a log line "
                            "per attempt; past it the error reaches the caller and the process exits "
                            "for its supervisor to restart.")
    retry_backoff_s: float = Field(0.2, description="First backoff between reconnect attempts; doubles "
                                   "up to retry_backoff_max_s.")
    retry_backoff_max_s: float = Field(1.0, description="Longest backoff between reconnect attempts "
                                       "(bounds how long a process idles after Redis is back).")
    max_connections: int = Field(64, description="Connection pool size per process.")
    appendonly: bool = Field(True, description="Private redis-server only: AOF with appendfsync everysec.")


class QueueConfig(Section):
    job_timeout_s: int = Field(3600, description="Longest a healthy worker may run one episode job; past "
                               "it the job is retried, then recorded in jobs:failed.")
    claim_ttl_s: int = Field(15, description="A running job's claim key expires this long after its "
                             "worker last renewed it; a SIGKILLed worker's job runs again after it.")
    claim_renew_s: float = Field(4.0, description="How often a running job renews its claim.")
    max_tries: int = Field(3, description="Attempts per job before it is recorded as failed for good.")
    poll_delay_s: float = Field(0.5, description="arq poll interval when the queue is empty.")


class ReplayConfig(Section):
    group: str = Field("learner", description="Consumer group the learner reads the replay stream with.")
    read_count: int = Field(64, description="Entries per XREADGROUP.")
    block_ms: int = Field(1000, description="XREADGROUP block time (ms).")
    write_batch: int = Field(32, description="Samples per pipelined XADD round trip.")


class AdmissionConfig(Section):
    max_staleness: int = Field(2, description="How many policy versions a rollout may lag (eta). 0 = synchronous.")
    batch_size: int = Field(8, description="Rollouts (episodes) consumed per policy version (B in the admission rule).")
    enabled: bool = Field(True, description="Off: actors start rollouts without the staleness bound.")

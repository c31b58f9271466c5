"""Prometheus metrics of envd and the pool (one registry per app, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "EnvdMetrics", "PoolMetrics", "generate_latest"]


class EnvdMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.containers = Gauge("envd_containers", "Containers this envd owns now.", registry=r)
        self.created = Counter("envd_containers_created", "Containers created.", registry=r)
        self.destroyed = Counter("envd_containers_destroyed", "Containers destroyed, by reason.",
                                 ["reason"], registry=r)
        self.execs = Counter("envd_execs", "Execs run, by outcome (ok, nonzero, timeout, error).",
                             ["outcome"], registry=r)
        self.exec_via = Counter("envd_exec_via", "Execs by how they ran: shell (the agent container's shell "
                                "server, envd.exec_shell) or exec (docker exec).", ["via"], registry=r)
        self.ended_by_command = Counter(
            "envd_containers_ended_by_command", "Agent containers whose main process one of their own "
            "commands ended (kill -9 -1): later commands and the diff answer so; never a lost lease.",
            registry=r)
        self.exec_seconds = Histogram(
            "envd_exec_duration_seconds", "Exec wall time inside envd.", registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 180, 600))
        self.create_seconds = Histogram(
            "envd_create_duration_seconds", "Container create+start time.", registry=r,
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 120))
        self.warm_takes = Counter("envd_warm_takes", "Creates by whether a warm container served "
                                  "them (hit) or one was created (miss); only with envd.warm_per_image.",
                                  ["result"], registry=r)
        self.reuse_takes = Counter("envd_reuse_takes", "Creates allowing reuse, by whether a reset "
                                   "container served them (hit) or not (miss); only with envd.reuse_per_image.",
                                   ["result"], registry=r)
        self.reuse_resets = Counter("envd_reuse_resets", "Resets of used containers, by result (ok: kept for "
                                    "reuse; failed: destroyed).", ["result"], registry=r)
        self.reuse_reset_seconds = Histogram(
            "envd_reuse_reset_duration_seconds", "Reset of a used container (restart, docker diff, restore, "
            "check).", registry=r, buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 120))
        self.evaluations = Counter("envd_evaluations", "Evaluations, by result.", ["result"], registry=r)
        self.grade_cache = Counter("envd_grade_cache", "Row evaluations by how the verdict was had (miss: "
                                   "graded; hit: kept from an earlier grading; joined: waited for the same "
                                   "grading; off).", ["result"], registry=r)
        self.reward_hacks = Counter("envd_reward_hack_attempts", "Patches refused for changing how tests "
                                    "run or report, by kind (swe.tamper.KINDS).", ["kind"], registry=r)
        self.errors = Counter("envd_errors", "Error answers, by endpoint and status.",
                              ["endpoint", "status"], registry=r)
        # task images: pulls (apart from create time), the disk budget
        self.pulls = Counter("envd_image_pulls", "Image pulls, by result (ok, failed, timeout).",
                             ["result"], registry=r)
        self.pull_waiters = Counter("envd_image_pull_waiters", "Creates that joined a pull already "
                                    "running for their image (single-flight).", registry=r)
        self.pulls_running = Gauge("envd_image_pulls_running", "Pulls in progress now.", registry=r)
        self.pull_bytes = Counter("envd_image_pull_bytes", "Bytes downloaded by pulls (grows as they run).",
                                  registry=r)
        self.pull_seconds = Histogram(
            "envd_image_pull_duration_seconds", "Image pull time (waiting for a pull slot included).",
            registry=r, buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800))
        self.image_disk_bytes = Gauge("envd_image_disk_bytes", "Image store size (layers, docker system df).",
                                      registry=r)
        self.evictions = Counter("envd_image_evictions", "Task images removed by the disk budget.", registry=r)


class PoolMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.leases = Gauge("pool_leases", "Live leases (all pool processes).", registry=r)
        self.allocations = Counter("pool_allocations", "Allocations, by result.", ["result"], registry=r)
        self.allocate_wait = Histogram("pool_allocate_wait_seconds", "Time /allocate waited.",
                                       registry=r, buckets=(0.01, 0.1, 0.5, 1, 5, 15, 60, 300))
        self.expired = Counter("pool_leases_expired", "Leases closed because they expired.", registry=r)
        self.node_errors = Counter("pool_node_errors", "Failed calls to nodes.", ["node"], registry=r)

"""Request bodies of envd and the pool: the fields and defaults of the exec-server API swarl
serves (docs/envd.md), plus swarl's extras (additional fields only, never renamed ones)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

DIFF_TIMEOUT_S = 120  # envd bounds `git diff` (the /container/diff call) by this many seconds


class _Req(BaseModel):
    # Clients may send fields swarl does not use; ignore them rather than fail.
    model_config = ConfigDict(extra="ignore")


class CreateReq(_Req):
    image: str = Field(min_length=1)
    cwd: str = "/testbed"
    timeout: float = Field(120, gt=0, description="Bound on creating the container (s).")
    lease: str | None = Field(None, description="swarl: lease id for the swarl.lease label.")
    ttl_s: float | None = Field(None, gt=0, description="swarl: lease TTL (default envd.lease_ttl_s).")
    labels: dict[str, str] = Field(default_factory=dict, description="swarl: extra labels.")


class ExecReq(_Req):
    container_id: str = Field(min_length=1)
    command: str
    cwd: str = "/testbed"
    timeout: float = Field(180, gt=0)
    env: dict[str, str] = Field(default_factory=dict)


class DiffReq(_Req):
    container_id: str = Field(min_length=1)
    cwd: str = "/testbed"


class EvaluateReq(_Req):
    container_id: str = Field(min_length=1)
    patch: str
    eval_script: str | None = None
    instance: dict[str, Any] | None = Field(None, description="swarl: SWE-bench/SWE-Gym row to grade with.")
    cwd: str = "/testbed"
    timeout: float = Field(3600, gt=0)


class ContainerReq(_Req):
    container_id: str = Field(min_length=1)


# -- pool ---------------------------------------------------------------------------


class PullReq(_Req):
    image: str = Field(min_length=1, description="swarl: the image to have on this node (pulled when missing).")


class AllocateReq(_Req):
    image: str = Field(min_length=1)
    instance_id: str = ""
    wait_s: float | None = Field(None, ge=0, description="swarl: how long to wait for capacity.")
    owner: str = Field("", description="swarl: who holds the lease (actor id), for /status.")


class LeaseReq(_Req):
    lease_id: str = Field(min_length=1)


class PoolExecReq(LeaseReq):
    command: str
    cwd: str = "/testbed"
    timeout: float = Field(180, gt=0)
    env: dict[str, str] = Field(default_factory=dict)


class PoolDiffReq(LeaseReq):
    cwd: str = "/testbed"


class PoolEvaluateReq(LeaseReq):
    patch: str
    eval_script: str | None = None
    instance: dict[str, Any] | None = None
    cwd: str = "/testbed"
    timeout: float = Field(3600, gt=0)


class NodeReq(_Req):
    url: str = Field(min_length=1)

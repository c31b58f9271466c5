"""Request bodies of envd and the pool: the fields and defaults of the exec-server API swarl
serves (docs/envd.md), plus swarl's extras (additional fields only, never renamed ones)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

DIFF_TIMEOUT_S = 120  # envd bounds `git diff` (the /container/diff call) by this many seconds

# Docker's image reference grammar (distribution/reference): [domain[:port]/]path[:tag][@digest],
# or an image id (sha256:<hex>). Checked here so a malformed name is a 422 naming `image`, not an
# engine error.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
_REFERENCE = re.compile(rf"^(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
                        r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")
_IMAGE_ID = re.compile(r"^(?:sha256:)?[0-9a-f]{12,64}$")


def _image_reference(v: str) -> str:
    if len(v) > 512 or not (_REFERENCE.match(v) or _IMAGE_ID.match(v)):
        raise ValueError(f"{v[:100]!r} is not a Docker image reference ([registry/]name[:tag][@digest], lowercase)")
    return v


ImageRef = Annotated[str, Field(min_length=1), AfterValidator(_image_reference)]
_NODE_URL = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+(?::[0-9]{1,5})?/?$")


def _node_url(v: str) -> str:
    if not _NODE_URL.match(v):
        raise ValueError(f"{v[:100]!r} is not an envd node URL (http[s]://host:port)")
    return v


class _Req(BaseModel):
    # Clients may send fields swarl does not use; ignore them rather than fail.
    model_config = ConfigDict(extra="ignore")


class CreateReq(_Req):
    image: ImageRef
    cwd: str = "/testbed"
    timeout: float = Field(120, gt=0, description="Bound on creating the container (s).")
    lease: str | None = Field(None, description="swarl: lease id for the swarl.lease label.")
    ttl_s: float | None = Field(None, gt=0, description="swarl: lease TTL (default envd.lease_ttl_s).")
    labels: dict[str, str] = Field(default_factory=dict, description="swarl: extra labels.")
    warm: bool = Field(True, description="swarl: may be served by a warm container (envd.warm_per_image); "
                       "its Docker labels are then the warm container's, and `labels` show in /status only.")
    reuse: bool = Field(False, description="swarl: may be served by a container an earlier lease used, reset "
                        "to the image's state (envd.reuse_per_image), and is reset for reuse when destroyed; "
                        "the pool asks it for agents' containers, a grading container never is.")


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
    image: ImageRef = Field(description="swarl: the image to have on this node (pulled when missing).")


class AllocateReq(_Req):
    image: ImageRef
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
    url: Annotated[str, Field(min_length=1), AfterValidator(_node_url)]

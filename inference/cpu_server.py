"""swarl's CPU inference server: SGLang's native HTTP API over a transformers model on CPU.

Every endpoint answers in SGLang's shapes (the table in docs/inference.md), so the
client code that drives SGLang on GPUs is the code tested here. Generation runs on one worker
thread (inference.engine); HTTP handlers only parse, queue and wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from broker.keys import Keys
from broker.registry import Role, ServerMeta
from common.logs import get_logger
from inference import api_schema as S
from inference.api_schema import ApiError, add_api_key
from inference.dist_group import GroupError, ReceivingGroup
from inference.engine import Engine, GenRequest
from inference.membership import Membership
from inference.openai_api import OpenAIBackend, add_openai_routes
from inference.sampling import SamplingParams
from inference.update_lock import OUTSIDE_SESSION, Session, UpdateLock
from inference.weight_versions import to_meta

if TYPE_CHECKING:
    from broker.config import RedisConfig

log = get_logger("inference")

NOT_FLUSHED = ("Weights were updated, but the cache was not flushed because requests are still running "
               "or queued. Retract or finish them, then call /flush_cache.")
PAUSE_OK = {"message": "Generation paused successfully.", "status": "ok"}
CONTINUE_OK = {"message": "Generation continued successfully.", "status": "ok"}
GROUP_JOIN_TIMEOUT_S = 300.0
DISCONNECT_POLL_S = 1.0


@dataclass
class ServerSettings:
    model_dir: str
    host: str = "127.0.0.1"
    port: int = 30000
    weight_version: str = "0"
    api_key: str | None = None  # None: no auth (only with an explicit --no-auth)
    max_batch_size: int = 32
    max_prefill_tokens: int = 8192
    seed: int = 0
    tp_size: int = 1  # receiving ranks in a weight-update group (as an SGLang server of this tp size)
    role: Role = "policy"  # registered: a prm server is a judge, never pinned nor updated
    redis_url: str | None = None
    redis_cfg: RedisConfig | None = None
    keys: Keys | None = None  # the run's registry keys (with redis_url)
    server_id: str | None = None
    advertise_url: str | None = None
    heartbeat_s: float = 3.0

    @property
    def url(self) -> str:
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        host = self.host
        if host in ("0.0.0.0", "::", ""):  # bound everywhere: advertise a name others can resolve
            import socket

            host = socket.getfqdn()
        return f"http://{host}:{self.port}"

    @property
    def id(self) -> str:
        return self.server_id or self.url.split("://", 1)[-1].rstrip("/")


@dataclass
class _Group:
    """A weight-update group of this server, with a lock so its updates run one at a time."""

    ranks: ReceivingGroup
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class CpuServer:
    """State shared by the handlers: the engine, weight-update groups, the registry membership."""

    def __init__(self, settings: ServerSettings, engine: Engine | None = None) -> None:
        if settings.tp_size < 1:
            raise ValueError(f"tp_size must be at least 1, got {settings.tp_size}")
        self.settings = settings
        self.engine = engine or Engine(settings.model_dir, settings.weight_version,
                                       settings.max_batch_size, settings.max_prefill_tokens, settings.seed)
        self.groups: dict[str, _Group] = {}
        self.update_lock = UpdateLock()  # SGLang's model_update_lock (inference.update_lock)
        self.session = Session()
        self.version_changed = asyncio.Event()
        self.membership: Membership | None = None
        if settings.redis_url:
            if settings.keys is None:
                raise ValueError("a server that registers (redis_url) needs the run's keys")
            self.membership = Membership(
                settings.redis_url, settings.keys, settings.id, settings.url,
                ServerMeta(kind="swarl-cpu", model=settings.model_dir, tp_size=settings.tp_size,
                           role=settings.role),
                version=lambda: self.engine.weight_version, heartbeat_s=settings.heartbeat_s,
                wake=self.version_changed, redis_cfg=settings.redis_cfg)

    async def drain(self, timeout_s: float) -> None:
        """Before shutdown: state draining (no new pins), then wait — bounded — until no
        episode holds a pin and no request runs."""
        sid = self.settings.id
        if self.membership is not None:
            await self.membership.set_state("draining")
        log.info("server_draining", server_id=sid, timeout_s=timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pins = await self.membership.pin_count() if self.membership is not None else 0
            queued = self.engine.num_waiting and not self.engine.paused  # paused ones cannot finish
            if pins == 0 and self.engine.num_running == 0 and not queued:
                break
            await asyncio.sleep(0.5)
        log.info("server_drained", server_id=sid)

    # -- generate ---------------------------------------------------------------------
    async def generate_one(self, input_ids: list[int], params: SamplingParams, rid: str | None,
                           return_logprob: bool, text_in_logprobs: bool) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[GenRequest] = loop.create_future()

        def done(r: GenRequest) -> None:  # on the engine thread
            def deliver() -> None:
                if not fut.done():
                    fut.set_result(r)

            loop.call_soon_threadsafe(deliver)

        req = GenRequest(list(input_ids), params, return_logprob=return_logprob, on_done=done)
        if rid:
            req.rid = rid
        t0 = time.monotonic()
        async with self.update_lock.shared():  # a weight update waits for this answer
            self.engine.submit(req)
            try:
                r = await fut
            except asyncio.CancelledError:
                self.engine.cancel(req)
                raise
        return self._answer(r, time.monotonic() - t0, text_in_logprobs)

    @contextlib.asynccontextmanager
    async def updating(self) -> AsyncIterator[None]:
        """A weight update's hold on the model: the update lock, exclusive, unless generation is
        paused (then whoever paused it owns the model, as in SGLang)."""
        if self.engine.paused:
            yield
        else:
            async with self.update_lock.exclusive():
                yield

    async def begin_session(self, req: S.BeginWeightUpdateReq) -> tuple[int, dict[str, Any]]:
        async with self.updating():
            why = self.session.begin(req.selector)
        if why:
            return 400, {"success": False, "message": why}
        log.info("weight_update_session_begun", selector=req.selector)
        return 200, {"success": True, "message": "Success"}

    async def end_session(self) -> tuple[int, dict[str, Any]]:
        async with self.updating():
            why = self.session.end()
        if why:
            return 400, {"success": False, "message": why}
        log.info("weight_update_session_ended")
        return 200, {"success": True, "message": "Success"}

    def _answer(self, r: GenRequest, latency: float, text_in_logprobs: bool) -> dict[str, Any]:
        tok = self.engine.tokenizer
        meta: dict[str, Any] = {
            "id": r.rid,
            "finish_reason": r.finish_reason,
            "prompt_tokens": len(r.input_ids),
            "completion_tokens": len(r.output_ids),
            "cached_tokens": 0,
            "weight_version": r.weight_version,
            "num_retractions": r.retractions,
            "e2e_latency": latency,
        }
        # which tokens each version made (SGLang 0.5.23 adds them to every finished answer)
        to_meta(meta, r.weight_versions, len(r.output_ids))
        if r.return_logprob:
            meta["output_token_logprobs"] = [
                [lp, t, tok.decode([t]) if text_in_logprobs else None]
                for lp, t in zip(r.output_logprobs, r.output_ids, strict=True)
            ]
            meta["output_token_logprobs_length"] = len(r.output_ids)
            meta["input_token_logprobs"] = []
            meta["output_top_logprobs"] = []
            meta["input_top_logprobs"] = []
        return {"text": self.engine.output_text(r), "output_ids": list(r.output_ids), "meta_info": meta}

    def expand_generate(self, req: S.GenerateReq) -> list[tuple[list[int], SamplingParams, str | None, bool]]:
        """Turn a (possibly batched) GenerateReq into validated single requests."""
        if (req.text is None) == (req.input_ids is None):
            raise ApiError(400, "Either text or input_ids should be provided (exactly one).")
        batch: list[list[int]]
        if req.input_ids is not None:
            ids = req.input_ids
            is_batch = bool(ids) and isinstance(ids[0], list)
            # the schema admits a list of ints or a list of lists of ints, nothing mixed
            batch = [list(x) for x in cast("list[list[int]]", ids)] if is_batch else [list(cast("list[int]", ids))]
        else:
            texts = req.text if isinstance(req.text, list) else [str(req.text)]
            batch = [list(self.engine.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
            is_batch = isinstance(req.text, list)
        n = len(batch)
        sps = req.sampling_params
        sp_list = sps if isinstance(sps, list) else [sps or {}] * n
        rids = req.rid if isinstance(req.rid, list) else [req.rid] * n
        rl = req.return_logprob if isinstance(req.return_logprob, list) else [bool(req.return_logprob)] * n
        if len(sp_list) != n or len(rids) != n or len(rl) != n:
            raise ApiError(400, f"batch of {n} prompts: sampling_params, rid and return_logprob lists "
                                f"must have {n} entries")
        out = []
        for i, ids_i in enumerate(batch):
            where = f"input_ids[{i}]" if is_batch else "input_ids"
            if not ids_i:
                raise ApiError(400, f"{where}: the input is empty")
            bad = [t for t in ids_i if not 0 <= t < self.engine.vocab_size]
            if bad:
                raise ApiError(400, f"{where}: token id {bad[0]} is out of range [0, {self.engine.vocab_size})")
            if len(ids_i) >= self.engine.context_len:
                raise ApiError(400, f"The input ({len(ids_i)} tokens) is longer than the model's context "
                                    f"length ({self.engine.context_len} tokens).")
            try:
                sp = SamplingParams.model_validate(sp_list[i] or {})
            except S.ValidationError as e:
                raise ApiError(400, S.validation_message(e, prefix="sampling_params.")) from None
            out.append((ids_i, sp, rids[i], rl[i]))
        return out if is_batch else out[:1]

    # -- weights ----------------------------------------------------------------------
    async def update_from_disk(self, req: S.UpdateWeightsFromDiskReq) -> tuple[int, dict[str, Any]]:
        from inference.weights import WeightsError, load_into, read_safetensors_dir

        t0 = time.monotonic()
        try:
            tensors = await asyncio.to_thread(read_safetensors_dir, req.model_path)
        except WeightsError as e:
            return 400, {"success": False, "message": f"Failed to update weights: {e}. Kept the old weights.",
                         "num_paused_requests": 0}

        def apply() -> None:
            load_into(self.engine.model, tensors, partial=False)
            self.engine.model_dir = req.model_path
            if req.weight_version is not None:
                self.engine.set_weight_version(req.weight_version)
            self.engine.stats.weight_updates += 1

        # as SGLang: requests are aborted before the update waits for the ones in flight
        n = await self._abort_all("update_weights_from_disk") if req.abort_all_requests else 0
        try:
            async with self.updating():
                await self.engine.acall(apply)
        except WeightsError as e:
            return 400, {"success": False, "message": f"Failed to update weights: {e}. Kept the old weights.",
                         "num_paused_requests": 0}
        self.version_changed.set()
        log.info("weights_updated", source="disk", path=req.model_path, version=self.engine.weight_version,
                 seconds=round(time.monotonic() - t0, 3))
        if req.flush_cache and not await self._flushable():
            return 400, {"success": False, "message": NOT_FLUSHED, "num_paused_requests": n}
        return 200, {"success": True, "message": "Succeeded to update model weights.",
                     "num_paused_requests": n}

    async def _flushable(self) -> bool:
        """As SGLang 0.5.23 after a weight update with flush_cache: the cache the old weights made
        cannot be flushed while requests hold it (paused in_place); the update call then fails,
        the new weights loaded. Retracted requests gave theirs back."""
        return not await self.engine.acall(lambda: self.engine.held)

    def init_group(self, req: S.InitWeightsUpdateGroupReq) -> tuple[int, dict[str, Any]]:
        if req.group_name in self.groups:
            return 400, {"success": False, "message": f"group {req.group_name!r} already exists; "
                         "destroy it first (destroy_weights_update_group)"}
        tp = self.settings.tp_size
        why = ReceivingGroup.check_layout(req.rank_offset, req.world_size, tp)
        if why:
            return 400, {"success": False, "message": why}
        # No NCCL on CPU: gloo carries the same broadcasts.
        ranks = ReceivingGroup(req.group_name, req.master_address, req.master_port, req.rank_offset,
                               req.world_size, tp, GROUP_JOIN_TIMEOUT_S)
        self.groups[req.group_name] = _Group(ranks)
        ranks.start_join()
        note = "" if req.backend == "gloo" else f" (backend {req.backend!r} requested; CPU server uses gloo)"
        which = f"rank {ranks.rank_offset}" if tp == 1 else f"ranks {ranks.rank_offset}..{ranks.ranks[-1]}"
        return 200, {"success": True, "message": f"Joining weight update group {req.group_name!r} as "
                     f"{which} of {req.world_size} in the background{note}."}

    async def _group(self, name: str) -> _Group:
        group = self.groups.get(name)
        if group is None:
            raise ApiError(400, f"group_name: no weight update group {name!r}; call init_weights_update_group")
        try:
            await asyncio.to_thread(group.ranks.wait_joined)
        except GroupError as e:
            raise ApiError(400, str(e)) from None
        return group

    async def _abort_all(self, why: str) -> int:
        return await self.engine.acall(lambda: self.engine.abort(abort_all=True, message=f"Aborted by {why}"))

    async def update_from_distributed(self, req: S.UpdateWeightsFromDistributedReq) -> tuple[int, dict[str, Any]]:
        if req.abort_all_requests:
            await self._abort_all("update_weights_from_distributed")
        async with self.updating():
            if not self.session.open:  # refused before any tensor is received, as SGLang
                return 400, {"success": False, "message": OUTSIDE_SESSION}
            return await self._update_from_distributed(req)

    async def _update_from_distributed(self, req: S.UpdateWeightsFromDistributedReq) -> tuple[int, dict[str, Any]]:
        from inference.dist_group import first_difference
        from inference.weights import WeightsError, load_into, torch_dtype

        if not (len(req.names) == len(req.dtypes) == len(req.shapes)):
            return 400, {"success": False, "message": f"names ({len(req.names)}), dtypes ({len(req.dtypes)}) "
                         f"and shapes ({len(req.shapes)}) must have the same length"}
        try:
            dtypes = [torch_dtype(d) for d in req.dtypes]
        except WeightsError as e:
            return 400, {"success": False, "message": f"dtypes: {e}"}
        bad = [(n, s) for n, s in zip(req.names, req.shapes, strict=True) if any(d < 0 for d in s)]
        if bad:
            return 400, {"success": False, "message": f"shapes: {bad[0][0]}: negative dimension in {bad[0][1]}"}
        try:
            group = await self._group(req.group_name)
        except ApiError as e:
            return 400, {"success": False, "message": e.message}

        async with group.lock:
            try:  # every tensor is received by every rank, even a bucket that is then refused
                per_rank = await asyncio.to_thread(group.ranks.receive, dtypes, req.shapes)
            except RuntimeError as e:
                return 400, {"success": False, "message": f"Failed to receive weights: {e}"}
        differ = first_difference(req.names, per_rank, group.ranks.ranks)
        if differ:
            log.error("weights_differ_between_ranks", group=req.group_name, detail=differ)
            return 400, {"success": False, "message": f"Failed to update weights: the ranks of this "
                         f"server received different bytes ({differ}). Kept the old weights."}
        received = dict(zip(req.names, per_rank[0], strict=True))

        def apply() -> None:
            load_into(self.engine.model, received, partial=True)
            if req.weight_version is not None:
                self.engine.set_weight_version(req.weight_version)
            self.engine.stats.weight_updates += 1

        try:
            await self.engine.acall(apply)
        except WeightsError as e:
            return 400, {"success": False, "message": f"Failed to update weights: {e}"}
        self.version_changed.set()
        log.info("weights_updated", source="distributed", tensors=len(req.names),
                 ranks=len(per_rank), version=self.engine.weight_version)
        if req.flush_cache and not await self._flushable():
            return 400, {"success": False, "message": NOT_FLUSHED}
        return 200, {"success": True, "message": "Succeeded to update parameter online."}

    async def destroy_group(self, name: str) -> tuple[int, dict[str, Any]]:
        group = self.groups.pop(name, None)
        if group is None:
            return 400, {"success": False, "message": f"group_name: no weight update group {name!r}"}
        await asyncio.to_thread(group.ranks.close)
        return 200, {"success": True, "message": f"Destroyed weight update group {name!r}."}

    async def close(self) -> None:
        for group in list(self.groups.values()):
            group.ranks.close()
        self.groups.clear()
        await asyncio.to_thread(self.engine.stop)


def create_app(settings: ServerSettings, engine: Engine | None = None) -> FastAPI:
    """The FastAPI app; the engine (model load) is built at startup unless given."""
    state: dict[str, CpuServer] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        srv = CpuServer(settings, engine)
        srv.engine.start()
        state["srv"] = srv
        app.state.srv = srv
        app.state.loop = asyncio.get_running_loop()
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(srv.close)
            if srv.membership is not None:  # leaves the registry before the engine stops
                await stack.enter_async_context(srv.membership)
            log.info("inference_server_ready", url=settings.url, model=settings.model_dir,
                     version=srv.engine.weight_version, server_id=settings.id, tp_size=settings.tp_size,
                     role=settings.role)
            yield

    app = FastAPI(title="swarl CPU inference server (SGLang API)", lifespan=lifespan)

    def srv() -> CpuServer:
        return state["srv"]

    if settings.api_key is not None:
        add_api_key(app, settings.api_key)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError):
        return JSONResponse({"error": {"message": exc.message}}, status_code=exc.status)

    async def body_of(request: Request) -> Any:
        raw = await request.body()
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except ValueError as e:
            raise ApiError(400, f"request body is not valid JSON: {e}") from None

    @app.post("/generate")
    async def generate(request: Request):
        req: S.GenerateReq = S.parse(S.GenerateReq, await body_of(request))
        items = srv().expand_generate(req)
        single = not (isinstance(req.input_ids, list) and req.input_ids and isinstance(req.input_ids[0], list)) \
            and not isinstance(req.text, list)
        work = asyncio.ensure_future(asyncio.gather(*[
            srv().generate_one(ids, sp, rid, rl, req.return_text_in_logprobs) for ids, sp, rid, rl in items]))
        # a caller that hangs up (its own timeout) frees its batch slot instead of running on
        while not work.done():
            await asyncio.wait([work], timeout=DISCONNECT_POLL_S)
            if not work.done() and await request.is_disconnected():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                return Response(status_code=499)
        results = work.result()
        payload: Any = results[0] if single else results
        if req.stream:
            async def events() -> AsyncIterator[bytes]:
                for item in results if not single else [results[0]]:
                    yield b"data: " + json.dumps(item).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")
        return JSONResponse(payload)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        status, body = await srv().update_from_disk(S.parse(S.UpdateWeightsFromDiskReq, await body_of(request)))
        return JSONResponse(body, status_code=status)

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(request: Request):
        status, body = srv().init_group(S.parse(S.InitWeightsUpdateGroupReq, await body_of(request)))
        return JSONResponse(body, status_code=status)

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request):
        req = S.parse(S.UpdateWeightsFromDistributedReq, await body_of(request))
        status, body = await srv().update_from_distributed(req)
        return JSONResponse(body, status_code=status)

    @app.post("/begin_weight_update")
    async def begin_weight_update(request: Request):
        status, body = await srv().begin_session(S.parse(S.BeginWeightUpdateReq, await body_of(request)))
        return JSONResponse(body, status_code=status)

    @app.post("/end_weight_update")
    async def end_weight_update(request: Request):
        S.parse(S.EndWeightUpdateReq, await body_of(request))
        status, body = await srv().end_session()
        return JSONResponse(body, status_code=status)

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(request: Request):
        req = S.parse(S.DestroyWeightsUpdateGroupReq, await body_of(request))
        status, body = await srv().destroy_group(req.group_name)
        return JSONResponse(body, status_code=status)

    def openai_backend() -> OpenAIBackend:
        eng = srv().engine

        async def generate(ids: list[int], sp: SamplingParams, logprob: bool) -> dict[str, Any]:
            return await srv().generate_one(ids, sp, None, logprob, False)

        return OpenAIBackend(model_id=settings.model_dir, tokenizer=eng.tokenizer, generate=generate,
                             context_len=eng.context_len)

    add_openai_routes(app, openai_backend)  # /v1/models, /v1/completions, /v1/chat/completions

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request):
        req = S.parse(S.UpdateWeightVersionReq, await body_of(request))
        eng = srv().engine

        def apply() -> None:
            if req.abort_all_requests:
                eng.abort(abort_all=True, message="Aborted by update_weight_version")
            eng.set_weight_version(req.new_version)

        await eng.acall(apply)
        srv().version_changed.set()
        return {"success": True, "message": f"Weight version updated to {req.new_version}",
                "new_version": req.new_version}

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        req = S.parse(S.PauseGenerationReq, await body_of(request))
        n = await srv().engine.acall(lambda: srv().engine.pause(req.mode))
        log.info("generation_paused", mode=req.mode, aborted=n)
        return PAUSE_OK

    @app.post("/continue_generation")
    async def continue_generation(request: Request):
        S.parse(S.ContinueGenerationReq, await body_of(request))
        await srv().engine.acall(srv().engine.resume)
        log.info("generation_continued")
        return CONTINUE_OK

    @app.post("/abort_request")
    async def abort_request(request: Request):
        req = S.parse(S.AbortReq, await body_of(request))
        n = await srv().engine.acall(lambda: srv().engine.abort(req.rid, req.abort_all))
        log.info("requests_aborted", rid=req.rid, abort_all=req.abort_all, aborted=n)
        return Response(status_code=200)  # SGLang answers an empty 200

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        busy = await srv().engine.acall(lambda: srv().engine.num_running)
        if busy:
            return PlainTextResponse(
                "Cache not flushed because there are running requests. Please check backend logs.",
                status_code=400)
        return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details. (When there "
                                 "are running or waiting requests, the operation will not be performed.)\n")

    @app.get("/model_info")
    async def model_info():
        eng = srv().engine
        return {"model_path": eng.model_dir, "served_model_name": settings.model_dir,
                "tokenizer_path": settings.model_dir, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": eng.weight_version,
                "load_format": "auto", "reasoning_parser": None, "tool_call_parser": None,
                "disaggregation_mode": "null", "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": getattr(eng.config, "model_type", None),
                "architectures": getattr(eng.config, "architectures", None)}

    @app.get("/get_model_info")  # deprecated in SGLang, still served
    async def get_model_info():
        return await model_info()

    @app.get("/get_server_info")  # deprecated in SGLang, still served
    async def get_server_info():
        return await server_info()

    @app.get("/server_info")
    async def server_info():
        eng = srv().engine
        stats = vars(eng.stats).copy()
        return {"model_path": settings.model_dir, "host": settings.host, "port": settings.port,
                "tp_size": settings.tp_size, "weight_version": eng.weight_version, "version": "swarl-cpu",
                "max_running_requests": eng.max_batch_size, "context_length": eng.context_len,
                "internal_states": [{"num_running": eng.num_running, "num_waiting": eng.num_waiting,
                                     "paused": eng.paused, **stats}],
                "swarl": {"server_id": settings.id, "url": settings.url, "stats": stats}}

    @app.get("/swarl/stats")
    async def swarl_stats():
        eng = srv().engine
        return {**vars(eng.stats), "num_running": eng.num_running, "num_waiting": eng.num_waiting,
                "paused": eng.paused, "weight_version": eng.weight_version,
                "weight_update_groups": sorted(srv().groups), "weight_update_session": srv().session.open}

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate():
        try:
            ans = await asyncio.wait_for(
                srv().generate_one([0], SamplingParams(max_new_tokens=1, temperature=0.0), None, False, False),
                timeout=20)
        except TimeoutError:
            return Response(status_code=503)
        if (ans["meta_info"]["finish_reason"] or {}).get("type") == "abort" and not srv().engine.paused:
            return Response(status_code=503)
        return Response(status_code=200)

    @app.api_route("/get_weights_by_name", methods=["GET", "POST"])
    async def get_weights_by_name(request: Request):
        body = dict(request.query_params) if request.method == "GET" else await body_of(request)
        req = S.parse(S.GetWeightsByNameReq, body)
        eng = srv().engine

        def read() -> list:
            sd = eng.model.state_dict()
            if req.name not in sd:
                raise ApiError(400, f"name: no parameter {req.name!r}")
            return sd[req.name].detach().float().flatten()[: req.truncate_size].tolist()

        return await eng.acall(read)

    @app.get("/swarl/weights_checksum")
    async def weights_checksum():
        from inference.weights import checksum, named_weights

        eng = srv().engine

        def read() -> dict[str, Any]:
            # the version with the weights it labels, on the engine's thread where updates are
            # applied: read after the call returned, an update landing in between paired the
            # new version with the old weights' digest
            weights = named_weights(eng.model)
            return {"sha256": checksum(weights), "weight_version": eng.weight_version,
                    "num_tensors": len(weights)}

        return await eng.acall(read)

    return app


class DrainingServer(uvicorn.Server):
    """uvicorn, but the first SIGTERM/SIGINT drains first (registry state draining, wait for
    pins and running requests, at most `drain_timeout_s`); a second signal exits at once."""

    def __init__(self, config: uvicorn.Config, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.drain_timeout_s = drain_timeout_s
        self._draining = False

    def handle_exit(self, sig: int, frame: Any) -> None:
        app: Any = self.config.app
        loop = getattr(getattr(app, "state", None), "loop", None)
        if self._draining or self.should_exit or self.drain_timeout_s <= 0 or loop is None:
            return super().handle_exit(sig, frame)
        self._draining = True
        self._captured_signals.append(sig)

        async def drain_then_exit() -> None:
            try:
                await app.state.srv.drain(self.drain_timeout_s)
            finally:
                self.should_exit = True

        loop.call_soon_threadsafe(lambda: loop.create_task(drain_then_exit()))

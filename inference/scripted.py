"""A deterministic scripted policy for tests, benchmarks and the demo.

`ScriptedPolicy` answers fixed turns per instance (the Policy protocol, in-process; a row's
`swarl_scripted_mode` overrides the server's mode); `swarl scripted-policy serve` serves the
same answers over SGLang's /generate API (plus /update_weight_version, /update_weights_from_disk,
/health, /health_generate, /model_info and its deprecated alias /get_model_info, in SGLang
0.5.23's shapes), with SGLang's API-key rule (inference.api_schema),
plus the OpenAI-style /v1 routes (inference.openai_api), and registers in the server registry as
ready, so `swarl actor` uses it like any inference server. `--mode judge` makes it a process
reward model's stand-in (ScriptedJudge: known votes per instance and step, role prm).
Answers are tokenized with the model's tokenizer and end with the eos token; every token gets
the logprob SCRIPTED_LOGPROB (a script is not a distribution)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request  # module level: FastAPI resolves handler annotations here
from fastapi.responses import JSONResponse

from broker.keys import Keys
from broker.registry import ServerMeta
from inference.api_schema import add_api_key
from inference.generation import Generation
from inference.latency import LatencyLog, LatencyProfile, episode_key, row_draw
from inference.membership import Membership
from inference.openai_api import OpenAIBackend, OpenAIError, add_openai_routes

if TYPE_CHECKING:
    from broker.config import RedisConfig

SCRIPTED_LOGPROB = math.log(0.9)
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"
MODES = ("fix", "wrong", "noop", "format", "loop", "sleep", "flood", "judge")

# The judge mode (a PRM's scripted stand-in): each judge prompt names the instance (its problem
# statement) and the step ("(step N)", 1-based, as configs/prompts/prm_judge.yaml writes it);
# the row's `swarl_prm_votes` lists, per step, the votes its m calls get in turn (the last
# list serves later steps; without it every vote is the server's default). A vote is "+1" /
# "-1" (answered with \boxed{}), "bad" (an answer without a score) or "error" (HTTP 500).
JUDGE_ANSWERS = {"+1": "The command makes progress on the issue.\n\\boxed{+1}",
                 "-1": "The command does not help with the issue.\n\\boxed{-1}",
                 "bad": "I cannot judge this step."}
JUDGE_VOTES = (*JUDGE_ANSWERS, "error")
_STEP_RE = re.compile(r"\(step (\d+)\)")


def _turn(thought: str, command: str) -> str:
    return f"THOUGHT: {thought}\n\n```bash\n{command}\n```"


def script_turn(mode: str, instance: dict[str, Any] | None, turn: int, sleep_s: int = 30) -> str:
    """The text of answer `turn` for an instance under `mode`."""
    inst = instance or {}
    if mode == "fix":
        cmds = [inst.get("swarl_fix_command") or "true"]
    elif mode == "wrong":
        wrong = inst.get("swarl_wrong_commands") or ["true"]
        cmds = [wrong[0] if isinstance(wrong, list) else str(wrong)]
    elif mode == "noop":
        cmds = []
    elif mode == "format":
        return "THOUGHT: I am not sure what to run yet."
    elif mode == "loop":
        return _turn("Let me look around.", "ls")
    elif mode == "sleep":  # a slow step that then applies the fix
        cmds = [f"sleep {sleep_s} && {inst.get('swarl_fix_command') or 'true'}"]
    elif mode == "flood":
        cmds = ["seq 1 20000"]
    else:
        raise ValueError(f"mode: {mode!r} not one of {MODES}")
    if turn < len(cmds):
        return _turn("Apply the change to the source.", cmds[turn])
    return _turn("Done: submit the work.", SUBMIT)


def script_length(mode: str, instance: dict[str, Any] | None, cap: int = 16) -> int:
    """Answers up to and including the submit (`cap` for a script that never submits)."""
    for turn in range(cap):
        if SUBMIT in script_turn(mode, instance, turn):
            return turn + 1
    return cap


class ScriptedPolicy:
    """In-process scripted policy. `find(prompt_text)` maps a decoded prompt to (instance, turn)."""

    def __init__(self, tokenizer: Any, mode: str = "fix", weight_version: str = "0",
                 tasks: list[dict[str, Any]] | None = None, eos_token: str | None = None,
                 sleep_s: int = 30, latency: LatencyProfile | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: {mode!r} not one of {MODES}")
        self.tok, self.mode, self.weight_version = tokenizer, mode, str(weight_version)
        self.tasks = list(tasks or [])
        self.eos_token = eos_token or tokenizer.eos_token
        self.eos_id = int(tokenizer.convert_tokens_to_ids(self.eos_token))
        self.sleep_s = sleep_s
        # with a latency profile: exploration turns before the script, a delay per answer
        self.latency = LatencyLog(latency) if latency is not None else None
        for row in self.tasks:  # a row's own draw is checked at start, not at its first answer
            try:
                row_draw(row)
            except ValueError as e:
                raise ValueError(f"task {row.get('instance_id')!r}: {e}") from None

    def locate(self, input_ids: list[int]) -> tuple[dict[str, Any] | None, int]:
        text = self.tok.decode(input_ids, skip_special_tokens=False)
        turn = max(0, text.count("<|im_start|>assistant") - 1)
        for row in self.tasks:
            ps = str(row.get("problem_statement", "")).strip()
            if ps and ps in text:
                return row, turn
        for row in self.tasks:  # a compact prompt shows only the statement's first line
            first = str(row.get("problem_statement", "")).strip().split("\n")[0].strip()
            if first and first in text:
                return row, turn
        return None, turn

    def answer(self, input_ids: list[int], max_new_tokens: int, rid: str | None = None) -> Generation:
        return self.answer_for(*self.locate(input_ids), max_new_tokens, rid)

    def answer_for(self, inst: dict[str, Any] | None, turn: int, max_new_tokens: int,
                   rid: str | None = None) -> Generation:
        """`answer` for a prompt already located (the server also needs the row: its delay)."""
        # A row may pick its own script (tests mix resolved and wrong episodes on one server).
        mode = str((inst or {}).get("swarl_scripted_mode") or self.mode)
        if self.latency is not None:
            extra = max(0, self.latency.draw(rid, inst).turns - script_length(mode, inst))
            text = (_turn("Let me look around first.", "ls") if turn < extra
                    else script_turn(mode, inst, turn - extra, self.sleep_s))
        else:
            text = script_turn(mode, inst, turn, self.sleep_s)
        ids = [*self.tok(text, add_special_tokens=False)["input_ids"], self.eos_id]
        finish = "stop"
        if len(ids) > max_new_tokens:
            ids, finish = ids[:max_new_tokens], "length"
            text = self.tok.decode(ids, skip_special_tokens=True)
        return Generation(ids, [SCRIPTED_LOGPROB] * len(ids), finish, self.weight_version, text)

    async def generate(self, input_ids: list[int], sampling: dict[str, Any],
                       rid: str | None = None) -> Generation:
        return self.answer(input_ids, int(sampling.get("max_new_tokens", 128)), rid)


class JudgeError(Exception):
    """A scripted vote of "error": the server answers HTTP 500."""


class ScriptedJudge:
    """Known votes for judge prompts (see JUDGE_ANSWERS); `delay_s` per vote (a slow judge)."""

    def __init__(self, tasks: list[dict[str, Any]] | None = None, default_vote: str = "+1",
                 delay_s: float = 0.0) -> None:
        if default_vote not in JUDGE_VOTES:
            raise ValueError(f"default vote: {default_vote!r} not one of {JUDGE_VOTES}")
        self.tasks, self.default_vote, self.delay_s = list(tasks or []), default_vote, delay_s
        self.calls: Counter[tuple[str, int]] = Counter()  # (instance_id, step) -> votes given

    def vote(self, prompt: str) -> str:
        row = next((r for r in self.tasks if str(r.get("problem_statement", "")).strip()
                    and str(r["problem_statement"]).strip() in prompt), None)
        m = _STEP_RE.search(prompt)
        step = int(m.group(1)) if m else 1
        key = (str((row or {}).get("instance_id", "")), step)
        k = self.calls[key]
        self.calls[key] += 1
        plan = (row or {}).get("swarl_prm_votes")
        if not plan:
            return self.default_vote
        votes = plan[min(step, len(plan)) - 1]
        return str(votes[k % len(votes)])

    async def answer(self, prompt: str) -> str:
        vote = self.vote(prompt)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if vote == "error":
            raise JudgeError("scripted judge error")
        return JUDGE_ANSWERS[vote]


def create_app(policy: ScriptedPolicy, api_key: str | None, model_path: str = "",
               membership: Membership | None = None, judge: ScriptedJudge | None = None,
               fail_episodes: int = 0) -> Any:
    """The app; with `membership`, the registry entry lives as long as the app (its lifespan, so
    the entry is gone before uvicorn's shutdown hands a caught SIGTERM back to the process).
    `fail_episodes`: the first N episodes (rid keys) it sees get HTTP 500 on their first request,
    an infrastructure failure the actor hands back for a retry (which then succeeds)."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if membership is not None:
                await stack.enter_async_context(membership)
            yield

    app = FastAPI(title="swarl scripted policy", lifespan=lifespan)

    def err(status: int, msg: str) -> JSONResponse:
        return JSONResponse({"error": {"message": msg}}, status_code=status)

    if api_key:
        add_api_key(app, api_key)
    seen: set[str] = set()
    failed: list[str] = []
    # pause_generation / continue_generation as SGLang 0.5.23: while paused new requests wait;
    # requests in flight wait too (retract, in_place: answered after continue, at the version then
    # loaded) or end at once with finish_reason abort (abort)
    go = asyncio.Event()
    go.set()
    cut = [asyncio.Event()]

    def injected_fault(rid: str) -> bool:
        key = episode_key(rid or None)
        if not key or key in seen:
            return False
        seen.add(key)
        if len(failed) >= fail_episodes:
            return False
        failed.append(key)
        return True

    @app.post("/generate")
    async def generate(request: Request) -> Any:
        try:
            body = await request.json()
        except Exception:
            return err(400, "body: not JSON")
        ids = body.get("input_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
            return err(400, "input_ids: expected a non-empty list of ints")
        sp = body.get("sampling_params") or {}
        mnt = sp.get("max_new_tokens", 128)
        if not isinstance(mnt, int) or mnt < 0:
            return err(400, "sampling_params.max_new_tokens: expected a non-negative int")
        if fail_episodes and injected_fault(body.get("rid") or ""):
            return err(500, "injected fault (--fail-episodes)")
        try:
            return await native(ids, mnt, body.get("rid") or "")
        except JudgeError as e:
            return err(500, str(e))

    async def native(ids: list[int], max_new_tokens: int, rid: str = "") -> dict[str, Any]:
        """One answer in /generate's shape: the script's turn, or (judge mode) a vote."""
        t0 = time.monotonic()
        inst: dict[str, Any] | None = None
        if judge is not None:
            text = await judge.answer(policy.tok.decode(ids, skip_special_tokens=False))
            g = Generation([*policy.tok(text, add_special_tokens=False)["input_ids"], policy.eos_id],
                           [], "stop", policy.weight_version, text)
            g.logprobs = [SCRIPTED_LOGPROB] * len(g.ids)
        else:
            await go.wait()
            inst, turn = policy.locate(ids)
            g = policy.answer_for(inst, turn, max_new_tokens, rid or None)
        aborted = False
        if policy.latency is not None and judge is None:  # a row may fix its own draw (ROW_FIELD)
            aborted = await _unless_cut(policy.latency.delay_s(rid or None, len(g.ids), inst), cut[0])
        if not aborted and judge is None:
            await go.wait()  # paused in flight (retract): answered once continued
        finish = ({"type": "stop", "matched": policy.eos_id} if g.finish == "stop"
                  else {"type": "length", "length": len(g.ids)})
        if aborted:  # no partial answers in a script: the turn is cut whole
            g.ids, g.logprobs, g.text = [], [], ""
            finish = {"type": "abort", "message": "Generation paused (pause_generation)."}
        return {"text": g.text, "output_ids": g.ids, "meta_info": {
            "id": rid, "prompt_tokens": len(ids),
            "completion_tokens": len(g.ids), "cached_tokens": 0, "finish_reason": finish,
            "weight_version": policy.weight_version, "e2e_latency": time.monotonic() - t0,
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(g.logprobs, g.ids, strict=True)]}}

    async def openai_generate(ids: list[int], sp: Any, _logprob: bool) -> dict[str, Any]:
        try:
            return await native(ids, int(sp.max_new_tokens or 128))
        except JudgeError as e:
            raise OpenAIError(str(e), 500) from None

    add_openai_routes(app, lambda: OpenAIBackend(model_id=model_path or "scripted", tokenizer=policy.tok,
                                                 generate=openai_generate))

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request) -> Any:
        body = await request.json()
        if not isinstance(body, dict) or "new_version" not in body:
            return err(400, "new_version: missing")
        policy.weight_version = str(body["new_version"])
        return {"success": True, "message": f"Weight version updated to {policy.weight_version}",
                "new_version": policy.weight_version}

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> Any:
        # Nothing to load (a script has no weights): the version moves, so weight_sync's
        # rolling update treats this server like any other.
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
            return err(400, "model_path: expected a string")
        if body.get("weight_version") is not None:
            policy.weight_version = str(body["weight_version"])
        return {"success": True, "message": "Succeeded to update model weights.",
                "num_paused_requests": 0}

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> Any:
        body = await request.json()
        mode = body.get("mode", "abort") if isinstance(body, dict) else None
        if mode not in ("abort", "retract", "in_place"):
            return err(400, "mode: expected abort, retract or in_place")
        go.clear()
        if mode == "abort":
            cut[0].set()
            cut[0] = asyncio.Event()
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def continue_generation() -> Any:
        go.set()
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.get("/swarl/latency")
    async def latency() -> Any:
        """The latency profile and, per episode key, the seconds slept and answers given."""
        if policy.latency is None:
            return {"profile": None, "episodes": {}}
        return {"profile": policy.latency.profile.model_dump(), "episodes": policy.latency.episodes}

    @app.get("/swarl/faults")
    async def faults() -> Any:
        """The episodes (rid keys) whose first request got the injected HTTP 500."""
        return {"fail_episodes": fail_episodes, "failed": failed}

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Any:
        return JSONResponse({}, status_code=200)

    @app.get("/model_info")
    @app.get("/get_model_info")  # deprecated in SGLang, still served
    async def model_info() -> Any:
        return {"model_path": model_path, "served_model_name": model_path, "tokenizer_path": model_path,
                "is_generation": True, "preferred_sampling_params": None,
                "weight_version": policy.weight_version, "scripted_mode": policy.mode}

    return app


async def serve(tokenizer_dir: str, mode: str, host: str, port: int, api_key: str | None,
                weight_version: str, tasks: list[dict[str, Any]], redis_url: str | None,
                keys: Keys | None, server_id: str | None = None,
                advertise_url: str | None = None, heartbeat_s: float = 3.0, sleep_s: int = 30,
                redis_cfg: RedisConfig | None = None, judge_vote: str = "+1",
                judge_delay_s: float = 0.0, latency: LatencyProfile | None = None,
                fail_episodes: int = 0) -> None:
    """Run the scripted server; with redis_url, keep a registry entry (ready at any version: a
    script does not depend on weights) until stopped."""
    import uvicorn
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    # judge mode: a PRM's stand-in (role prm); the policy object still tokenizes and versions
    judge = ScriptedJudge(tasks, judge_vote, judge_delay_s) if mode == "judge" else None
    policy = ScriptedPolicy(tok, "fix" if judge else mode, weight_version, tasks, sleep_s=sleep_s,
                            latency=latency)
    membership = None
    if redis_url:
        if keys is None:
            raise ValueError("a scripted server that registers (redis_url) needs the run's keys")
        membership = Membership(
            redis_url, keys, server_id or f"{host}:{port}", advertise_url or f"http://{host}:{port}",
            ServerMeta(kind="scripted", model=tokenizer_dir, tp_size=1, role="prm" if judge else "policy"),
            version=lambda: policy.weight_version, heartbeat_s=heartbeat_s, any_version_ready=True,
            redis_cfg=redis_cfg)
    app = create_app(policy, api_key, tokenizer_dir, membership, judge, fail_episodes)
    await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).serve()


async def _unless_cut(delay_s: float, cut: asyncio.Event) -> bool:
    """Sleep `delay_s`; True when `cut` is set first (pause_generation abort)."""
    try:
        await asyncio.wait_for(cut.wait(), delay_s)
    except TimeoutError:
        return False
    return True

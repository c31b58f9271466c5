"""Standalone evaluation (`swarl eval`, and the demo's before/after rates): the actors' own
episode code against one inference server (swarl's CPU server or any SGLang) and the pool,
without training. Writes per episode traj.json / patch.diff / meta.json, plus results.jsonl,
summary.json (with pass@k over the samples) and the predictions the official SWE-bench harness
grades (preds.json, preds-<k>.json); instances already in results.jsonl are skipped
(resumable)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.config import ActorConfig
from common.files import atomic_write_text
from common.logs import get_logger

log = get_logger("eval")


@dataclass
class EvalTarget:
    server_url: str
    api_key: str | None
    pool_url: str
    pool_token: str | None
    tokenizer: str | None = None


def _done_keys(results: Path) -> set[str]:
    if not results.exists():
        return set()
    keys = set()
    for line in results.read_text().splitlines():
        if line.strip():
            try:
                keys.add(json.loads(line)["key"])
            except (json.JSONDecodeError, KeyError):
                continue  # a torn last line from a crash: that episode runs again
    return keys


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task from n samples of which c resolved: the chance that k
    of them drawn without replacement hold at least one resolved, 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    ok = [r for r in rows if not r.get("error")]
    errors = Counter(r["error"] for r in rows if r.get("error"))
    per_instance: dict[str, list[bool]] = {}
    for r in rows:
        per_instance.setdefault(r["instance_id"], []).append(bool(r.get("resolved")))
    # pass@k for k = 1 .. the fewest samples any task has, averaged over tasks (errors are
    # unresolved samples, as in resolve_rate)
    k_max = min((len(v) for v in per_instance.values()), default=0)
    pass_k = {str(k): round(sum(pass_at_k(len(v), sum(v), k) for v in per_instance.values())
                            / len(per_instance), 4) for k in range(1, k_max + 1)}
    return {
        "episodes": n,
        "instances": len(per_instance),
        "resolved": sum(1 for r in rows if r.get("resolved")),
        # errors count as unresolved: an evaluation that could not run resolved nothing
        "resolve_rate": round(sum(1 for r in rows if r.get("resolved")) / n, 4) if n else 0.0,
        "pass_at_k": pass_k,
        "avg_steps": round(sum(r.get("steps", 0) for r in ok) / len(ok), 3) if ok else 0.0,
        "avg_time_s": round(sum(r.get("time_s", 0.0) for r in ok) / len(ok), 3) if ok else 0.0,
        "errors": dict(errors),
        "endings": dict(Counter(r.get("ending", "error") for r in rows)),
    }


def preds_name(k: int) -> str:
    """The predictions file of sample k: preds.json for the first, preds-<k>.json after it."""
    return "preds.json" if k == 0 else f"preds-{k}.json"


def _patch_of(row: dict[str, Any]) -> str:
    """The patch swarl graded for a results row; "" for none (an error, an empty diff)."""
    if "model_patch" in row:
        return str(row["model_patch"] or "")
    # rows written before results carried the patch: the trajectory's patch.diff
    traj = row.get("traj_dir")
    path = Path(traj) / "patch.diff" if traj else None
    text = path.read_text() if path is not None and path.is_file() else ""
    return text if text.strip() else ""


def predictions(rows: list[dict[str, Any]], instance_ids: list[str], n_samples: int,
                model_name: str) -> list[list[dict[str, str]]]:
    """Per sample index k, the SWE-bench predictions of that sample: one
    {instance_id, model_name_or_path, model_patch} per instance, in `instance_ids` order.

    One list per sample because the harness keys predictions by instance_id (run_evaluation
    keeps the last of two for one instance). An instance whose sample k has no results row
    gets no prediction; an errored or empty one gets model_patch "", which the harness counts
    as an empty patch: unresolved, as swarl counts it."""
    by_key = {r["key"]: r for r in rows}
    out: list[list[dict[str, str]]] = []
    for k in range(n_samples):
        preds = []
        for iid in instance_ids:
            row = by_key.get(f"{iid}#{k}")
            if row is not None:
                preds.append({"instance_id": iid, "model_name_or_path": model_name,
                              "model_patch": _patch_of(row)})
        out.append(preds)
    return out


def write_predictions(out: Path, preds: list[list[dict[str, str]]]) -> list[str]:
    """preds.json, preds-1.json, ... under `out` (each written whole, then renamed); their names."""
    names = []
    for k, sample in enumerate(preds):
        path = out / preds_name(k)
        atomic_write_text(path, json.dumps(sample, indent=1))
        names.append(path.name)
    return names


async def served_model_name(target: EvalTarget) -> str:
    """What the server says it serves (served_model_name, else model_path), else the
    tokenizer directory, else the server's URL: the predictions' model_name_or_path."""
    from actors.backends import ServerPolicy
    from actors.protocols import InfraError

    policy = ServerPolicy(target.server_url, target.api_key, 30.0)
    try:
        info = await policy.model_info()
        name = info.get("served_model_name") or info.get("model_path")
        if name:
            return str(name)
    except InfraError as e:
        log.warning("model_name_unknown", server=target.server_url, error=e.detail[:200])
    finally:
        await policy.aclose()
    return target.tokenizer or target.server_url


def episode_seed(seed: int, instance_id: str, k: int) -> int:
    """The sampling_seed of episode k of a task in an evaluation seeded `seed` (31 bits, as
    any server takes it)."""
    digest = hashlib.sha256(f"{seed}:{instance_id}:{k}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


async def evaluate(rows: list[dict[str, Any]], target: EvalTarget, out_dir: str | Path,
                   actor_cfg: ActorConfig, max_concurrent: int = 4, n_samples: int = 1,
                   on_result: Callable[[dict[str, Any]], None] | None = None,
                   seed: int | None = None, model_name: str | None = None) -> dict[str, Any]:
    """Every row must carry its `image_name` (ValueError naming the first that does not).

    `seed` (not None): episode k of a task samples with the sampling_seed episode_seed(seed,
    instance_id, k), so two policies evaluated with one seed meet the same random draws
    (common random numbers) and their paired difference is not buried in sampling noise.

    `model_name`: the predictions' model_name_or_path (None: served_model_name(target)).
    Each results row carries `model_patch`, the patch graded ("" when there was none), which
    the predictions files are rebuilt from, also on resume."""
    from actors.backends import ServerPolicy
    from actors.episode import EpisodeJob, image_of
    from actors.leased import LeasedEpisodes
    from actors.protocols import InfraError
    from envd.client import EnvdClient

    for row in rows:
        image_of(row)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.jsonl"
    done = _done_keys(results_path)
    pool = EnvdClient.pool(target.pool_url, target.pool_token, allocate_wait_s=actor_cfg.allocate_wait_s)
    episodes = LeasedEpisodes(actor_cfg, pool, owner="swarl-eval", tokenizer=target.tokenizer, traj_dir=out)
    sem = asyncio.Semaphore(max_concurrent)
    write_lock = asyncio.Lock()

    async def one(row: dict[str, Any], k: int) -> None:
        key = f"{row['instance_id']}#{k}"
        sampling_seed = None if seed is None else episode_seed(seed, str(row["instance_id"]), k)
        job = EpisodeJob(f"eval:{key}", row, f"eval:{row['instance_id']}", k, n_samples, sampling_seed)
        res: dict[str, Any] = {"key": key, "instance_id": row["instance_id"], "sample": k,
                               "sampling_seed": sampling_seed}
        async with sem:
            t0 = time.monotonic()
            policy = ServerPolicy(target.server_url, target.api_key, actor_cfg.generate_timeout_s)
            try:
                ep = await episodes.run(job, policy, None, meta={"server": target.server_url})
                versions = sorted({s.weight_version for s in ep.agent.steps})
                patch = ep.agent.patch if ep.agent.patch.strip() else ""  # blank: not graded
                res.update(resolved=ep.resolved, reward=ep.reward, ending=ep.agent.ending,
                           steps=len(ep.agent.steps), traj_dir=ep.traj_dir and str(ep.traj_dir),
                           weight_versions=versions, format_errors=ep.agent.format_errors,
                           patch_chars=len(patch.strip()), model_patch=patch)
            except InfraError as e:
                res.update(resolved=False, error=e.reason, detail=e.detail[:500], model_patch="")
            except Exception as e:  # other client errors: recorded, not fatal
                res.update(resolved=False, error=type(e).__name__, detail=str(e)[:500], model_patch="")
            finally:
                await policy.aclose()
            res["time_s"] = round(time.monotonic() - t0, 3)
        async with write_lock:
            with results_path.open("a") as f:
                f.write(json.dumps(res) + "\n")
        if on_result:
            on_result(res)

    name = model_name or await served_model_name(target)
    try:
        todo = [(r, k) for r in rows for k in range(n_samples) if f"{r['instance_id']}#{k}" not in done]
        if len(todo) < len(rows) * n_samples:
            log.info("resuming", skipped=len(rows) * n_samples - len(todo), remaining=len(todo))
        await asyncio.gather(*(one(r, k) for r, k in todo))
    finally:
        await pool.aclose()
    keys = {f"{r['instance_id']}#{k}" for r in rows for k in range(n_samples)}
    all_rows = [json.loads(line) for line in results_path.read_text().splitlines() if line.strip()]
    mine = [r for r in all_rows if r["key"] in keys]
    summary = summarize(mine)
    preds = predictions(mine, list(dict.fromkeys(str(r["instance_id"]) for r in rows)), n_samples, name)
    summary.update(model_name_or_path=name, preds=write_predictions(out, preds))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary

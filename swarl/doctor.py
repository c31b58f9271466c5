"""`swarl doctor`: which GPU features this machine gives swarl (CUDA devices, NCCL,
TransformerEngine and so the megatron layer spec, the attention megatron-core will run, apex,
flash-attn, megatron-core and sglang against swarl's pins), and whether it can run a config's
learner or inference side, with every reason it cannot.

It imports torch but never sglang (versions come from the installed distributions), and
TransformerEngine (then megatron-core's layer specs) only to see whether it imports.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any, Literal

from packaging.requirements import Requirement

from learner.backends.megatron_env import (
    MEGATRON_CORE_FLOOR,
    TE_ONLY_FUSIONS,
    TE_SUPPORTED,
    apex_version,
    dist_version,
    flash_attention_version,
    megatron_core_problem,
    te_version_problem,
    transformer_engine,
)
from swarl.config import SwarlConfig

GIB = 1024**3
Role = Literal["learner", "inference"]


def swarl_pins() -> dict[str, str]:
    """The version specifiers swarl's installed metadata gives megatron-core and sglang (base
    dependencies and the `gpu` extra: pyproject.toml as installed)."""
    pins: dict[str, str] = {}
    try:
        reqs = importlib.metadata.requires("swarl") or []
    except importlib.metadata.PackageNotFoundError:
        return pins
    for line in reqs:
        r = Requirement(line)
        if r.name in ("megatron-core", "sglang") and r.name not in pins:
            pins[r.name] = str(r.specifier)
    return pins


def _devices() -> list[dict[str, Any]]:
    import torch

    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        with torch.cuda.device(i):
            bf16 = bool(torch.cuda.is_bf16_supported())
        out.append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / GIB, 1),
                    "capability": f"{p.major}.{p.minor}", "bf16": bf16})
    return out


def machine() -> dict[str, Any]:
    """What this machine gives swarl's GPU path, as plain data (the --json report)."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    nccl_version = None
    if cuda and dist.is_nccl_available():
        v = torch.cuda.nccl.version()
        nccl_version = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    te, te_found = transformer_engine()
    use_te = cuda and te is not None
    if not cuda:
        attention = "megatron-core local spec DotProductAttention on the CPU (unfused: an s x s score matrix per head)"
    elif use_te:
        attention = ("TransformerEngine DotProductAttention: flash-attn or cuDNN fused attention, chosen "
                     "per shape (NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 logs the choice; NVTE_FLASH_ATTN=0 / "
                     "NVTE_FUSED_ATTN=0 turn one off)")
    else:
        attention = ("megatron-core local spec DotProductAttention (unfused: an s x s score matrix per "
                     "head, packed micro-batches run as padded rows)")
    pins = swarl_pins()
    mc = dist_version("megatron-core")
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda": cuda,
        "devices": _devices() if cuda else [],
        "nccl": {"available": bool(cuda and dist.is_nccl_available()), "version": nccl_version},
        "transformer_engine": {"version": te, "found": te_found, "supported": TE_SUPPORTED,
                               "problem": te_version_problem(te) if te else None},
        "layer_spec": "transformer_engine" if use_te else "local",
        "fusions_off": [] if use_te else list(TE_ONLY_FUSIONS),
        "attention": attention,
        "apex": apex_version(),
        "flash_attn": flash_attention_version(),
        "megatron_core": {"version": mc, "pin": pins.get("megatron-core"), "floor": MEGATRON_CORE_FLOOR,
                          "problem": megatron_core_problem(mc)},
        "sglang": {"version": dist_version("sglang"), "pin": pins.get("sglang")},
    }


def _off_pin(version: str | None, pin: str | None) -> bool:
    return bool(version and pin and not Requirement(f"x{pin}").specifier.contains(version, prereleases=True))


def check(cfg: SwarlConfig, m: dict[str, Any], role: Role) -> tuple[list[str], list[str]]:
    """(problems, warnings) of running `role` of this config on this machine: a problem is a
    reason it cannot run, a warning a feature it will run without."""
    problems: list[str] = []
    warnings: list[str] = []
    lc, ws, cl = cfg.learner, cfg.weight_sync, cfg.cluster
    gpus = len(m["devices"])
    where = (f"torch {m['torch']} " + ("sees no CUDA device" if m["torch_cuda"] else "is built without CUDA"))
    if role == "learner" and lc.backend == "megatron":
        if m["megatron_core"]["problem"]:
            problems.append(f"learner.backend=megatron: {m['megatron_core']['problem']}")
        elif _off_pin(m["megatron_core"]["version"], m["megatron_core"]["pin"]):
            warnings.append(f"megatron-core {m['megatron_core']['version']} is not swarl's pin "
                            f"{m['megatron_core']['pin']}")
        if lc.dtype == "bf16":  # a GPU recipe: the CPU runs the megatron backend only in fp32 tests
            if not m["cuda"]:
                problems.append(f"learner.backend=megatron with learner.dtype=bf16 is a GPU recipe: {where}")
            elif not all(d["bf16"] for d in m["devices"]):
                names = ", ".join(sorted({d["name"] for d in m["devices"] if not d["bf16"]}))
                problems.append(f"learner.dtype=bf16: {names} cannot compute in bf16 (use fp32)")
            if lc.tensor_parallel > gpus:
                problems.append(f"learner.tensor_parallel={lc.tensor_parallel} needs that many GPUs on "
                                f"one node; {gpus} visible here")
            if cl.gpus_per_node > gpus:
                problems.append(f"cluster.gpus_per_node={cl.gpus_per_node} (the learner's "
                                f"--nproc-per-node): {gpus} GPUs visible here")
            small = [d for d in m["devices"] if d["memory_gib"] < cl.gpu_memory_gib - 0.5]
            if small:
                problems.append(f"cluster.gpu_memory_gib={cl.gpu_memory_gib:g} (what `swarl config plan` "
                                f"sized the recipe for): {small[0]['name']} has {small[0]['memory_gib']:g} GiB")
        if m["cuda"] and m["layer_spec"] == "local":
            warnings.append("no TransformerEngine (" + m["transformer_engine"]["found"] + "): the local "
                            "layer spec with " + ", ".join(TE_ONLY_FUSIONS) + " off; its unfused attention "
                            "keeps an s x s score matrix per head, which `swarl config plan` does not count")
        te = m["transformer_engine"]["version"]
        if te and te_version_problem(te):
            problems.append(f"learner.backend=megatron: {te_version_problem(te)}")
    if role == "inference":
        sg = m["sglang"]
        if not sg["version"]:
            problems.append(f"sglang is not installed (swarl's pin: sglang{sg['pin'] or ''}; "
                            "pip install 'swarl[gpu]' or the deploy/Dockerfile image)")
        elif _off_pin(sg["version"], sg["pin"]):
            problems.append(f"sglang {sg['version']} is not swarl's pin sglang{sg['pin']}: the client's "
                            "routes and request bodies are checked against the pinned release")
        if not m["cuda"]:
            problems.append(f"SGLang serves on CUDA GPUs: {where}")
        elif cl.inference_tp_size > gpus:
            problems.append(f"cluster.inference_tp_size={cl.inference_tp_size} (--tp-size): {gpus} GPUs visible here")
    if ws.transport == "distributed":
        nccl = ws.backend == "nccl" or (ws.backend == "auto" and m["cuda"])
        if nccl and not m["nccl"]["available"]:
            problems.append(f"weight_sync.transport=distributed over NCCL (weight_sync.backend={ws.backend}): "
                            f"NCCL is not available here ({where})")
    return problems, warnings


def render(m: dict[str, Any]) -> str:
    def row(k: str, v: str) -> str:
        return f"  {k:<18} {v}"

    gpus = [f"{d['index']}: {d['name']}, {d['memory_gib']:g} GiB, sm {d['capability']}"
            f"{'' if d['bf16'] else ', no bf16'}" for d in m["devices"]]
    te = m["transformer_engine"]
    mc, sg = m["megatron_core"], m["sglang"]
    rows = [
        "this machine:",
        row("torch", f"{m['torch']} (" + (f"CUDA {m['torch_cuda']}" if m["torch_cuda"] else "no CUDA build") + ")"),
        row("GPUs", "none visible" if not gpus else gpus[0]),
        *[row("", g) for g in gpus[1:]],
        row("NCCL", m["nccl"]["version"] if m["nccl"]["available"] else "not available"),
        row("TransformerEngine", (te["version"] if te["version"] else te["found"])
            + f" (megatron-core 0.16.1 supports {te['supported']})"),
        row("layer spec", "TransformerEngine" if m["layer_spec"] == "transformer_engine"
            else "local, " + ", ".join(m["fusions_off"]) + " off"),
        row("attention", m["attention"]),
        row("apex", m["apex"] or "not installed"),
        row("flash-attn", m["flash_attn"] or "not installed"),
        row("megatron-core", f"{mc['version'] or 'not installed'} (pin {mc['pin'] or '-'}, floor {mc['floor']})"),
        row("sglang", f"{sg['version'] or 'not installed'} (pin {sg['pin'] or '-'})"),
    ]
    if mc["problem"]:
        rows.append(row("", mc["problem"]))
    return "\n".join(rows) + "\n"

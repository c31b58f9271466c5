"""What this machine gives the megatron backend: megatron-core's version against the floor swarl
needs, TransformerEngine (which layer spec the backend builds), apex and flash attention. Read by
the backend when it builds the model and reported by `swarl doctor`.

Nothing here imports megatron-core or TransformerEngine at module level: the doctor reports on
machines that have neither (megatron-core is imported only where TransformerEngine imports, to ask
whether megatron-core's TE extension does too).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from common.logs import get_logger

log = get_logger("learner")

# Float16Module.forward(fp32_output=...) (the backend hands bf16 logits to its head unconverted)
# first appears in megatron-core 0.15.0; 0.14 passes the keyword on to GPTModel.forward, which
# refuses it.
MEGATRON_CORE_FLOOR = "0.15.0"
# The TransformerEngine releases megatron-core 0.16.1 is built against: its own `dev` extra
# (transformer-engine[core_cu13,pytorch]>=2.9.0a0,<2.12.0).
TE_SUPPORTED = ">=2.9.0a0,<2.12.0"
# What the TE layer spec turns on that the local spec cannot run without TE or apex:
# RoPE fusion (TE's fused_apply_rotary_pos_emb), the masked-softmax fusion (Megatron-LM's compiled
# scaled_masked_softmax_cuda, not in the megatron-core wheel) and the persistent layer norm (apex;
# the local spec's torch RMSNorm asserts it off). bias_dropout_fusion is torch's own jit and stays.
TE_ONLY_FUSIONS = ("apply_rope_fusion", "masked_softmax_fusion", "persist_layer_norm")


def dist_version(name: str) -> str | None:
    """The installed distribution's version, None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def megatron_core_problem(version: str | None) -> str | None:
    """Why this megatron-core cannot run the backend, None when it can."""
    if version is None:
        return "megatron-core is not installed (pip install 'megatron-core==0.16.1')"
    try:
        ok = Version(version) >= Version(MEGATRON_CORE_FLOOR)
    except InvalidVersion:
        return f"megatron-core reports version {version!r}, which is not a version number"
    if not ok:
        return (f"megatron-core {version} is older than {MEGATRON_CORE_FLOOR}, the oldest the megatron "
                "backend runs on (Float16Module.forward(fp32_output=...) appeared in 0.15.0); "
                "install the pinned megatron-core==0.16.1")
    return None


def check_megatron_core() -> str:
    """The installed megatron-core's version; a clear error when it is missing or too old."""
    version = dist_version("megatron-core")
    problem = megatron_core_problem(version)
    if problem:
        raise RuntimeError(problem)
    assert version is not None
    return version


@functools.cache
def transformer_engine() -> tuple[str | None, str]:
    """(TE's version, None when it cannot be used; what was found). Importing
    transformer_engine.pytorch is the test: a wheel without its torch extension, or one built
    against another torch, fails there."""
    if importlib.util.find_spec("transformer_engine") is None:
        return None, "not installed"
    try:
        te = importlib.import_module("transformer_engine.pytorch")
    except Exception as e:  # ImportError, or an OSError / RuntimeError from its CUDA libraries
        return None, f"installed but does not import: {type(e).__name__}: {e}"
    version = (dist_version("transformer_engine") or dist_version("transformer-engine")
               or getattr(te, "__version__", None) or getattr(importlib.import_module("transformer_engine"),
                                                               "__version__", "unknown"))
    if dist_version("megatron-core") is not None:
        # megatron-core's own verdict: its TE spec needs its TE extension module to import too
        try:
            specs = importlib.import_module("megatron.core.models.gpt.gpt_layer_specs")
        except Exception as e:
            return None, f"{version} imports, but megatron-core's layer specs do not: {type(e).__name__}: {e}"
        if not getattr(specs, "HAVE_TE", False):
            return None, f"{version} imports, but megatron-core's TransformerEngine extension does not"
    return str(version), "importable"


def te_version_problem(version: str) -> str | None:
    try:
        ok = Version(version) in SpecifierSet(TE_SUPPORTED)
    except InvalidVersion:
        return None  # a source build may report a local version string; megatron-core checks itself
    if not ok:
        return f"TransformerEngine {version} is outside {TE_SUPPORTED}, the range megatron-core 0.16.1 supports"
    return None


_logged_local_spec = False


def use_transformer_engine(cuda: bool) -> bool:
    """The layer spec the backend builds: TransformerEngine's on CUDA when TE imports, the local
    spec otherwise, with TE_ONLY_FUSIONS off. The fallback on CUDA is logged once per process."""
    global _logged_local_spec
    if not cuda:
        return False
    version, found = transformer_engine()
    if version is not None:
        return True
    if not _logged_local_spec:
        _logged_local_spec = True
        log.warning("megatron_local_spec", transformer_engine=found, fusions_off=",".join(TE_ONLY_FUSIONS),
                    note="CUDA without TransformerEngine: megatron-core's local layer spec, unfused "
                         "attention (a score matrix per head), packed micro-batches run as padded rows")
    return False


def apex_version() -> str | None:
    if importlib.util.find_spec("apex") is None:
        return None
    return dist_version("apex") or "installed"


def flash_attention_version() -> str | None:
    """The flash-attn package TE's attention can dispatch to (TE also has cuDNN's fused attention)."""
    for name in ("flash-attn", "flash_attn", "flash-attn-3", "flash_attn_3"):
        v = dist_version(name)
        if v:
            return v
    return None

"""CPU stand-ins for the CUDA-only spots of megatron-core 0.16, so that its own training path
(GPTModel, DistributedDataParallel, get_forward_backward_func, get_megatron_optimizer,
finalize_model_grads) runs on a machine without CUDA, over gloo.

megatron-core asks for CUDA in a handful of ways, none of which carries meaning on a machine
that has one device:
- tensors made with ``device="cuda"`` or ``device=torch.cuda.current_device()`` (grad and param
  buffers of DDP, the schedule's token counter, the optimizer's found-inf and overflow flags, the
  grad-norm result, GlobalMemoryBuffer, RoPE frequencies) and ``tensor.cuda()``;
- ``tensor.type() == "torch.cuda.FloatTensor"`` to sort parameters by precision (distributed and
  mixed-precision optimizers);
- ``CudaRNGStatesTracker.fork`` (tensor-parallel dropout / init regions) reads the CUDA generator;
- activation recomputation (``tensor_parallel.checkpoint``) saves and restores the CUDA generator's
  state around each recomputed region.

`cpu_standins()` answers each of them with the CPU: the device is rewritten to "cpu", `.type()`
reports the CUDA spelling of the same dtype, `torch.cuda.current_device()` is device 0, `fork`
isolates the CPU generator instead, and the CUDA generator's state is an empty tensor that setting
leaves as it is (recomputation restores the CPU generator's state itself). It changes where tensors live, never what is computed, and
only while the context is open; the backend opens it only when CUDA is absent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


def _is_cuda(device: Any) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):
        return True  # a bare index names an accelerator (what torch.cuda.current_device() gives)
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class _CudaOnCpu(TorchFunctionMode):
    """Every torch call made while active: a CUDA device becomes the CPU."""

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name: str = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if not name.startswith("torch.cuda.") else name
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to:
            args = tuple("cpu" if i > 0 and _is_cuda(a) else a for i, a in enumerate(args))
        return func(*args, **kwargs)


@contextlib.contextmanager
def _fork_cpu_rng(self: Any, name: str | None = None) -> Iterator[None]:
    # the tracker keeps named CUDA generator states; with no CUDA generator the region runs on
    # the CPU generator, restored afterwards (swarl trains with dropout 0, so nothing draws)
    with torch.random.fork_rng(devices=[]):
        yield


@contextlib.contextmanager
def cpu_standins() -> Iterator[None]:
    """Run megatron-core on the CPU while open (see the module docstring)."""
    from megatron.core.tensor_parallel import random as mrandom

    saved = (torch.cuda.current_device, torch.cuda.synchronize, mrandom.CudaRNGStatesTracker.fork,
             mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state)
    torch.cuda.current_device = lambda: 0
    torch.cuda.synchronize = lambda device=None: None  # CPU work is done when the call returns
    mrandom.CudaRNGStatesTracker.fork = _fork_cpu_rng
    mrandom._get_cuda_rng_state = lambda *a, **kw: torch.empty(0, dtype=torch.uint8)
    mrandom._set_cuda_rng_state = lambda *a, **kw: None
    try:
        with _CudaOnCpu():
            yield
    finally:
        torch.cuda.current_device, torch.cuda.synchronize = saved[0], saved[1]
        mrandom.CudaRNGStatesTracker.fork = saved[2]
        mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state = saved[3], saved[4]


def maybe_cpu_standins() -> contextlib.AbstractContextManager[None]:
    """`cpu_standins()` when CUDA is absent, else nothing."""
    return contextlib.nullcontext() if torch.cuda.is_available() else cpu_standins()

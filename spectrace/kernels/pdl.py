"""Programmatic dependent launch (PDL, Hopper and later): a forward's kernels overlap at their seams.

A batch-1 decode of an 8B model is about 330 kernels in a row, most of them too small to fill the
GPU (a norm is one program, RoPE 48); each waits for the one before it to drain before it may start,
and the weight stream stops at every seam. Launched with PDL, a kernel starts as soon as every
program of the kernel before it has begun (each calls `gdc_launch_dependents` first thing); it then
waits (`gdc_wait`) until that kernel has finished and its writes are visible. A GEMV streams its
first weight tiles before it waits: weights are written by no kernel of a forward, so while a norm
or an attention runs, the next matrix is already on its way (TensorRT-LLM and CUTLASS's
weight-prefetch GEMM do the same).

The rule every kernel launched with `launch_options` keeps: before `wait_for_inputs` it reads only
weights and writes nothing (not even its own output: a capture's memory pool may hand it a buffer
the kernel before it still reads). A kernel launched without PDL (torch's) waits for the whole
kernel before it, as always. Off on the CPU (the interpreter) and before Hopper, and with
SPECTRACE_PDL=0.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


@functools.lru_cache(maxsize=None)
def _supported(device: torch.device) -> bool:
    return (device.type == "cuda" and os.environ.get("SPECTRACE_PDL", "1") != "0"
            and torch.cuda.get_device_capability(device)[0] >= 9
            and hasattr(tl.extra.cuda, "gdc_wait"))  # Triton 3.4 on


def launch_options(t: torch.Tensor) -> dict:
    """The launch's keywords for a kernel that keeps the rule above, on t's device: PDL (its
    constexpr flag) and launch_pdl where the device has it, else PDL off."""
    return dict(PDL=True, launch_pdl=True) if _supported(t.device) else dict(PDL=False)


@triton.jit
def let_next_start(PDL: tl.constexpr):
    """The next kernel may launch now (it waits for this one's writes itself)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Wait until the kernel before has finished and its writes are visible."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def wait_first(PDL: tl.constexpr):
    """A kernel's first line when it reads nothing before its inputs: let the next start, wait."""
    let_next_start(PDL)
    wait_for_inputs(PDL)

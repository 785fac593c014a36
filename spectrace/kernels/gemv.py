"""The fast engine's linear layer: a weight-streaming GEMV when a forward has one row of 16-bit
floats (a batch-1 decode in bf16), F.linear (cuBLAS) otherwise.

At one row, y = W x reads each weight once for two flops: the time is the weights' bytes (an 8B
model's decode step is 16 GB, 4.8 ms at an H100's 3.35 TB/s). cuBLAS runs a GEMM's tiles there
(64x8 tiles, split-K with a second reduce kernel for o_proj and down_proj): 2.1-3.0 TB/s at
Llama-3.1-8B's shapes on an H100. Here one program streams BLOCK_N rows of W, BLOCK_K columns at
a time, into a float32 (BLOCK_N, BLOCK_K) sum reduced once at the end: 2.5-3.2 TB/s on the same
shapes, in one kernel (docs/benchmarks.md has the table).

On a Hopper GPU it is launched with programmatic dependent launch (kernels/pdl.py) and streams
its first weight tile before it waits for x: the weights are on their way while the kernel before
it (a norm, the attention, silu_mul) finishes.

Measured and left out:
  - more rows (a verify of 8 tokens, a draft level of topk): products on the CUDA cores make the
    kernel compute-bound from 2 rows on, where cuBLAS's tensor-core tiles keep the time of one row;
    the same stream with tl.dot over tiles of 16 rows (the rows past M masked) was slower than
    cuBLAS too (H100, Llama-3.1-8B shape: a verify of 8 rows 6.43 ms against 6.26, a draft of
    5 levels 1.61 against 1.57; launched with PDL 7.34 and 1.71)
  - the op before the GEMV folded into it (the residual add and RMSNorm, or silu_mul): every
    program must recompute it from the whole input row, as much reading (from L2) as its few
    weight rows, and the norm needs a pass of its own before the weights start streaming
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from spectrace.kernels.pdl import launch_options, let_next_start, wait_for_inputs

BLOCK_N, BLOCK_K = 4, 512  # best or within 5% of it at every Llama-3.1-8B shape on an H100 (4 warps, 3 stages)


@triton.jit
def _gemv_kernel(x, w, bias, out, N, K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    let_next_start(PDL)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    ks = tl.arange(0, BLOCK_K)
    # the first tile before the wait: weights are written by no kernel of a forward (kernels/pdl.py)
    weights = tl.load(w + rows[:, None] * K + ks[None, :], mask=row_ok[:, None] & (ks < K)[None, :], other=0.0)
    wait_for_inputs(PDL)
    acc = weights.to(tl.float32) * tl.load(x + ks, mask=ks < K, other=0.0).to(tl.float32)[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        ok = ks < K
        weights = tl.load(w + rows[:, None] * K + ks[None, :], mask=row_ok[:, None] & ok[None, :], other=0.0)
        acc += weights.to(tl.float32) * tl.load(x + ks, mask=ok, other=0.0).to(tl.float32)[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(bias + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(out + rows, y.to(out.dtype.element_ty), mask=row_ok)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias): x (..., K), weight (N, K) -> (..., N); one row of 16-bit floats
    through the GEMV. float32 keeps F.linear: it is the dtype the fast engine is checked in against
    the explicit one, bit for bit, sampled runs included (a sum in another order moves a logit by
    an ulp, and a draw that lands there takes another token)."""
    if x.numel() != x.shape[-1] or x.dtype == torch.float32:
        return F.linear(x, weight, bias)
    N, K = weight.shape
    out = x.new_empty(*x.shape[:-1], N)
    block_n, block_k, config = BLOCK_N, min(BLOCK_K, triton.next_power_of_2(K)), dict(num_warps=4, num_stages=3)
    if not x.is_cuda:  # interpreted: few, wide programs (the interpreter's cost is per program and per loop trip)
        block_n, block_k, config = 64, min(1024, triton.next_power_of_2(K)), {}
    _gemv_kernel[(triton.cdiv(N, block_n),)](x.contiguous(), weight, bias if bias is not None else weight, out, N, K=K,
                                              HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k,
                                              **config, **launch_options(x))
    return out

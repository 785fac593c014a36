"""The fast engine's linear layer: a weight-streaming GEMV when a forward has one row of 16-bit
floats (a batch-1 decode in bf16), the same stream through the tensor cores for 2-16 rows (a
verify's tree, a draft level's top-k, a small batch), F.linear (cuBLAS) otherwise.

At one row, y = W x reads each weight once for two flops: the time is the weights' bytes (an 8B
model's decode step is 15 GB of matrices). cuBLAS runs a GEMM's tiles there, with split-K and a
second reduce kernel for the wide matrices (o_proj, down_proj). Here one program streams BLOCK_N
rows of W, BLOCK_K columns at a time, into a float32 (BLOCK_N, BLOCK_K) sum reduced once at the
end, in one kernel and nearer the bandwidth bound (docs/benchmarks.md, "One decode step at
Llama-3.1-8B's shape against the bandwidth bound").

The op before a small linear can be its prologue (`folds`: `norm_linear`, `silu_linear`): each
program makes the columns of x it multiplies from the op's inputs, as the op's own kernel would
round them. A decoder layer's residual add and RMSNorm go into its QKV and gate-up GEMVs (a first
pass over the row for its sum of squares, while the first weight tile is on its way; program 0
also stores x + delta, the residual stream), silu_mul into down_proj: three kernels a layer fewer.
Every program reads the whole input row again, from L2, about as many bytes as its weight rows
(2-3 rows of K against BLOCK_N): where the weights' stream is the time, that costs more than the
kernel it saves. So only a matrix under FOLD_BELOW weights folds its op: a launch-bound model's
(the embedded pair, 0.1-0.4M weights a matrix), not a bandwidth-bound one's (Llama-3.1-8B's, 17-117M).

On a Hopper GPU it is launched with programmatic dependent launch (kernels/pdl.py) and streams
its first weight tile before it waits for x: the weights are on their way while the kernel before
it (a norm, the attention, another GEMV) finishes.

From 2 to 16 rows (`rows_linear`) products on the CUDA cores would make the GEMV compute-bound, so
each program streams ROWS_N rows of W, ROWS_K columns at a time, into the tensor cores as the left
side of the product, x's rows (padded to 16, tl.dot's smallest tile) as the right: y^T = W x^T,
"swap AB", as vLLM's small-M GEMMs do (their swap_ab path). The rows ride along with the weights,
so 2 to 16 rows cost about one row's time. It too fetches its first tile before it waits. On
Hopper its tiles of W come through TMA (`by_tma`): one descriptor copy per tile, W's edges filled
with zeros by the copy engine, no address arithmetic or masks in the program; SPECTRACE_TMA=0
turns it off to compare. From 17 rows on a forward is a GEMM, and F.linear's.
"""
from __future__ import annotations

import functools
import importlib.util
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from spectrace.kernels.pdl import launch_options, let_next_start, wait_for_inputs
from spectrace.kernels.rounding import rounded

# (rows, columns) a program streams at a time, 4 warps, 3 stages: picked by a sweep over Llama-3.1-8B's
# matrices (2-16 rows, 256-1024 columns, 4-8 warps, 2-4 stages; docs/benchmarks.md)
BLOCK_N, BLOCK_K = 4, 1024
PLAIN, NORM, SILU = 0, 1, 2  # the prologue: x as it is, RMSNorm(x [+ delta]), silu(gate) * up
FOLD_BELOW = 1 << 22  # weights of a matrix whose GEMV folds the op before it in (8 MB of bf16, ~3 µs)
ROWS_N, ROWS_K, MAX_ROWS = 64, 256, 16  # rows_linear's tile of W, and the most rows it takes


@triton.jit
def _columns(x, delta, norm_w, ks, ok, rstd, K: tl.constexpr, PROLOGUE: tl.constexpr, HAS_DELTA: tl.constexpr):
    """The columns ks of the GEMV's input, float32, rounded as the prologue's own kernel rounds."""
    if PROLOGUE == 0:
        v = tl.load(x + ks, mask=ok, other=0.0).to(tl.float32)
    elif PROLOGUE == 1:  # fused.add_rms_norm's numbers
        v = tl.load(x + ks, mask=ok, other=0.0).to(tl.float32)
        if HAS_DELTA:
            v = rounded(v + tl.load(delta + ks, mask=ok, other=0.0).to(tl.float32), x.dtype.element_ty)
        g = tl.load(norm_w + ks, mask=ok, other=0.0).to(tl.float32)
        v = rounded(g * rounded(v * rstd, x.dtype.element_ty), x.dtype.element_ty)
    else:  # fused.silu_mul's numbers
        gate = tl.load(x + ks, mask=ok, other=0.0).to(tl.float32)
        silu = rounded(gate / (1.0 + tl.exp(-gate)), x.dtype.element_ty)
        v = rounded(silu * tl.load(x + K + ks, mask=ok, other=0.0).to(tl.float32), x.dtype.element_ty)
    return v


@triton.jit
def _gemv_kernel(x, delta, norm_w, total, eps, w, bias, out, N, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                 PROLOGUE: tl.constexpr, HAS_DELTA: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PDL: tl.constexpr):
    let_next_start(PDL)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    ks = tl.arange(0, BLOCK_K)
    # the first tile before the wait: weights are written by no kernel of a forward (kernels/pdl.py)
    weights = tl.load(w + rows[:, None] * K + ks[None, :], mask=row_ok[:, None] & (ks < K)[None, :], other=0.0)
    wait_for_inputs(PDL)
    rstd = 1.0
    if PROLOGUE == 1:  # the norm's sum of squares over the whole row; program 0 keeps x + delta
        squares = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ok = k0 + ks < K
            v = tl.load(x + k0 + ks, mask=ok, other=0.0).to(tl.float32)
            if HAS_DELTA:
                v = rounded(v + tl.load(delta + k0 + ks, mask=ok, other=0.0).to(tl.float32), x.dtype.element_ty)
                if tl.program_id(0) == 0:
                    tl.store(total + k0 + ks, v.to(total.dtype.element_ty), mask=ok)
            squares += v * v
        rstd = tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
    acc = weights.to(tl.float32) * _columns(x, delta, norm_w, ks, ks < K, rstd, K, PROLOGUE, HAS_DELTA)[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        ok = k0 + ks < K
        weights = tl.load(w + rows[:, None] * K + (k0 + ks)[None, :], mask=row_ok[:, None] & ok[None, :], other=0.0)
        acc += weights.to(tl.float32) * _columns(x, delta, norm_w, k0 + ks, ok, rstd, K, PROLOGUE, HAS_DELTA)[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(bias + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(out + rows, y.to(out.dtype.element_ty), mask=row_ok)


@triton.jit
def _w_tile(w, row0, k0, rows, row_ok, ks, K: tl.constexpr, TMA: tl.constexpr):
    """W's tile (rows, k0 + ks): a TMA copy from the descriptor w, or masked loads from the pointer w."""
    if TMA:
        tile = w.load([row0, k0])
    else:
        tile = tl.load(w + rows[:, None] * K + (k0 + ks)[None, :], mask=row_ok[:, None] & (k0 + ks < K)[None, :],
                       other=0.0)
    return tile


@triton.jit(do_not_specialize=["M"])
def _rows_kernel(x, w, bias, out, M, N, K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, TMA: tl.constexpr, PDL: tl.constexpr):
    let_next_start(PDL)
    row0 = tl.program_id(0) * BLOCK_N
    rows = row0 + tl.arange(0, BLOCK_N)  # W's rows: output columns
    row_ok = rows < N
    ms, ks = tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # y^T
    weights = _w_tile(w, row0, 0, rows, row_ok, ks, K, TMA)
    wait_for_inputs(PDL)  # the first tile is on its way, as the GEMV's
    xs = tl.load(x + ms[None, :] * K + ks[:, None], mask=(ms < M)[None, :] & (ks < K)[:, None], other=0.0)
    acc = tl.dot(weights, xs, acc)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        weights = _w_tile(w, row0, k0, rows, row_ok, ks, K, TMA)
        xs = tl.load(x + ms[None, :] * K + (k0 + ks)[:, None], mask=(ms < M)[None, :] & (k0 + ks < K)[:, None],
                     other=0.0)
        acc = tl.dot(weights, xs, acc)
    if HAS_BIAS:
        acc += tl.load(bias + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    tl.store(out + ms[None, :] * N + rows[:, None], acc.to(out.dtype.element_ty),
             mask=row_ok[:, None] & (ms < M)[None, :])


def streams(x: torch.Tensor) -> bool:
    """Whether a linear over x goes through the GEMV: one row of a 16-bit float. float32 keeps
    F.linear: it is the dtype the fast engine is checked in against the explicit one, bit for
    bit, sampled runs included (a sum in another order moves a logit by an ulp, and a draw that
    lands there takes another token)."""
    return x.numel() == x.shape[-1] and x.dtype != torch.float32


def folds(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the linear of weight over x takes the op before it as its prologue: a streamed row
    (`streams`) through a small matrix (FOLD_BELOW)."""
    return streams(x) and weight.numel() < FOLD_BELOW


def _gemv(x, weight, bias, prologue=PLAIN, delta=None, norm_weight=None, eps=0.0, total=None) -> torch.Tensor:
    """W p(x) (+ bias), p the prologue: x (1, K) (SILU: (1, 2K)) -> (1, N)."""
    N, K = weight.shape
    out = x.new_empty(*x.shape[:-1], N)
    block_n, block_k, config = BLOCK_N, min(BLOCK_K, triton.next_power_of_2(K)), dict(num_warps=4, num_stages=3)
    if not x.is_cuda:  # interpreted: few, wide programs (the interpreter's cost is per program and per loop trip)
        block_n, block_k, config = 64, min(1024, triton.next_power_of_2(K)), {}
    _gemv_kernel[(triton.cdiv(N, block_n),)](
        x.contiguous(), x if delta is None else delta.contiguous(), x if norm_weight is None else norm_weight,
        x if total is None else total, eps, weight, weight if bias is None else bias, out, N, K=K,
        HAS_BIAS=bias is not None, PROLOGUE=prologue, HAS_DELTA=delta is not None, BLOCK_N=block_n, BLOCK_K=block_k,
        **config, **launch_options(x))
    return out


@functools.lru_cache(maxsize=None)
def _tma_device(device: torch.device) -> bool:
    """A Hopper GPU (or later) without SPECTRACE_TMA=0, and a Triton with host-side tensor
    descriptors (`triton.tools.tensor_descriptor`: not every release pyproject accepts has them;
    without, rows_linear keeps its pointer loads)."""
    return (device.type == "cuda" and os.environ.get("SPECTRACE_TMA") != "0"
            and torch.cuda.get_device_capability(device)[0] >= 9
            and importlib.util.find_spec("triton.tools.tensor_descriptor") is not None)


def by_tma(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether rows_linear reads W through a TMA descriptor: on a device that can (`_tma_device`),
    and W laid out as TMA copies it (rows of contiguous columns, 16-byte aligned)."""
    return (_tma_device(x.device) and weight.stride(1) == 1 and weight.stride(0) * weight.element_size() % 16 == 0
            and weight.data_ptr() % 16 == 0)


def rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """W x^T (+ bias) on the tensor cores: x (M, K), M <= MAX_ROWS -> (M, N)."""
    (M, K), N = x.shape, weight.shape[0]
    out = x.new_empty(M, N)
    block_n, block_k, config = ROWS_N, ROWS_K, dict(num_warps=4, num_stages=4)
    if not x.is_cuda:  # interpreted: few, wide programs
        block_n, block_k, config = 64, max(16, min(1024, triton.next_power_of_2(K))), {}
    tma, w = by_tma(x, weight), weight
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor  # (_tma_device: not in every Triton)

        w = TensorDescriptor.from_tensor(weight, [block_n, block_k])
    _rows_kernel[(triton.cdiv(N, block_n),)](
        x.contiguous(), w, weight if bias is None else bias, out, M, N, K=K, HAS_BIAS=bias is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_M=MAX_ROWS, TMA=tma, **config, **launch_options(x))
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias): x (..., K), weight (N, K) -> (..., N); one row of 16-bit floats
    (`streams`) through the GEMV, 2 to MAX_ROWS of them through `rows_linear`."""
    if streams(x):
        return _gemv(x, weight, bias)
    rows = x.numel() // x.shape[-1]
    if x.dtype != torch.float32 and 1 < rows <= MAX_ROWS:
        return rows_linear(x.reshape(rows, -1), weight, bias).view(*x.shape[:-1], -1)
    return F.linear(x, weight, bias)


def norm_linear(x: torch.Tensor, delta: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """fused.add_rms_norm then the linear, in one GEMV: one row x, delta (1, H) ->
    (x + delta, W norm(x + delta) + bias); delta None: (x, W norm(x) + bias)."""
    total = x if delta is None else torch.empty_like(x)
    return total, _gemv(x, weight, bias, NORM, delta, norm_weight, eps, total)


def silu_linear(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """fused.silu_mul then the linear, in one GEMV: one row [gate | up] (1, 2K) -> (1, N)."""
    return _gemv(gate_up, weight, bias, SILU)

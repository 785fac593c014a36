"""A batch-invariant linear layer for --deterministic on the fast engine: F.linear with one fixed
tiling, so a row's output never depends on how many rows it was computed with.

cuBLAS picks its kernel, tile and split of the reduction (split-K) by the matrix's shape, so
row r of x @ W.T at M = 1 and at M = 64 may sum the same products in another order, and in bf16
round differently. That is why a verify over a tree of nodes does not, bit for bit, give what
one-token decodes of the same tokens give (tests/test_gpu.py prints how often). Here every output
tile is (BLOCK_M, BLOCK_N) and one program sums its whole reduction, BLOCK_K at a time, in order,
in float32: the tile shapes, and so the instructions and their order, are the same whatever M is
(M is not specialised), and a row's products never meet another row's. SGLang's deterministic
inference and vLLM's batch-invariant mode do the same (after Thinking Machines' batch_invariant_ops,
2025): a matmul with one configuration and no split-K.

Both sides of the equality use it: plain decoding's forward and the verify's (fast/batch.py:
decode_rows_batch), each with its own rows.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.kernels import check

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64  # one tiling for every M; tl.dot's smallest M tile is 16


@triton.jit(do_not_specialize=["M"])
def _linear_kernel(x, w, bias, out, M, N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                   IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):  # the whole reduction here, in order: no split-K
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(w + cols[None, :] * K + ks[:, None], mask=(cols[None, :] < N) & (ks[:, None] < K), other=0.0)
        if IEEE:  # float32 inputs: full-precision products, as torch's default (no TF32)
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
    if HAS_BIAS:
        acc += tl.load(bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(out + rows[:, None] * N + cols[None, :], acc.to(out.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias): x (..., K), weight (N, K) -> (..., N) in x's dtype, each row
    computed as it would be alone."""
    lead, K = x.shape[:-1], x.shape[-1]
    x = x.reshape(-1, K).contiguous()
    check("weight", weight, x.dtype, (None, K), x.device)
    N, M = weight.shape[0], x.shape[0]
    if bias is not None:
        check("bias", bias, x.dtype, (N,), x.device)
    out = x.new_empty(M, N)
    if M:
        _linear_kernel[(triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))](
            x, weight, bias if bias is not None else weight, out, M, N=N, K=K, HAS_BIAS=bias is not None,
            IEEE=x.dtype == torch.float32, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return out.view(*lead, N)

"""Triton twin of `spectrace.core.sampling.sample_from_prob`, for the kernels that draw a bonus
token from a residual: flashinfer's DeviceSamplingFromProb over vocabulary tiles.

The explicit function scans the whole vocabulary in one float64 cumsum; here each tile of
BLOCK_V tokens is summed and scanned in float32, with a carry from the tiles before. The first
token whose running sum passes coin * total is the same unless the coin lands within float32
rounding of a CDF boundary (SGLang's own test of its Triton port allows one such token per row).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def residual_weights(p_row, d_row, subtract, idx, vocab_size):
    """relu(p - d) when subtract is 1, p when 0, at the tokens idx; a NaN in d counts as 0."""
    p = tl.load(p_row + idx, mask=idx < vocab_size, other=0.0)
    subtracting = (tl.zeros_like(idx) + subtract) != 0  # the flag as a tile (the interpreter masks by tiles)
    d = tl.load(d_row + idx, mask=(idx < vocab_size) & subtracting, other=0.0)
    d = tl.where(d == d, d, 0.0)
    return tl.maximum(p - d, 0.0)


@triton.jit
def sample_from_prob(p_row, d_row, subtract, coin, vocab_size, BLOCK_V: tl.constexpr):
    """The smallest token with weight > 0 whose running sum passes coin * total; if rounding
    leaves none, the last token with weight; with no weight at all, the last token. Weights are
    `residual_weights` of the rows p_row and d_row (float32 pointers to one vocabulary row)."""
    offs = tl.arange(0, BLOCK_V)
    total = 0.0
    for start in range(0, vocab_size, BLOCK_V):  # first pass: the total mass
        total += tl.sum(residual_weights(p_row, d_row, subtract, start + offs, vocab_size), axis=0)
    threshold = coin * total
    carry, token, last = 0.0, -1, -1
    for start in range(0, vocab_size, BLOCK_V):  # second pass: the running sum, tile by tile
        idx = start + offs
        w = residual_weights(p_row, d_row, subtract, idx, vocab_size)
        cdf = carry + tl.cumsum(w, axis=0)
        first = tl.min(tl.where((w > 0) & (cdf > threshold), idx, vocab_size), axis=0)
        token = tl.where((token == -1) & (first < vocab_size), first, token)
        last = tl.maximum(last, tl.max(tl.where(w > 0, idx, -1), axis=0))
        carry += tl.sum(w, axis=0)
    return tl.where(token != -1, token, tl.where(last != -1, last, vocab_size - 1))


def block_v(vocab_size: int) -> int:
    """The vocabulary tile: 4096 tokens, as SGLang's Triton samplers take, or the whole of a small one."""
    return min(4096, triton.next_power_of_2(vocab_size))

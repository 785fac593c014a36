"""Triton twin of `spectrace.core.sampling.sample_from_prob`, for the walks that end in a bonus drawn
from a residual: flashinfer's DeviceSamplingFromProb over vocabulary tiles.

The walk kernels do not draw the bonus themselves: each leaves, per request, where its bonus goes
and which rows it is drawn from (`bonus_draw`), and `sample_from_prob` draws all of them in two launches:

    tile sums  grid (bs, tiles): every tile of every request's residual row summed at once, so the
               row is read once at the GPU's full bandwidth instead of by one program per request
    draw       grid (bs,): the running sum over the request's tile sums finds the tile where coin *
               total falls; only that tile is scanned, token by token

The explicit function scans the whole vocabulary in one float64 cumsum; here tiles of BLOCK_V tokens
are summed in float64 too (the weights are float32, as there) and the running sum carries across
tiles. The first token whose running sum passes coin * total is the same unless the coin lands
within float64 rounding of a CDF boundary: summed in float32, as SGLang's Triton port sums (its own
test allows one such token per row), a coin within float32 rounding of a boundary came up in a run
of 24 tokens, and the fast engine, which walks every step again explicitly, stopped on it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def block_v(vocab_size: int) -> int:
    """The vocabulary tile: 4096 tokens, as SGLang's Triton samplers take, or the whole of a small one."""
    return min(4096, triton.next_power_of_2(vocab_size))


@triton.jit
def residual_weights(p_row, d_row, subtract, idx, vocab_size):
    """relu(p - d) when subtract is 1, p when 0, at the tokens idx; a NaN in d counts as 0."""
    p = tl.load(p_row + idx, mask=idx < vocab_size, other=0.0)
    subtracting = (tl.zeros_like(idx) + subtract) != 0  # the flag as a tile (the interpreter masks by tiles)
    d = tl.load(d_row + idx, mask=(idx < vocab_size) & subtracting, other=0.0)
    d = tl.where(d == d, d, 0.0)
    return tl.maximum(p - d, 0.0)


@triton.jit
def store_bonus_draw(bonus_draw, b, slot, p_row, d_row, subtract):
    """A walk's last act: where request b's bonus goes (its slot in predicts) and the rows it is drawn
    from (element offsets of p's and q's rows; subtract 0: p alone), for sample_from_prob."""
    tl.store(bonus_draw + b * 4 + 0, slot.to(tl.int64))
    tl.store(bonus_draw + b * 4 + 1, p_row.to(tl.int64))
    tl.store(bonus_draw + b * 4 + 2, d_row.to(tl.int64))
    tl.store(bonus_draw + b * 4 + 3, subtract.to(tl.int64))


@triton.jit
def _tile_sums_kernel(bonus_draw, p, d, tile_sums, vocab_size, num_tiles, BLOCK_V: tl.constexpr):
    b, tile = tl.program_id(0), tl.program_id(1)  # first pass of sample_from_prob: the total, tile by tile
    p_row, d_row = p + tl.load(bonus_draw + b * 4 + 1), d + tl.load(bonus_draw + b * 4 + 2)
    idx = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    w = residual_weights(p_row, d_row, tl.load(bonus_draw + b * 4 + 3), idx, vocab_size)
    tl.store(tile_sums + b * num_tiles + tile, tl.sum(w.to(tl.float64), axis=0))


@triton.jit
def _draw_kernel(bonus_draw, p, d, tile_sums, coins, predicts, vocab_size, num_tiles,
                 TILES: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0)  # second pass: the first token past coin * total (sample_from_prob)
    p_row, d_row = p + tl.load(bonus_draw + b * 4 + 1), d + tl.load(bonus_draw + b * 4 + 2)
    subtract = tl.load(bonus_draw + b * 4 + 3)
    t = tl.arange(0, TILES)
    sums = tl.load(tile_sums + b * num_tiles + t, mask=t < num_tiles, other=0.0)
    threshold = tl.load(coins + b).to(tl.float64) * tl.sum(sums, axis=0)
    cdf = tl.cumsum(sums, axis=0)
    # the tile holding the first token past the threshold; if rounding leaves none, the last tile with weight
    passing = tl.min(tl.where((sums > 0) & (cdf > threshold), t, num_tiles), axis=0)
    last_weighted = tl.max(tl.where(sums > 0, t, -1), axis=0)
    tile = tl.where(passing < num_tiles, passing, tl.maximum(last_weighted, 0))
    carry = tl.sum(tl.where(t < tile, sums, 0.0), axis=0)
    idx = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    w = residual_weights(p_row, d_row, subtract, idx, vocab_size)
    first = tl.min(tl.where((w > 0) & (carry + tl.cumsum(w.to(tl.float64), axis=0) > threshold), idx, vocab_size),
                   axis=0)
    last = tl.max(tl.where(w > 0, idx, -1), axis=0)
    token = tl.where(first < vocab_size, first, tl.where(last != -1, last, vocab_size - 1))
    tl.store(predicts + tl.load(bonus_draw + b * 4), token.to(predicts.dtype.element_ty))


def sample_from_prob(bonus_draw: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                 coins: torch.Tensor, predicts: torch.Tensor) -> None:
    """Every request's bonus into predicts, drawn as the bonus_draw rows say: bonus_draw (bs, 4) int64
    (slot, p row offset, q row offset, subtract) from the walk kernel; coins (bs,) float32."""
    bs, vocab_size = bonus_draw.shape[0], target_probs.shape[-1]
    if not bs:
        return
    BLOCK_V = block_v(vocab_size)
    num_tiles = triton.cdiv(vocab_size, BLOCK_V)
    tile_sums = torch.empty(bs, num_tiles, dtype=torch.float64, device=target_probs.device)
    _tile_sums_kernel[(bs, num_tiles)](bonus_draw, target_probs, draft_probs, tile_sums, vocab_size, num_tiles,
                                       BLOCK_V=BLOCK_V)
    _draw_kernel[(bs,)](bonus_draw, target_probs, draft_probs, tile_sums, coins, predicts, vocab_size, num_tiles,
                        TILES=triton.next_power_of_2(num_tiles), BLOCK_V=BLOCK_V)

"""Triton twin of core/acceptance/tree_rejection.py: tree_rejection_walk, one program per request
(the fast engine's device form of the rule: fast/acceptance/tree_rejection.py).

The explicit walk moves down one node per level and, at each node, tries its children in draw
order against (p', q'), updating both after each rejection. A program runs the same loops for
its request: `max_depth` levels, at most `topk` tries per level (a node has at most topk
children), with p' and q' in two rows of scratch (V floats each) that a rejection rewrites in
place: p' = relu(p' - q') / mass, q'(x) = 0, q' / sum, each a pass over the vocabulary in
blocks, divisions rounded as IEEE (div_rn) as torch divides. It also counts each sibling rank's
tries and acceptances: the host's SiblingStats need them to rank the next step's trees, and
without a trace nothing else tells the host what the walk decided. The bonus is drawn after the
kernel from the p' it leaves, by the caller's inverse-CDF draw (float64, as the explicit one).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.kernels.sampling import residual_weights

BLOCK_V = 1024


@triton.jit
def _copy_row(src, dst, V, BLOCK: tl.constexpr):
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < V), mask=offs < V)


@triton.jit
def _reject(p_row, q_row, tok, V, BLOCK: tl.constexpr):
    """A rejected draw x = tok: p' = relu(p' - q') / mass (unless the mass is 0, where p' == q'),
    q'(x) = 0 and q' = q' / sum. Returns q's remaining mass (0: no draw left to try)."""
    mass = 0.0
    for start in range(0, V, BLOCK):
        mass += tl.sum(residual_weights(p_row, q_row, 1, start + tl.arange(0, BLOCK), V), axis=0)
    tl.debug_barrier()
    if mass > 0:
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            tl.store(p_row + offs, tl.math.div_rn(residual_weights(p_row, q_row, 1, offs, V), mass), mask=offs < V)
    tl.debug_barrier()
    tl.store(q_row + tok, 0.0)
    tl.debug_barrier()
    q_mass = 0.0
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        q_mass += tl.sum(tl.load(q_row + offs, mask=offs < V, other=0.0), axis=0)
    tl.debug_barrier()
    if q_mass > 0:
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            q = tl.load(q_row + offs, mask=offs < V, other=0.0)
            tl.store(q_row + offs, tl.math.div_rn(q, q_mass), mask=offs < V)
    tl.debug_barrier()
    return q_mass


@triton.jit
def _walk_kernel(target_probs, draft_probs, candidates, next_token, next_sibling, coins, accept_index, tried,
                 accepted, p_cur, q_cur, n, V, MAX_DEPTH: tl.constexpr, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)  # tree_rejection_walk for request b
    p_row, q_row = p_cur + b * V, q_cur + b * V
    _copy_row(target_probs + b * n * V, p_row, V, BLOCK)  # p' = p after the root
    tl.debug_barrier()
    row = tl.zeros((), tl.int64)
    walking = tl.full((), 1, tl.int32)
    for depth in range(MAX_DEPTH):
        cur = tl.load(next_token + b * n + row)  # the first child, -1 at a leaf
        trying = ((walking != 0) & (cur >= 0)).to(tl.int32)
        if trying != 0:  # q' = the children's q (siblings share their parent's)
            _copy_row(draft_probs + (b * (n - 1) + cur - 1) * V, q_row, V, BLOCK)
        tl.debug_barrier()
        found = tl.zeros((), tl.int32)
        for rank in range(TOPK):
            c = tl.maximum(cur, 0)
            tok = tl.load(candidates + b * n + c)
            q_tok = tl.load(q_row + tok)
            trying = trying * (q_tok != 0).to(tl.int32)  # not a draw (q had fewer than topk tokens): stop
            ok = trying * (tl.load(coins + b * n + c) * q_tok < tl.load(p_row + tok)).to(tl.int32)
            tl.store(tried + b * TOPK + rank, tl.load(tried + b * TOPK + rank) + trying)
            tl.store(accepted + b * TOPK + rank, tl.load(accepted + b * TOPK + rank) + ok)
            found = found | ok
            if trying - ok != 0:  # rejected: the residual, then the next sibling
                q_mass = _reject(p_row, q_row, tok, V, BLOCK)
                sibling = tl.load(next_sibling + b * n + c)
                trying = ((q_mass > 0) & (sibling >= 0)).to(tl.int32)
                cur = tl.where(trying != 0, sibling, cur)
            else:  # accepted (cur stays the accepted node), or nothing was tried
                trying = tl.zeros((), tl.int32)
        if found != 0:  # down to the accepted child: p' = p after it, fresh
            tl.store(accept_index + b * (MAX_DEPTH + 1) + depth + 1, cur)
            row = cur
            _copy_row(target_probs + (b * n + row) * V, p_row, V, BLOCK)
        tl.debug_barrier()
        walking = found


def _block(V: int, device: torch.device) -> int:
    """Vocabulary entries a pass reads at once: BLOCK_V on a GPU; the whole row on the CPU, where
    the interpreter runs a block as one numpy array and pays per block, not per entry."""
    return triton.next_power_of_2(V) if device.type == "cpu" else min(BLOCK_V, triton.next_power_of_2(V))


def tree_rejection_walk(p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor, next_token: torch.Tensor,
                          next_sibling: torch.Tensor, coins: torch.Tensor, coin_final: torch.Tensor, sample,
                          max_depth: int, topk: int):
    """p (bs, n, V) float32, the target after each node; q (bs, n-1, V) float32, the distribution
    node j + 1 was drawn from (its parent's); candidates, next_token, next_sibling (bs, n)
    node-local indices; coins (bs, n) float32, coin_final (bs,); sample(probs (bs, V), coins)
    -> (bs,) tokens. Returns accept_index (bs, max_depth + 1) as flat rows b * n + node, -1 after
    the path; accept_num (bs,); bonus (bs,); tried and accepted (bs, topk): tries and
    acceptances by sibling rank."""
    bs, n, V = p.shape
    device = p.device
    accept_index = torch.full((bs, max_depth + 1), -1, dtype=torch.int64, device=device)
    accept_index[:, 0] = 0
    tried = torch.zeros(bs, topk, dtype=torch.int64, device=device)
    accepted = torch.zeros_like(tried)
    p_cur, q_cur = torch.empty(2, bs, V, dtype=torch.float32, device=device)
    _walk_kernel[(bs,)](p.contiguous(), q.contiguous(), candidates.contiguous(), next_token.contiguous(),
                        next_sibling.contiguous(), coins.contiguous(), accept_index, tried, accepted, p_cur, q_cur,
                        n, V, MAX_DEPTH=max_depth, TOPK=topk, BLOCK=_block(V, device))
    accept_num = (accept_index[:, 1:] >= 0).sum(-1)
    b = torch.arange(bs, device=device)
    flat = torch.where(accept_index >= 0, accept_index + (b * n)[:, None], -1)  # the engine's rows
    return flat, accept_num, sample(p_cur, coin_final), tried, accepted

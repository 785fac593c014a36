"""Triton twins of the fast engine's ACCEPT tail and COMMIT (fast/engine.py), one program per request:

    accept_tokens   the correct drafts, then the bonus, then -1 (SGLang's accept tokens: the
                    candidates at the accepted rows) and the count, into the row the host reads
    commit_rows     SGLang's KV remap on a static req_to_token row: the verify's n columns
                    reordered so the accepted path's slots come first, in path order, the rest
                    after them in node order (still the request's); seq_lens grows by
                    accept_num + 1 (the root and the correct drafts)
    commit_draft_state  the drafter's COMMIT after its DRAFT_EXTEND: what the next DRAFT starts
                    from (q after the last accepted token, the head's output there) and its
                    KV's committed length, for live requests only

Each replaces a dozen small torch ops (pad, gather, where, cat; arange, scatter, a stable argsort)
whose launches, not their arithmetic, were the cost of these phases on a GPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.kernels import check

__all__ = ["accept_tokens", "commit_draft_state", "commit_rows"]


@triton.jit
def _accept_tokens_kernel(step_out, accept_index, accept_num, bonus, candidates, out_stride,
                          W: tl.constexpr, WB: tl.constexpr):
    b = tl.program_id(0)
    num = tl.load(accept_num + b)
    i = tl.arange(0, WB)
    correct = (i < num) & (i + 1 < W)
    rows = tl.load(accept_index + b * W + i + 1, mask=correct, other=0)  # draft i is path node i + 1
    drafts = tl.load(candidates + rows, mask=correct, other=0)
    tokens = tl.where(correct, drafts, tl.where(i == num, tl.load(bonus + b), -1))
    tl.store(step_out + b * out_stride + i, tokens, mask=i < W)
    tl.store(step_out + b * out_stride + out_stride - 1, num)


def accept_tokens(step_out: torch.Tensor, accept_index: torch.Tensor, accept_num: torch.Tensor, bonus: torch.Tensor,
                  candidates: torch.Tensor) -> None:
    """step_out (bs, C) int64: columns 0 .. W-1 the accept tokens (W = accept_index's width; the
    candidates at accepted rows 1 .. accept_num, the bonus at accept_num, -1 after), column C-1
    accept_num; the columns between are the caller's. candidates (bs, n): the verify rows' tokens."""
    bs, W = accept_index.shape
    device = accept_index.device
    check("step_out", step_out, torch.int64, (bs, None), device)
    check("accept_num", accept_num, torch.int64, (bs,), device)
    check("bonus", bonus, torch.int64, (bs,), device)
    check("candidates", candidates, torch.int64, (bs, None), device)
    if step_out.shape[1] < W + 1 or step_out.stride(1) != 1:
        raise ValueError(f"step_out needs {W + 1} contiguous columns, has {tuple(step_out.shape)}")
    if bs:
        _accept_tokens_kernel[(bs,)](step_out, accept_index, accept_num, bonus, candidates, step_out.stride(0), W=W,
                                     WB=triton.next_power_of_2(W))


@triton.jit
def _commit_rows_kernel(req_to_token, seq_lens, accept_index, accept_num, live, row_stride,
                        W: tl.constexpr, n: tl.constexpr, N: tl.constexpr, WB: tl.constexpr):
    b = tl.program_id(0)
    if tl.load(live + b).to(tl.int32) != 0:  # a finished request's row stays as it is
        num = tl.load(accept_num + b)
        seq = tl.load(seq_lens + b)
        j = tl.arange(0, N)  # the verify's nodes
        ok = j < n
        slots = tl.load(req_to_token + b * row_stride + seq + j, mask=ok, other=0)
        i = tl.arange(0, WB)
        on_path_i = (i <= num) & (i < W)
        path = tl.where(on_path_i, tl.load(accept_index + b * W + i, mask=on_path_i, other=0) - b * n, -1)
        hit = path[None, :] == j[:, None]  # (N, WB): node j is path entry i
        on_path = tl.sum(hit.to(tl.int32), axis=1) > 0
        place = tl.sum(tl.where(hit, i[None, :], 0), axis=1)  # its place on the path
        rest = (~on_path & ok).to(tl.int32)
        rank = tl.where(on_path, place, num + 1 + tl.cumsum(rest, axis=0) - rest)  # the rest in node order
        tl.store(req_to_token + b * row_stride + seq + rank, slots, mask=ok)
        tl.store(seq_lens + b, seq + num + 1)


def commit_rows(req_to_token: torch.Tensor, seq_lens: torch.Tensor, accept_index: torch.Tensor,
                accept_num: torch.Tensor, live: torch.Tensor, n: int) -> None:
    """In place, for each live request b (its row b of req_to_token): columns seq_lens[b] ..
    seq_lens[b] + n - 1 reordered, the accepted path's first (accept_index: flat verify rows
    b * n + node, root first, read up to accept_num), then seq_lens[b] += accept_num[b] + 1."""
    bs, W = accept_index.shape
    device = req_to_token.device
    check("req_to_token", req_to_token, torch.int64, (bs, None), device)
    check("seq_lens", seq_lens, torch.int64, (bs,), device)
    check("accept_num", accept_num, torch.int64, (bs,), device)
    check("live", live, torch.bool, (bs,), device)
    if bs:
        _commit_rows_kernel[(bs,)](req_to_token, seq_lens, accept_index, accept_num, live, req_to_token.stride(0),
                                   W=W, n=n, N=triton.next_power_of_2(n), WB=triton.next_power_of_2(W))


@triton.jit
def _commit_draft_state_kernel(next_probs, last_hidden, seq_lens, probs, h_last, accept_num, live, V, H,
                               HAS_HIDDEN: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    if tl.load(live + b).to(tl.int32) != 0:  # a finished request keeps its state
        for start in range(0, V, BLOCK):
            j = start + tl.arange(0, BLOCK)
            tl.store(next_probs + b * V + j, tl.load(probs + b * V + j, mask=j < V), mask=j < V)
        if HAS_HIDDEN:
            for start in range(0, H, BLOCK):
                j = start + tl.arange(0, BLOCK)
                tl.store(last_hidden + b * H + j, tl.load(h_last + b * H + j, mask=j < H), mask=j < H)
        tl.store(seq_lens + b, tl.load(seq_lens + b) + tl.load(accept_num + b) + 1)


def commit_draft_state(next_probs: torch.Tensor, last_hidden: torch.Tensor | None, seq_lens: torch.Tensor,
                       probs: torch.Tensor, h_last: torch.Tensor | None, accept_num: torch.Tensor,
                       live: torch.Tensor) -> None:
    """In place, for each live request b: next_probs[b] = probs[b] (bs, V), last_hidden[b] =
    h_last[b] (bs, H; None: a draft LM keeps none), seq_lens[b] += accept_num[b] + 1."""
    bs, V = next_probs.shape
    device = next_probs.device
    check("probs", probs, next_probs.dtype, (bs, V), device)
    check("seq_lens", seq_lens, torch.int64, (bs,), device)
    check("accept_num", accept_num, torch.int64, (bs,), device)
    check("live", live, torch.bool, (bs,), device)
    if last_hidden is not None:
        check("h_last", h_last, last_hidden.dtype, tuple(last_hidden.shape), device)
    if bs:
        _commit_draft_state_kernel[(bs,)](next_probs, last_hidden if last_hidden is not None else next_probs,
                                          seq_lens, probs, h_last if h_last is not None else probs, accept_num, live,
                                          V, last_hidden.shape[1] if last_hidden is not None else 0,
                                          HAS_HIDDEN=last_hidden is not None, BLOCK=1024)

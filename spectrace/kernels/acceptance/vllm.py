"""Triton twins of core/acceptance/vllm.py: vLLM's rejection sampler on kernels
(`vllm/v1/sample/rejection_sampler.py`), with its conventions (drafts packed request after request,
`cu_num_draft_tokens` inclusive, `draft_probs=None` for drafts without a distribution):

    vllm_greedy_walk        vllm_walk(greedy=True), one program per request: the target's argmax
                            up to the first mismatch            (vLLM's rejection_greedy_sample)
    vllm_walk               vllm_walk(greedy=False), one program per request: accept iff q > 0
                            and p / q >= u                       (rejection_random_sample)
    vllm_accept             core's vllm_accept over a packed batch: the bonus from the Sampler's
                            race, the recovered tokens, then vllm_walk
    expand_batch_to_tokens  one program per request: its value over its tokens
    recovered_tokens        one program per (request, position): argmax(prob * inv_q) over
                            vocabulary tiles, the first maximum winning as torch.argmax's does
                                                                 (sample_recovered_tokens)
The random numbers are drawn on the host, per request, as the explicit sampler draws them, and
handed to the kernels as tensors. vLLM's RejectionSampler module over them is
spectrace/compat/triton.py's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.core.acceptance.vllm import MAX_SPEC_LEN

__all__ = ["vllm_accept", "vllm_greedy_walk", "vllm_walk", "expand_batch_to_tokens", "recovered_tokens"]

BLOCK_V = 8192  # vLLM's vocabulary tile for recovered tokens


@triton.jit
def _request_rows(cu_num_draft_tokens, r):
    """The request's first draft row and its number of drafts (cu_num_draft_tokens is inclusive)."""
    start = tl.load(cu_num_draft_tokens + r - 1, mask=r > 0, other=0)
    return start, tl.load(cu_num_draft_tokens + r) - start


@triton.jit
def _greedy_kernel(out, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy,
                   max_spec_len, HAS_IS_GREEDY: tl.constexpr):
    r = tl.program_id(0)  # vllm_walk, greedy
    greedy = True
    if HAS_IS_GREEDY:
        greedy = tl.load(is_greedy + r) != 0
    if greedy:
        start, n = _request_rows(cu_num_draft_tokens, r)
        rejected = 0
        for pos in range(0, n):
            if rejected == 0:
                target = tl.load(target_argmax + start + pos)
                tl.store(out + r * (max_spec_len + 1) + pos, target.to(tl.int32))  # the argmax, at a mismatch too
                rejected = (tl.load(draft_token_ids + start + pos) != target).to(tl.int32)
        if rejected == 0:
            tl.store(out + r * (max_spec_len + 1) + n, tl.load(bonus_token_ids + r).to(tl.int32))


@triton.jit
def _random_kernel(out, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus_token_ids,
                   recovered_token_ids, uniforms, is_greedy, max_spec_len, vocab_size,
                   NO_DRAFT_PROBS: tl.constexpr, HAS_IS_GREEDY: tl.constexpr):
    r = tl.program_id(0)  # vllm_walk, random
    greedy = False
    if HAS_IS_GREEDY:
        greedy = tl.load(is_greedy + r) != 0
    if not greedy:
        start, n = _request_rows(cu_num_draft_tokens, r)
        rejected = 0
        for pos in range(0, n):
            if rejected == 0:
                row = (start + pos).to(tl.int64) * vocab_size
                d = tl.load(draft_token_ids + start + pos)
                p = tl.load(target_probs + row + d)
                q = 1.0  # no draft_probs: the drafts were argmax, one-hot
                if not NO_DRAFT_PROBS:
                    q = tl.load(draft_probs + row + d)
                accepted = (q > 0) & ((p / q).to(tl.float64) >= tl.load(uniforms + start + pos))
                token = tl.where(accepted, d, tl.load(recovered_token_ids + start + pos))
                tl.store(out + r * (max_spec_len + 1) + pos, token.to(tl.int32))
                rejected = 1 - accepted.to(tl.int32)
        if rejected == 0:
            tl.store(out + r * (max_spec_len + 1) + n, tl.load(bonus_token_ids + r).to(tl.int32))


@triton.jit
def _expand_kernel(out, x, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS: tl.constexpr):
    r = tl.program_id(0)  # expand_batch_to_tokens
    start, n = _request_rows(cu_num_tokens, r)
    value = tl.load(x + r)
    value = tl.where(value == replace_from, replace_to, value)
    lanes = tl.arange(0, MAX_NUM_TOKENS)
    tl.store(out + start + lanes, tl.zeros_like(lanes).to(value.dtype) + value, mask=lanes < n)


@triton.jit
def _recovered_kernel(recovered_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, inv_q,
                      vocab_size, NO_DRAFT_PROBS: tl.constexpr, BLOCK_V: tl.constexpr):
    r, pos = tl.program_id(0), tl.program_id(1)  # recovered_tokens, one position of one request
    start, n = _request_rows(cu_num_draft_tokens, r)
    if pos < n:
        row = (start + pos).to(tl.int64) * vocab_size
        d = tl.load(draft_token_ids + start + pos)
        lanes = tl.arange(0, BLOCK_V)
        best, best_token = -1.0, 0
        for tile in range(0, vocab_size, BLOCK_V):
            idx = tile + lanes
            p = tl.load(target_probs + row + idx, mask=idx < vocab_size, other=0.0)
            if NO_DRAFT_PROBS:  # p with the draft token zeroed (a masked load, not a store into p)
                prob = tl.where(idx == d, 0.0, p)
            else:
                prob = tl.maximum(p - tl.load(draft_probs + row + idx, mask=idx < vocab_size, other=0.0), 0.0)
            score = prob * tl.load(inv_q + r.to(tl.int64) * vocab_size + idx, mask=idx < vocab_size, other=0.0)
            score = tl.where(idx < vocab_size, score, -1.0)  # lanes past the vocabulary never win
            top = tl.max(score, axis=0)
            first = tl.min(tl.where(score == top, idx, vocab_size), axis=0)  # the first maximum of the tile
            best_token = tl.where(top > best, first, best_token)  # strictly greater: an earlier tile keeps a tie
            best = tl.maximum(best, top)
        tl.store(recovered_token_ids + start + pos, best_token)


def vllm_greedy_walk(out, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy,
                     max_spec_len) -> None:
    """In place: greedy requests' rows of out (B, max_spec_len + 1). is_greedy (B,) bool or None (all)."""
    B = cu_num_draft_tokens.shape[0]
    _greedy_kernel[(B,)](out, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
                         is_greedy if is_greedy is not None else out, max_spec_len,
                         HAS_IS_GREEDY=is_greedy is not None)


def vllm_walk(out, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus_token_ids,
              recovered_token_ids, uniforms, is_greedy, max_spec_len) -> None:
    """In place: the other requests' rows. draft_probs (N, V) or None; uniforms (N,) float64."""
    B, vocab_size = cu_num_draft_tokens.shape[0], target_probs.shape[-1]
    _random_kernel[(B,)](out, cu_num_draft_tokens, draft_token_ids,
                         draft_probs if draft_probs is not None else target_probs, target_probs, bonus_token_ids,
                         recovered_token_ids, uniforms, is_greedy if is_greedy is not None else out, max_spec_len,
                         vocab_size, NO_DRAFT_PROBS=draft_probs is None, HAS_IS_GREEDY=is_greedy is not None)


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from=0,
                           replace_to=0) -> torch.Tensor:
    """Each request's value over its tokens (N,), replace_from becoming replace_to."""
    out = torch.empty(num_tokens, dtype=x.dtype, device=x.device)
    if len(x):
        _expand_kernel[(len(x),)](out, x, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=MAX_SPEC_LEN)
    return out


def recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs,
                     target_probs, inv_q) -> torch.Tensor:
    """The recovered token of every draft position (N,): argmax(relu(p - q) * inv_q[request])."""
    recovered = torch.empty_like(draft_token_ids)
    if len(num_draft_tokens) and max_spec_len:
        _recovered_kernel[(len(num_draft_tokens), max_spec_len)](
            recovered, cu_num_draft_tokens, draft_token_ids, draft_probs if draft_probs is not None else target_probs,
            target_probs, inv_q, target_probs.shape[-1], NO_DRAFT_PROBS=draft_probs is None,
            BLOCK_V=min(BLOCK_V, triton.next_power_of_2(target_probs.shape[-1])))
    return recovered


def vllm_accept(out, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus_probs, bonus_noise, inv_q,
                uniforms, max_spec_len) -> None:
    """core/acceptance/vllm.py: vllm_accept for a packed batch of B requests, into out
    (B, max_spec_len + 1) (-1 filled): the bonus is vLLM's Sampler's race on bonus_probs (B, V), p
    after each request's last draft (argmax(p / noise), torch as in vLLM); then the recovered
    tokens and the walk. target_probs, draft_probs (N, V) at the N packed drafts."""
    bonus = torch.argmax(bonus_probs / bonus_noise, dim=-1)
    B = cu_num_draft_tokens.shape[0]
    recovered = recovered_tokens(max_spec_len, [max_spec_len] * B, cu_num_draft_tokens, draft_token_ids, draft_probs,
                                 target_probs, inv_q)
    vllm_walk(out, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus[:, None], recovered, uniforms,
              None, max_spec_len)

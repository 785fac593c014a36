"""Triton twin of `spectrace.compat.vllm.RejectionSampler`: vLLM's rejection sampler on kernels
(`vllm/v1/sample/rejection_sampler.py`), same `forward(metadata, draft_probs, target_logits,
bonus_token_ids, sampling_metadata)`, same conventions (`temperature=None` when all requests are
greedy, `draft_probs=None` for drafts without a distribution).

    rejection_greedy_sample   one program per request: the target's argmax up to the first mismatch
    rejection_random_sample   one program per request: accept iff q > 0 and p / q >= u
    expand_batch_to_tokens    one program per request: its value over its tokens
    sample_recovered_tokens   one program per (request, position): argmax(prob * inv_q) over
                              vocabulary tiles, the first maximum winning as torch.argmax's does

Each mirrors `spectrace.core.acceptance.vllm` (vllm_walk, recovered_tokens, expand_batch_to_tokens).
The random numbers are drawn on the host, per request, as the explicit sampler draws them
(`sampler_randoms`), and handed to the kernels as tensors; p after temperature, top-k and top-p
is torch's, as in vLLM (`probs_from_logits`, once per distinct setting).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.compat.vllm import GREEDY_TEMPERATURE, MAX_SPEC_LEN, SamplingMetadata, SpecDecodeMetadata
from spectrace.core.acceptance.vllm import PLACEHOLDER_TOKEN_ID, sampler_randoms
from spectrace.core.sampling import SamplingParams, probs_from_logits
from spectrace.kernels import check

__all__ = ["RejectionSampler", "rejection_greedy_sample", "rejection_random_sample", "expand_batch_to_tokens",
           "sample_recovered_tokens"]

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


def rejection_greedy_sample(out, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy,
                            max_spec_len) -> None:
    """In place: greedy requests' rows of out (B, max_spec_len + 1). is_greedy (B,) bool or None (all)."""
    B = cu_num_draft_tokens.shape[0]
    _greedy_kernel[(B,)](out, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
                         is_greedy if is_greedy is not None else out, max_spec_len,
                         HAS_IS_GREEDY=is_greedy is not None)


def rejection_random_sample(out, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus_token_ids,
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


def sample_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs,
                            target_probs, inv_q) -> torch.Tensor:
    """The recovered token of every draft position (N,): argmax(relu(p - q) * inv_q[request])."""
    recovered = torch.empty_like(draft_token_ids)
    if len(num_draft_tokens) and max_spec_len:
        _recovered_kernel[(len(num_draft_tokens), max_spec_len)](
            recovered, cu_num_draft_tokens, draft_token_ids, draft_probs if draft_probs is not None else target_probs,
            target_probs, inv_q, target_probs.shape[-1], NO_DRAFT_PROBS=draft_probs is None,
            BLOCK_V=min(BLOCK_V, triton.next_power_of_2(target_probs.shape[-1])))
    return recovered


class RejectionSampler(torch.nn.Module):
    def forward(self, metadata: SpecDecodeMetadata, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
                bonus_token_ids: torch.Tensor, sampling_metadata: SamplingMetadata) -> torch.Tensor:
        """draft_probs [N, V] or None; target_logits [N, V]; bonus_token_ids [B, 1] -> [B, max_spec_len + 1]."""
        device, B, N = target_logits.device, len(metadata.num_draft_tokens), sum(metadata.num_draft_tokens)
        check("target_logits", target_logits, (torch.float32, torch.bfloat16, torch.float16), (N, None))
        if draft_probs is not None:
            check("draft_probs", draft_probs, torch.float32, tuple(target_logits.shape), device)
        check("bonus_token_ids", bonus_token_ids, shape=(B, 1), device=device)
        assert metadata.max_spec_len <= MAX_SPEC_LEN
        out = torch.full((B, metadata.max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=device)
        sm, cu = sampling_metadata, metadata.cu_num_draft_tokens.to(device)
        draft_ids = metadata.draft_token_ids.to(device)
        is_greedy = None if sm.all_greedy else (sm.temperature == GREEDY_TEMPERATURE).to(device)
        if sm.all_greedy or bool(is_greedy.any()):
            rejection_greedy_sample(out, cu, draft_ids, target_logits.argmax(-1), bonus_token_ids, is_greedy,
                                    metadata.max_spec_len)
            if sm.all_greedy:
                return out
        uniforms, inv_q = self.randoms(metadata, sm, target_logits.shape[-1], device)
        target_probs = self.target_probs(target_logits, metadata, sm)
        recovered = sample_recovered_tokens(metadata.max_spec_len, metadata.num_draft_tokens, cu, draft_ids,
                                            draft_probs, target_probs, inv_q)
        rejection_random_sample(out, cu, draft_ids, draft_probs, target_probs, bonus_token_ids, recovered, uniforms,
                                is_greedy, metadata.max_spec_len)
        return out

    @staticmethod
    def randoms(metadata, sm, vocab: int, device):
        """Each random request's uniforms and inv_q, drawn as the explicit sampler draws them
        (greedy requests and requests without drafts draw nothing)."""
        gens = sm.generators or {}
        uniforms = torch.zeros(sum(metadata.num_draft_tokens), dtype=torch.float64)
        inv_q = torch.zeros(len(metadata.num_draft_tokens), vocab)
        start = 0
        for r, n in enumerate(metadata.num_draft_tokens):
            if n and not (sm.all_greedy or float(sm.temperature[r]) == GREEDY_TEMPERATURE):
                uniforms[start:start + n], inv_q[r] = sampler_randoms(n, vocab, gens.get(r))
            start += n
        return uniforms.to(device), inv_q.to(device)

    @staticmethod
    def target_probs(target_logits, metadata, sm) -> torch.Tensor:
        """p of every draft row after its request's temperature, top-k and top-p: expanded to the
        tokens, then torch's `probs_from_logits` once per distinct setting (vLLM's compute_probs)."""
        cu, N = metadata.cu_num_draft_tokens.to(target_logits.device), target_logits.shape[0]
        B = len(metadata.num_draft_tokens)
        temperature = expand_batch_to_tokens(sm.temperature.float().to(target_logits.device), cu, N,
                                             float(GREEDY_TEMPERATURE), 1.0)
        top_k = expand_batch_to_tokens((sm.top_k if sm.top_k is not None else torch.zeros(B)).long()
                                       .to(target_logits.device), cu, N)
        top_p = expand_batch_to_tokens((sm.top_p if sm.top_p is not None else torch.ones(B)).float()
                                       .to(target_logits.device), cu, N)
        settings = torch.stack([temperature, top_k.float(), top_p], 1)
        probs = torch.empty(target_logits.shape, dtype=torch.float32, device=target_logits.device)
        for t, k, p in torch.unique(settings, dim=0).tolist():
            rows = (settings == torch.tensor([t, k, p], device=settings.device)).all(1)
            probs[rows] = probs_from_logits(target_logits[rows], SamplingParams(t, int(k), p))
        return probs

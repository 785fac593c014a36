"""vLLM's rejection sampler (--acceptance vllm), `vllm/v1/sample/rejection_sampler.py`, with
v0.8.5's
greedy convention and current vLLM's float64 uniforms and `* inv_q` recovered tokens.

A chain of n drafts per request; target probabilities p at each draft position; the bonus token
was sampled beforehand from p after the last draft.

    greedy request   out[pos] = argmax p; stop after the first position where draft != argmax
    random request   accepted = q(d) > 0 and p(d) / q(d) >= u      (q = 1 when draft_probs is None:
                     out[pos] = d if accepted else recovered[pos]    drafts were argmax, one-hot)
    all accepted     out[n] = bonus
    recovered[pos] = argmax_v prob(v) * inv_q(v),  prob = relu(p - q)  (draft_probs None: p with
                     the draft token zeroed), inv_q = 1 / e, e ~ Exp(1), one noise vector per
                     request: the exponential race, a sample of prob / sum(prob) without normalising
Positions after a rejection keep PLACEHOLDER_TOKEN_ID (-1). `p / q` is a float32 division compared
with a float64 uniform, as in `rejection_random_sample_kernel`.
"""
from __future__ import annotations

import numpy as np
import torch

from spectrace.core.acceptance import AcceptResult, Randoms, bonus_from, decision

PLACEHOLDER_TOKEN_ID = -1
MAX_SPEC_LEN = 32  # vLLM's bound on the drafts of one request
F32 = np.float32


def recovered_tokens(target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
                     drafts: list[int], inv_q: torch.Tensor) -> list[int]:
    """`sample_recovered_tokens_kernel` for one request: target_probs (n, V); draft_probs (n, V)
    or None; inv_q (V,) = 1 / Exp(1) noise, shared by the request's positions."""
    out = []
    for pos, d in enumerate(drafts):
        if draft_probs is None:
            prob = target_probs[pos].clone()
            prob[d] = 0.0
        else:
            prob = torch.clamp(target_probs[pos] - draft_probs[pos], min=0.0)
        out.append(int(torch.argmax(prob * inv_q)))
    return out


def vllm_walk(drafts: list[int], target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
              bonus: int, uniforms: torch.Tensor | None, inv_q: torch.Tensor | None,
              greedy: bool) -> tuple[list[int], list[dict]]:
    """One request of `rejection_greedy_sample_kernel` / `rejection_random_sample_kernel`: the
    output row (n + 1 entries, -1 placeholders) and the decisions."""
    n = len(drafts)
    out, decisions = [PLACEHOLDER_TOKEN_ID] * (n + 1), []
    if greedy:
        argmax = target_probs.argmax(-1).tolist() if n else []
        for pos, d in enumerate(drafts):
            out[pos] = argmax[pos]
            ok = d == argmax[pos]
            decisions.append(decision(pos + 1, d, ok, "draft == argmax(p)" if ok else
                                      "draft != argmax(p): emit argmax(p)",
                                      target_argmax=argmax[pos]))
            if not ok:
                return out, decisions
        out[n] = bonus
        return out, decisions
    recovered = recovered_tokens(target_probs, draft_probs, drafts, inv_q) if n else []
    for pos, d in enumerate(drafts):
        u = float(uniforms[pos])  # float64
        q = F32(1.0) if draft_probs is None else F32(draft_probs[pos, d])
        p = F32(target_probs[pos, d])
        ok = bool(q > 0 and p / q >= u)  # the float32 quotient is compared in float64
        out[pos] = d if ok else recovered[pos]
        why = "p / q >= u" if ok else \
            f"p / q < u: emit the recovered token {recovered[pos]} ~ relu(p - q)"
        decisions.append(decision(pos + 1, d, ok, why, coin=u, p=p, q=q))
        if not ok:
            return out, decisions
    out[n] = bonus
    return out, decisions


def sampler_randoms(num_drafts: int, vocab: int,
                    gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """What the rejection sampler draws for one request, in vLLM's order on its generator: one
    float64 uniform per draft (`generate_uniform_probs`), then the recovered tokens' V Exp(1)
    noise, returned as inv_q = 1 / noise."""
    uniforms = torch.rand(num_drafts, dtype=torch.float64, generator=gen)
    return uniforms, 1.0 / torch.empty(vocab, dtype=torch.float32).exponential_(generator=gen)


def draw(n: int, vocab: int, gen: torch.Generator | None) -> Randoms:
    """The engine's rule on n nodes (n - 1 drafts): the Sampler's noise for the bonus first, as
    vLLM samples the bonus before rejection, then the sampler's randoms."""
    bonus_noise = torch.empty(vocab, dtype=torch.float32).exponential_(generator=gen)
    uniforms, inv_q = sampler_randoms(n - 1, vocab, gen)
    return Randoms(bonus_noise=bonus_noise, uniforms=uniforms, inv_q=inv_q)


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int,
                           replace_from=0, replace_to=0) -> torch.Tensor:
    """vLLM's `expand_batch_to_tokens`: each request's value over its tokens (N,), replace_from
    becoming replace_to (greedy requests' temperature becomes 1). cu_num_tokens is inclusive."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    out = torch.repeat_interleave(torch.where(x == replace_from, torch.full_like(x, replace_to), x),
                                  counts)
    assert out.numel() == num_tokens
    return out


def vllm_accept(candidates, retrive_next_token, retrive_next_sibling, target_predict, target_probs,
                draft_probs, randoms, max_depth, params) -> AcceptResult:
    """The engine's use of the sampler on one request's chain: candidates (n,) root then drafts;
    target_probs (n, V) after each node; draft_probs (n-1, V), None for n-gram and DFLASH drafts
    (one-hot, as vLLM passes draft_probs=None). The bonus is vLLM's Sampler's exponential race on
    p after the last draft: argmax(p / noise)."""
    drafts = candidates[1:]
    n = len(drafts)
    bonus = int(torch.argmax(target_probs[n] / randoms.bonus_noise))
    out, decisions = vllm_walk(drafts, target_probs[:n], draft_probs, bonus, randoms.uniforms,
                               randoms.inv_q, greedy=False)
    emitted = [t for t in out if t != PLACEHOLDER_TOKEN_ID]
    correct = emitted[:-1]
    row = len(correct)
    rejected = row < n
    if not rejected:
        prob = target_probs[row]
    elif draft_probs is None:
        prob = target_probs[row].clone().index_fill_(0, torch.tensor([drafts[row]]), 0.0)
    else:
        prob = torch.clamp(target_probs[row] - draft_probs[row], min=0.0)
    return AcceptResult(correct, emitted[-1], list(range(row + 1)), decisions,
                        bonus_from("residual" if rejected else "target", row, prob,
                                   params.trace_topk))

"""vLLM's rejection sampler (--acceptance vllm), v0.8.5 semantics with float64 coins.

A chain of n drafts per request; target probabilities p at each draft position; the bonus token
was sampled beforehand from the target's logits after the last draft.

    greedy request   out[pos] = argmax p; stop after the first position where draft != argmax
    random request   accepted = q(d) > 0 and p(d) / q(d) >= u      (q = 1 when draft_probs is None:
                     out[pos] = d if accepted else recovered[pos]    drafts were argmax, one-hot)
    all accepted     out[n] = bonus
    recovered[pos] = argmax_v prob(v) / e(v),  prob = relu(p - q)  (draft_probs None: p with the
                     draft token zeroed), e ~ Exp(1), one noise vector per request: the exponential
                     race, a sample of prob / sum(prob) without normalising
Positions after a rejection keep PLACEHOLDER_TOKEN_ID (-1). Per-request generators draw the n
uniforms, then the V exponentials (requests without drafts draw nothing).
"""
from __future__ import annotations

import torch

from spectrace.core.acceptance.greedy import AcceptResult
from spectrace.core.sampling import sample_from_prob, topk_pairs

PLACEHOLDER_TOKEN_ID = -1


def recovered_tokens(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, drafts: list[int],
                     exp_noise: torch.Tensor) -> list[int]:
    """target_probs (n, V); draft_probs (n, V) or None; exp_noise (V,) Exp(1) draws."""
    out = []
    for pos, d in enumerate(drafts):
        if draft_probs is None:
            prob = target_probs[pos].clone()
            prob[d] = 0.0
        else:
            prob = torch.clamp(target_probs[pos] - draft_probs[pos], min=0.0)
        out.append(int(torch.argmax(prob / exp_noise)))
    return out


def vllm_walk(drafts: list[int], target_probs: torch.Tensor, draft_probs: torch.Tensor | None, bonus: int,
              uniforms: torch.Tensor | None, exp_noise: torch.Tensor | None, greedy: bool,
              trace_topk: int = 5) -> tuple[list[int], list[dict]]:
    """One request: the output row (n + 1 entries, -1 placeholders) and the decisions."""
    n = len(drafts)
    out, decisions = [PLACEHOLDER_TOKEN_ID] * (n + 1), []
    if greedy:
        argmax = target_probs.argmax(-1).tolist() if n else []
        for pos, d in enumerate(drafts):
            out[pos] = argmax[pos]
            ok = d == argmax[pos]
            decisions.append({"node": pos + 1, "draft": d, "target_argmax": argmax[pos], "accepted": ok,
                              "rule": "draft == argmax(p)" if ok else "draft != argmax(p): emit argmax(p)"})
            if not ok:
                return out, decisions
        out[n] = bonus
        return out, decisions
    recovered = recovered_tokens(target_probs, draft_probs, drafts, exp_noise) if n else []
    for pos, d in enumerate(drafts):
        u = float(uniforms[pos])
        q = 1.0 if draft_probs is None else float(draft_probs[pos, d])
        p = float(target_probs[pos, d])
        ok = q > 0 and p / q >= u
        out[pos] = d if ok else recovered[pos]
        decisions.append({"node": pos + 1, "draft": d, "accepted": ok, "coin": round(u, 6), "p": round(p, 6),
                          "q": round(q, 6), "rule": "p / q >= u" if ok else
                          f"p / q < u: emit the recovered token {recovered[pos]} ~ relu(p - q)"})
        if not ok:
            return out, decisions
    out[n] = bonus
    return out, decisions


def draw_randoms(n: int, vocab: int, gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The request's n float64 uniforms, then its V exponentials, in vLLM's order."""
    u = torch.rand(n, dtype=torch.float64, generator=gen)
    e = torch.empty(vocab, dtype=torch.float32).exponential_(generator=gen)
    return u, e


def vllm_accept(candidates: list[int], target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
                gen: torch.Generator, trace_topk: int = 5) -> AcceptResult:
    """The engine's use of the sampler for one request's chain: candidates (n+1,) root then
    drafts; target_probs (n+1, V) after each node. The bonus is drawn first from p after the
    last draft (vLLM samples it before rejection), then the uniforms and the exponentials."""
    drafts = candidates[1:]
    n = len(drafts)
    bonus_u = torch.rand((), dtype=torch.float64, generator=gen)
    bonus = sample_from_prob(target_probs[n], float(bonus_u))
    u, e = draw_randoms(n, target_probs.shape[-1], gen)
    out, decisions = vllm_walk(drafts, target_probs[:n], draft_probs, bonus, u, e, greedy=False)
    emitted = [t for t in out if t != PLACEHOLDER_TOKEN_ID]
    correct = emitted[:-1]
    rejected = len(correct) < n
    row = len(correct)
    if rejected:
        prob = torch.clamp(target_probs[row] - draft_probs[row], min=0.0) if draft_probs is not None else \
            target_probs[row].clone().index_fill_(0, torch.tensor([drafts[row]]), 0.0)
    else:
        prob = target_probs[row]
    bonus_from = {"dist": "residual" if rejected else "target", "node": row,
                  "topk": topk_pairs(prob / max(float(prob.sum()), 1e-30), trace_topk)}
    return AcceptResult(correct, emitted[-1], list(range(row + 1)), decisions, bonus_from)

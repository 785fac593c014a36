"""Probabilities from logits as the engines apply temperature, top-k and top-p, and the seeded
random numbers every sampling path draws from.

    probs = softmax(logits / T)  ->  keep the top_k largest (ties with the k-th survive), renorm
                                 ->  keep the smallest prefix of largest probs whose mass
                                     reaches top_p (the largest always survives), renorm
SGLang applies `top_k_renorm_prob` then `top_p_renorm_prob` to softmax(logits / T); vLLM masks
logits (top-k, then top-p on the masked softmax) before its softmax: the same distribution.

Randomness: each request owns a `torch.Generator` seeded with seed + request index, so a
request's draws do not depend on its batch neighbours and a seeded run repeats bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0 or less: off
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 probabilities after temperature, top-k and top-p."""
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if 0 < params.top_k < probs.shape[-1]:
        kth = torch.topk(probs, params.top_k, dim=-1).values[..., -1:]
        probs = torch.where(probs >= kth, probs, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of the larger ones
        keep_sorted = before < params.top_p  # the first is always kept
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = torch.where(keep, probs, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def request_generator(seed: int, request: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + request)


def sample(probs: torch.Tensor, gen: torch.Generator) -> int:
    """One token from a (V,) distribution with the request's generator (inverse CDF)."""
    return sample_from_prob(probs.detach().cpu(),
                            float(torch.rand((), generator=gen, dtype=torch.float64)))


def exponential_race(probs: torch.Tensor, k: int,
                     gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """k draws without replacement from each row of probs (R, V), in draw order: the first k
    arrivals of an exponential race, token v arriving at E_v / p_v with E_v ~ Exp(1) (Gumbel-top-k
    sampling; each arrival is a sample of what the earlier ones left). SGLang's
    `sample_draft_proposal` draws a chain's draft as the first arrival, argmax(p / E). Returns the
    tokens (R, k) and which are real draws (R, k): a row with fewer than k tokens of mass pads."""
    noise = torch.empty(probs.shape, dtype=torch.float32).exponential_(generator=gen)
    noise = noise.to(probs.device)
    arrivals = torch.topk(probs / noise, k, dim=-1)
    return arrivals.indices, arrivals.values > 0


def sample_from_prob(weights: torch.Tensor, coin: float) -> int:
    """flashinfer's DeviceSamplingFromProb on unnormalised weights (V,): the smallest i with
    weights[i] > 0 and cumsum[i] > coin * sum; if rounding leaves none, the last i with
    weights[i] > 0. This is how SGLang samples bonus and residual tokens (here in float64)."""
    w = weights.detach().cpu().numpy().astype(np.float64)
    c = np.cumsum(w)
    hit = np.flatnonzero((w > 0) & (c > coin * c[-1]))
    if len(hit):
        return int(hit[0])
    pos = np.flatnonzero(w > 0)
    return int(pos[-1]) if len(pos) else len(w) - 1


def topk_pairs(probs: torch.Tensor, k: int) -> list:
    """[[token, prob], ...] of the k most likely tokens: what a trace records of a distribution.
    probs (V,) gives one such list, (..., V) one per row."""
    p, i = torch.topk(probs.float(), min(k, probs.shape[-1]))
    return as_pairs(i.tolist(), p.tolist())


def as_pairs(ids: list, ps: list) -> list:
    """Token ids and their probabilities as the trace's [[token, prob], ...] lists (nested
    alike)."""
    if ids and isinstance(ids[0], list):
        return [as_pairs(a, b) for a, b in zip(ids, ps)]
    return [[a, round(b, 6)] for a, b in zip(ids, ps)]

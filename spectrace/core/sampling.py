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
    return sample_from_prob(probs.detach().cpu().double(), float(torch.rand((), generator=gen, dtype=torch.float64)))


def sample_without_replacement(probs: torch.Tensor, k: int, gen: torch.Generator) -> list[int]:
    """Up to k distinct tokens of a (V,) distribution in draw order: each draw is a sample of what
    the earlier draws left (sampling without replacement). Fewer when fewer have mass."""
    w = probs.detach().cpu().double().clone()
    out = []
    while len(out) < k and w.sum() > 0:
        out.append(sample_from_prob(w, float(torch.rand((), generator=gen, dtype=torch.float64))))
        w[out[-1]] = 0.0
    return out


def sample_from_prob(weights: torch.Tensor, coin: float) -> int:
    """flashinfer's DeviceSamplingFromProb on unnormalised weights (V,): the smallest i with
    weights[i] > 0 and cumsum[i] > coin * sum; if rounding leaves none, the last i with
    weights[i] > 0. This is how SGLang samples bonus and residual tokens."""
    w = weights.double()
    c = torch.cumsum(w, 0)
    hit = torch.nonzero((w > 0) & (c > coin * c[-1]))
    if len(hit):
        return int(hit[0])
    pos = torch.nonzero(w > 0)
    return int(pos[-1]) if len(pos) else len(w) - 1


def topk_pairs(probs: torch.Tensor, k: int) -> list[list]:
    """[[token, prob], ...] of the k most likely tokens: what a trace records of a distribution."""
    p, i = torch.topk(probs.float(), min(k, probs.shape[-1]))
    return [[int(a), round(float(b), 6)] for a, b in zip(i, p)]

"""Sampling as the engines apply it, against brute-force readings of the definitions, and the
exponential race that draws sampled drafts against its exact law."""
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spectrace.core.sampling import SamplingParams, exponential_race, probs_from_logits, sample_from_prob
from spectrace.testing import chi_square, samples_for


def brute_probs(logits: list[float], temperature: float, top_k: int, top_p: float) -> list[float]:
    """softmax(logits / T); keep the top_k largest (ties with the k-th survive), renormalise; keep
    the largest probabilities, in order, while the mass before each is below top_p, renormalise."""
    m = max(x / temperature for x in logits)
    e = [math.exp(x / temperature - m) for x in logits]
    p = [x / sum(e) for x in e]
    if 0 < top_k < len(p):
        kth = sorted(p, reverse=True)[top_k - 1]
        p = [x if x >= kth else 0.0 for x in p]
        p = [x / sum(p) for x in p]
    if top_p < 1.0:
        kept, before = set(), 0.0
        for i in sorted(range(len(p)), key=lambda i: -p[i]):
            if before >= top_p:
                break
            kept.add(i)
            before += p[i]
        p = [x if i in kept else 0.0 for i, x in enumerate(p)]
        p = [x / sum(p) for x in p]
    return p


@settings(max_examples=300, deadline=None)
@given(logits=st.lists(st.integers(-30, 30), min_size=2, max_size=12, unique=True),
       temperature=st.sampled_from([0.3, 0.7, 1.0, 2.0]), top_k=st.integers(0, 13),
       top_p=st.sampled_from([1.0, 0.95, 0.8, 0.5, 0.1]))
def test_probs_from_logits_is_temperature_then_top_k_then_top_p(logits, temperature, top_k, top_p):
    """Distinct logits (so the order that top-p walks is unique)."""
    logits = [x / 4 for x in logits]
    got = probs_from_logits(torch.tensor(logits), SamplingParams(temperature, top_k, top_p)).tolist()
    want = brute_probs(logits, temperature, top_k, top_p)
    assert [g > 0 for g in got] == [w > 0 for w in want]
    assert all(abs(g - w) < 1e-5 for g, w in zip(got, want))


@settings(max_examples=200, deadline=None)
@given(logits=st.lists(st.integers(-3, 3), min_size=2, max_size=10), top_k=st.integers(1, 10))
def test_top_k_keeps_every_tie_of_the_kth(logits, top_k):
    got = probs_from_logits(torch.tensor(logits, dtype=torch.float32), SamplingParams(1.0, top_k, 1.0)).tolist()
    want = brute_probs([float(x) for x in logits], 1.0, top_k, 1.0)
    assert all(abs(g - w) < 1e-6 for g, w in zip(got, want))


def brute_sample(weights: list[float], coin: float) -> int:
    """flashinfer's rule read literally: the first i with mass whose running sum passes
    coin * total; rounding past the end falls back to the last i with mass."""
    total = 0.0
    for w in weights:
        total += w
    running = 0.0
    for i, w in enumerate(weights):
        running += w
        if w > 0 and running > coin * total:
            return i
    positive = [i for i, w in enumerate(weights) if w > 0]
    return positive[-1] if positive else len(weights) - 1


@settings(max_examples=500, deadline=None)
@given(weights=st.lists(st.sampled_from([0.0, 0.0, 1e-9, 0.1, 0.25, 1.0, 3.0]), min_size=1, max_size=9),
       coin=st.sampled_from([0.0, 1e-12, 0.3, 0.5, 0.999999, 1.0]) | st.floats(0, 1))
def test_sample_from_prob_is_the_first_index_past_the_coin(weights, coin):
    assert sample_from_prob(torch.tensor(weights, dtype=torch.float64), coin) == brute_sample(weights, coin)


def test_the_exponential_race_draws_without_replacement_in_order():
    """The first two arrivals (a, b) have the law of two draws without replacement,
    p_a * p_b / (1 - p_a); a row with one token of mass has one real draw."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, generator=g) * 1.5, -1)
    exact = p[:, None] * p[None, :] / (1 - p[:, None])
    exact.fill_diagonal_(0)
    n = samples_for(exact)
    tokens, real = exponential_race(p.expand(n, 4), 2, g)
    assert real.all()
    stat, crit = chi_square(torch.bincount(tokens[:, 0] * 4 + tokens[:, 1], minlength=16), exact)
    assert stat < crit, f"chi2 {stat:.1f} >= {crit:.1f}"
    tokens, real = exponential_race(torch.tensor([[0.0, 1.0, 0.0]]), 2, g)
    assert tokens[0, 0] == 1 and real.tolist() == [[True, False]]

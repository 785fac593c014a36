"""Medusa's typical acceptance (--acceptance typical): a target-only threshold that follows the
target's entropy (FasterDecoding/Medusa `evaluate_posterior`, sampling="typical").

With p the target's distribution after a node's parent (softmax(logits / T)):

    threshold = min(posterior_threshold, posterior_alpha * exp(-H(p)))     H(p) = -sum p log(p +
                                                                           1e-5)
    a node x passes iff p(x) > threshold
    every root-to-leaf path keeps its longest passing prefix; the longest wins, ties go to the
    higher sum of log p(x) along it
    bonus: a sample of p after the last accepted node with the tokens below its threshold removed
           (`get_typical_one_token`)

A confident target (low entropy) keeps the threshold near posterior_threshold; an unsure one
lowers it, so plausible drafts pass. No draft probability enters: it is not a rejection test,
and at T > 0 the output is NOT the target's distribution (tests/test_acceptance.py measures the
bias). Defaults are `medusa_generate`'s, 0.09 and 0.3 (its `evaluate_posterior` swaps them).
"""
from __future__ import annotations

import math

import torch

from spectrace.core.acceptance import AcceptResult, Randoms, bonus_from, decision
from spectrace.core.sampling import sample_from_prob
from spectrace.core.tree import children

POSTERIOR_THRESHOLD, POSTERIOR_ALPHA = 0.09, 0.3


def typical_threshold(p: torch.Tensor, posterior_threshold: float,
                      posterior_alpha: float) -> tuple[float, float]:
    """(threshold, entropy) of one distribution (V,)."""
    entropy = float(-(p * torch.log(p + 1e-5)).sum())
    return min(posterior_threshold, math.exp(-entropy) * posterior_alpha), entropy


def draw(n: int, vocab: int, gen: torch.Generator | None) -> Randoms:
    """One coin, for the bonus (Medusa draws it with torch.multinomial)."""
    return Randoms(coin_final=torch.rand((), generator=gen))


def typical_walk(candidates, retrive_next_token, retrive_next_sibling, target_predict, target_probs,
                 draft_probs, randoms, max_depth, params) -> AcceptResult:
    """Reads target_probs (n, V), p after each node, and randoms.coin_final, the bonus's coin."""
    limits = [typical_threshold(p, POSTERIOR_THRESHOLD, POSTERIOR_ALPHA) for p in target_probs]
    parent = {c: node for node in range(len(candidates))
              for c in children(node, retrive_next_token, retrive_next_sibling)}

    def passes(node: int) -> bool:
        return float(target_probs[parent[node], candidates[node]]) > limits[parent[node]][0]

    # every path's longest passing prefix, as a list of nodes (the root excluded)
    best, best_key = [], (0, 0.0)
    stack = [[c] for c in children(0, retrive_next_token, retrive_next_sibling)]
    while stack:
        path = stack.pop()
        if not passes(path[-1]):
            continue
        ll = sum(math.log(float(target_probs[parent[n], candidates[n]])) for n in path)
        if (len(path), ll) > best_key:
            best, best_key = path, (len(path), ll)
        stack += [path + [c] for c in children(path[-1], retrive_next_token, retrive_next_sibling)]
    chosen = set(best)
    decisions = []
    for node in sorted(parent):  # each node whose parent passed (or is the root) was tested
        if parent[node] != 0 and not passes(parent[node]):
            continue
        p, (threshold, entropy) = (float(target_probs[parent[node], candidates[node]]),
                                   limits[parent[node]])
        ok = passes(node)
        decisions.append(decision(node, candidates[node], node in chosen,
                                  "p > threshold" if node in chosen else
                                  "p > threshold, but another path is longer or likelier" if ok
                                  else "p <= threshold", p=p, threshold=threshold,
                                  entropy=round(entropy, 4), passes=ok))
    last = best[-1] if best else 0
    p = target_probs[last].double()
    kept = torch.where(p >= limits[last][0], p, 0.0)  # Medusa removes tokens with p < threshold
    coin = float(randoms.coin_final)
    return AcceptResult([candidates[n] for n in best], sample_from_prob(kept, coin), [0] + best,
                        decisions,
                        bonus_from("typical", last, kept, params.trace_topk, coin=coin,
                                   threshold=limits[last][0]))

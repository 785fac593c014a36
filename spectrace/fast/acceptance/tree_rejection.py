"""tree_rejection on the device (core/acceptance/tree_rejection.py): the recursive rejection walk
over sampled trees, one Triton program per request (kernels/acceptance/tree_rejection.py), the bonus
drawn after it from the residual it leaves. It also returns each sibling rank's tries and
acceptances: the host's SiblingStats rank the next step's trees from them.
"""
from __future__ import annotations

import torch

from spectrace.core.acceptance.tree_rejection import SiblingStats
from spectrace.core.request import Request
from spectrace.fast.acceptance import Verdict, target_probs
from spectrace.fast.sampling import sample_rows
from spectrace.kernels.acceptance.tree_rejection import tree_rejection_walk


def tree_rejection_accept(tree, logits, target_predict, randoms, spec, max_depth) -> Verdict:
    index, num, bonus, tried, accepted = tree_rejection_walk(
        target_probs(logits, tree, spec), tree.draft_probs, tree.draft_tokens,
        tree.retrive_next_token, tree.retrive_next_sibling, randoms.coins, randoms.coin_final,
        sample_rows, max_depth, randoms.topk)
    return Verdict(index, num, bonus, sibling_counts=torch.cat([tried, accepted], dim=1))


def ranked(spec, drafter) -> bool:
    """Whether a run's trees are ranked by their siblings' worth: tree_rejection over trees of
    topk > 1."""
    return spec.acceptance == "tree_rejection" and spec.topk > 1 and drafter is not None


class NoRanks:
    """A run whose trees are not ranked: no worth to stage, nothing to count."""

    def worth(self, reqs: list[Request]) -> None:
        return None

    def add(self, r: Request, counts: list[int]) -> None:
        pass


class SiblingRanks:
    """Each request's SiblingStats (core/acceptance/tree_rejection.py), which rank its next tree's
    siblings: their worth rows go to the device before a step, the walk's tries and acceptances by
    rank (the host row's counts) come back after it."""

    def __init__(self, reqs: list[Request], topk: int):
        self.topk, self.stats = topk, {r.req_pool_idx: SiblingStats(topk) for r in reqs}

    @classmethod
    def of(cls, reqs: list[Request], spec, drafter) -> "SiblingRanks | NoRanks":
        """A run's ranks where its trees are ranked (`ranked`), else none."""
        return cls(reqs, spec.topk) if ranked(spec, drafter) else NoRanks()

    def worth(self, reqs: list[Request]) -> torch.Tensor:
        """(len(reqs), topk) what each sibling rank was worth, request by request."""
        return torch.stack([self.stats[r.req_pool_idx].worth() for r in reqs])

    def add(self, r: Request, counts: list[int]) -> None:
        """counts: one step's tries by rank, then acceptances by rank."""
        self.stats[r.req_pool_idx].add(counts[:self.topk], counts[self.topk:])

"""Drafters propose tokens for the target to verify. Each lives in its own module."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DraftProposal:
    """One request's draft for one step, as nodes of a tree (a chain is a tree of topk 1).

    Node i has `parents[i]` (-1 = the root, i.e. the last committed token) and `depths[i]` (1 for
    the root's children). `q[i]` is the draft probability of `tokens[i]` given its parent path,
    `scores[i]` the path score SGLang ranks nodes by (the product of q along the path), and
    `draft_topk[i]` the draft's top candidates at that node as [token, prob] pairs.
    """

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    q: list[float]
    scores: list[float]
    draft_topk: list[list[list]]

    def to_record(self) -> dict:
        return {"tokens": self.tokens, "parents": self.parents, "depths": self.depths,
                "q": self.q, "scores": self.scores, "draft_topk": self.draft_topk}

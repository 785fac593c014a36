"""Greedy acceptance of a draft chain (temperature 0).

`target_predict[i]` is the target's argmax after row i of the verify pass, where row 0 is the
root (the last committed token) and row i >= 1 is draft i. Draft i+1 is correct iff it equals
`target_predict[i]`; the walk stops at the first mismatch, and the target's own prediction at the
last correct row is the `bonus_token`. So `accept_len = len(correct_drafts) + 1`, and the output
is exactly what greedy autoregressive decoding would produce.

This is SGLang's `verify_tree_greedy` on a tree that is a single path (topk 1).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AcceptResult:
    correct_drafts: list[int]  # drafts the rule accepted, bonus excluded
    bonus_token: int  # the target's +1 after the last correct draft
    decisions: list[dict] = field(default_factory=list)  # one per draft the walk reached

    @property
    def accept_tokens(self) -> list[int]:  # what enters the sequence: correct drafts + bonus
        return self.correct_drafts + [self.bonus_token]

    @property
    def accept_len(self) -> int:
        return len(self.correct_drafts) + 1


def verify_chain_greedy(draft_tokens: list[int], target_predict: list[int]) -> AcceptResult:
    """draft_tokens (K,), target_predict (K+1,) -> correct prefix of the drafts + bonus."""
    assert len(target_predict) == len(draft_tokens) + 1
    correct, decisions = [], []
    for i, draft in enumerate(draft_tokens):
        ok = draft == target_predict[i]
        decisions.append({"index": i, "draft": draft, "target_argmax": target_predict[i],
                          "accepted": ok, "rule": "draft == argmax(p)" if ok else "draft != argmax(p)"})
        if not ok:
            break
        correct.append(draft)
    return AcceptResult(correct, target_predict[len(correct)], decisions)

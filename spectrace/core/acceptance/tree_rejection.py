"""Lossless sampling on trees with topk > 1 (--acceptance tree_rejection): recursive rejection
sampling over siblings drawn without replacement (Jeon et al. 2024, "Recursive Speculative
Decoding"), the multi-draft form of SpecInfer's rule. SGLang's engine refuses rejection
sampling on trees; this rule lifts that.

The drafter samples the tree (drafters/eagle_worker.py, `SampledDrafts`): the children x_1, x_2,
... of a node are draws without replacement from the draft's q after the node, in draw order.
At the current node, with p the target's distribution after it:

    p' = p, q' = q
    for each child x in draw order:   accept x  iff  coin * q'(x) < p'(x)   (prob. min(1, p'/q'))
                                      else  p' = relu(p' - q') / sum         (the residual)
                                            q'(x) = 0;  q' = q' / sum        (x cannot be drawn
                                                                             again)
    no child accepted -> bonus ~ p';  a leaf or full depth -> bonus ~ p after it

Each try is the chain rule of rejection.py against (p', q'), the distribution the next draw
really came from, so every emitted token is a sample of p. With one child this is chain
rejection sampling; each further sibling is one more chance before the residual. Coins are
SGLang's layout, one float32 coin per node (used when the node is tried) and a final one.

The tree's shape. A sampled tree cannot be ranked by its draws' q as EAGLE-2 ranks top-k trees:
keeping a node for what it drew selects on the draw and biases the output. What a node's j-th
draw is worth is instead measured on the request's earlier steps (`SiblingStats`):
r_j = P(the j-th draw is accepted | the earlier ones were rejected), and the j-th draw is on the
accepted path with probability a_j = r_j * prod_{i<j} (1 - r_i). A node's path score is the
product of a over its path: the expected number of accepted drafts is the sum of those scores,
so the draft loop's top n-1 by path score is the best tree under that estimate (Sequoia's
acceptance vector, measured online rather than offline). docs/acceptance.md tells how this rule
compares
with the others and with EAGLE's own sampling path.
"""
from __future__ import annotations

import torch

from spectrace.core.acceptance import AcceptResult, bonus_from, decision
from spectrace.core.sampling import sample_from_prob
from spectrace.core.tree import children


def tree_rejection_walk(candidates, retrive_next_token, retrive_next_sibling, target_predict,
                        target_probs, draft_probs, randoms, max_depth, params) -> AcceptResult:
    """Reads target_probs (n, V), draft_probs (n-1, V) (row j: the q node j+1 was drawn from, its
    parent's), randoms.coins (n,) (coins[node] when node is tried) and coin_final."""
    path, correct, decisions = [0], [], []
    row, rejected = 0, False
    p = target_probs[0]
    for _ in range(max_depth):
        cur = retrive_next_token[row]
        q = draft_probs[cur - 1] if cur != -1 else None
        while cur != -1:
            tok = candidates[cur]
            # not a draw (the path's q had fewer than topk tokens): nothing more to try
            if q[tok] == 0.0:
                cur = -1
                break
            coin = randoms.coins[cur]
            ok = bool(coin * q[tok] < p[tok])
            decisions.append(decision(cur, tok, ok, "coin * q'(x) < p'(x)" if ok else
                                      "coin * q'(x) >= p'(x): p' = relu(p' - q'), q'(x) = 0",
                                      coin=float(coin), p=float(p[tok]), q=float(q[tok])))
            if ok:
                break
            rejected = True
            residual = torch.relu(p - q)
            if residual.sum() > 0:  # zero only when p' == q', where no draw is rejected
                p = residual / residual.sum()
            q = q.clone()
            q[tok] = 0.0
            if q.sum() == 0:
                cur = -1
                break
            q = q / q.sum()
            cur = retrive_next_sibling[cur]
        if cur == -1:
            break
        path.append(cur)
        correct.append(candidates[cur])
        row, rejected = cur, False
        p = target_probs[row]
    coin_final = float(randoms.coin_final)
    return AcceptResult(correct, sample_from_prob(p, coin_final), path, decisions,
                        bonus_from("residual" if rejected else "target", row, p, params.trace_topk,
                                   coin=coin_final))


class SiblingStats:
    """One request's acceptance by sibling rank, over its earlier steps, with a prior of one
    acceptance in two tries per rank (so the first tree is a balanced guess)."""

    def __init__(self, topk: int):
        self.tried = torch.full((topk,), 2.0, dtype=torch.float64)
        self.accepted = torch.ones(topk, dtype=torch.float64)

    def observe(self, decisions: list[dict], retrive_next_token: list[int],
                retrive_next_sibling: list[int]) -> None:
        # node -> its index among its parent's children
        rank = {c: j for node in range(len(retrive_next_token))
                for j, c in enumerate(children(node, retrive_next_token, retrive_next_sibling))}
        tried, accepted = torch.zeros_like(self.tried), torch.zeros_like(self.accepted)
        for d in decisions:
            tried[rank[d["node"]]] += 1
            accepted[rank[d["node"]]] += d["accepted"]
        self.add(tried, accepted)

    def add(self, tried, accepted) -> None:
        """(K,) tries and acceptances by sibling rank, from one step's walk."""
        self.tried += torch.as_tensor(tried, dtype=self.tried.dtype)
        self.accepted += torch.as_tensor(accepted, dtype=self.accepted.dtype)

    def worth(self) -> torch.Tensor:
        """(K,) a_j = r_j * prod_{i<j} (1 - r_i), made non-increasing (a later draw is only
        tried after the earlier ones)."""
        r = self.accepted / self.tried
        reach = torch.cumprod(torch.cat([torch.ones(1, dtype=r.dtype), 1 - r[:-1]]), 0)
        return torch.cummin(r * reach, 0).values.float()

"""Greedy acceptance (temperature 0) over a draft tree; a chain is a tree of topk 1.

From the root (the last committed token), look at the children of the current node in sibling
order and take the first whose token equals the target's argmax after the current node; stop
when none does. The accepted drafts are `correct_drafts`; the target's argmax after the last
accepted node is the `bonus_token`, so `accept_len = len(correct_drafts) + 1` and the output is
exactly greedy autoregressive decoding's. This is SGLang's `verify_tree_greedy`.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AcceptResult:
    correct_drafts: list[int]  # drafts the rule accepted, bonus excluded
    bonus_token: int  # the target's +1 after the last correct draft
    accept_nodes: list[int] = field(default_factory=list)  # tree nodes of the path, root (0) first
    decisions: list[dict] = field(default_factory=list)  # every node the walk looked at
    bonus_from: dict | None = None  # sampling rules: the distribution the bonus was drawn from

    @property
    def accept_tokens(self) -> list[int]:  # what enters the sequence: correct drafts + bonus
        return self.correct_drafts + [self.bonus_token]

    @property
    def accept_len(self) -> int:
        return len(self.correct_drafts) + 1


def greedy_walk(candidates: list[int], next_token: list[int], next_sibling: list[int],
                target_predict: list[int], max_depth: int) -> AcceptResult:
    """One request. candidates (n,) node tokens, root first; next_token / next_sibling (n,)
    the tree's linked lists; target_predict (n,) the target's argmax after each node."""
    path, correct, decisions = [0], [], []
    cur = 0
    for _ in range(max_depth):
        parent = path[-1]
        cur = next_token[parent]
        while cur != -1:
            ok = candidates[cur] == target_predict[parent]
            decisions.append({"node": cur, "draft": candidates[cur], "target_argmax": target_predict[parent],
                              "accepted": ok, "rule": "draft == argmax(p)" if ok else "draft != argmax(p)"})
            if ok:
                path.append(cur)
                correct.append(candidates[cur])
                break
            cur = next_sibling[cur]
        if cur == -1:
            break
    return AcceptResult(correct, target_predict[path[-1]], path, decisions)


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                       retrive_next_token, retrive_next_sibling, target_predict) -> None:
    """SGLang's batched form, in place. predicts (bs*n,): token after each accepted row (the
    bonus at the last); accept_index (bs, steps+1): flat rows of the path, root first, -1
    padded; accept_token_num (bs,): correct drafts. Rows are flat: request b's node j is row
    retrive_index[b, j] (= b*n + j)."""
    flat_target = target_predict.flatten()
    for b in range(candidates.shape[0]):
        rows = retrive_index[b].tolist()
        res = greedy_walk(candidates[b].tolist(), retrive_next_token[b].tolist(),
                          retrive_next_sibling[b].tolist(), [int(flat_target[r]) for r in rows],
                          accept_index.shape[1] - 1)
        for k, node in enumerate(res.accept_nodes):
            accept_index[b, k] = rows[node]
            predicts[rows[node]] = res.accept_tokens[k]  # the token that follows this row
        accept_token_num[b] = len(res.correct_drafts)

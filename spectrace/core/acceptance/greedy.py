"""Greedy acceptance (temperature 0) over a draft tree; a chain is a tree of topk 1.

From the root (the last committed token), look at the children of the current node in sibling
order and take the first whose token equals the target's argmax after the current node; stop
when none does. The accepted drafts are `correct_drafts`; the target's argmax after the last
accepted node is the `bonus_token`, so the output is exactly greedy autoregressive decoding's.
This is SGLang's `verify_tree_greedy` (sgl-kernel `eagle_utils.cu`, `VerifyTreeGreedy`), one
request of it: `path[-1]` is the kernel's `last_accepted_retrive_idx`.
"""
from __future__ import annotations

from spectrace.core.acceptance import AcceptResult, decision


def greedy_walk(candidates, retrive_next_token, retrive_next_sibling, target_predict, target_probs,
                draft_probs, randoms, max_depth, params) -> AcceptResult:
    """Reads candidates, the linked lists and target_predict (the target's argmax after each
    node)."""
    path, correct, decisions = [0], [], []
    for _ in range(max_depth):
        parent = path[-1]
        cur = retrive_next_token[parent]
        while cur != -1:
            ok = candidates[cur] == target_predict[parent]
            decisions.append(decision(cur, candidates[cur], ok,
                                      "draft == argmax(p)" if ok else "draft != argmax(p)",
                                      target_argmax=target_predict[parent]))
            if ok:
                path.append(cur)
                correct.append(candidates[cur])
                break
            cur = retrive_next_sibling[cur]
        if cur == -1:
            break
    return AcceptResult(correct, target_predict[path[-1]], path, decisions)

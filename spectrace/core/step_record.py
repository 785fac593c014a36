"""What the trace keeps of one request's prefill and of each of its decode steps (format v1:
spectrace/core/trace.py). The engine hands over a request's StepRow after RECORD; viewers read
the result without torch or a model.

    draft    the tree: nodes 1..n-1 with token, parent, depth, q, path score, the draft's top
             tokens at the parent, the node's fate in the walk; the mask rows and linked lists;
             for the EAGLE draft loop, every candidate it scored (kept or dropped)
    verify   the rows: tokens, positions, the target's argmax and top tokens after each node, and
             p of each node's token after its parent
    accept   the rule, the accepted path, every decision and where the bonus was drawn from
    kv       both pools' events of the step, tagged with their phase, and lengths before/after
"""
from __future__ import annotations

from spectrace.core.sampling import topk_pairs
from spectrace.core.tree import DraftTree


def fates(n: int, decisions: list[dict]) -> list[str]:
    """Each draft node's fate in the walk: correct (on the accepted path), rejected (tried
    against the target and refused) or unreached (the walk never got to it)."""
    fate = ["unreached"] * n
    for d in decisions:
        fate[d["node"]] = "correct" if d["accepted"] else "rejected"
    return fate[1:]


def tree_record(tree: DraftTree, b: int, parents: list[int], decisions: list[dict],
                trace_topk: int) -> dict:
    """One request's draft tree: nodes 1..n-1 (node 0 is the root); parents from DraftTree.parents.
    trace_topk 0 (--trace-level steps): each node's draft top-k is left empty."""
    n = tree.size(b)
    depths = []
    for p in parents:
        depths.append(1 if p == 0 else depths[p - 1] + 1)
    rec = {
        "tokens": tree.draft_tokens[b, 1:n].tolist(),
        "parents": parents,  # node index, 0 = the root
        "depths": depths,
        "q": [round(x, 6) for x in tree.q[b, :n - 1].tolist()],
        "scores": [round(x, 6) for x in tree.scores[b, :n - 1].tolist()],
        "draft_topk": tree.draft_topk[b][:n - 1] if trace_topk else [[] for _ in range(n - 1)],
        "tree_mask": ["".join("1" if x else "0" for x in row[:n])
                      for row in tree.tree_mask[b, :n].tolist()],
        "retrive_next_token": tree.retrive_next_token[b, :n].tolist(),
        "retrive_next_sibling": tree.retrive_next_sibling[b, :n].tolist(),
        "fates": fates(n, decisions),
    }
    if tree.sibling_worth is not None:  # a sampled tree's scores are products of these, not of q
        rec["sibling_worth"] = [round(x, 6) for x in tree.sibling_worth[b].tolist()]
    if tree.candidates is not None:  # the draft loop's every candidate, kept or dropped
        rec["candidates"] = tree.candidates[b]
    if tree.proposers is not None and tree.proposers[b] is not None:  # n-gram: the match it copied
        rec["proposer"] = tree.proposers[b]
    return rec


def verify_record(row, parents: list[int], trace_topk: int) -> dict:
    """The verify pass's rows of one request: from row.target_probs, or from what the fast engine
    kept of it (row.target_topk, row.p_tokens: fast/step_record.py)."""
    p = row.target_probs
    if p is None:
        topk, p_of = row.target_topk, lambda parent, node: row.p_tokens[parent][node]
    else:
        topk, p_of = topk_pairs(p, trace_topk), lambda parent, node: p[parent, row.candidates[node]]
    return {
        "tokens": row.candidates,
        "positions": row.positions,
        "target_predict": row.target_predict,
        "target_topk": topk,
        # target probability of node j's token after its parent
        "p_draft": [round(float(p_of(par, j + 1)), 6) for j, par in enumerate(parents)],
    }


def step_record(step: int, row, tree: DraftTree | None, rule: str, kv: dict, timing: dict,
                trace_topk: int, adaptive: dict | None = None) -> dict:
    """The step record of one request. Key order matters: TraceFile indexes a step line by its
    first keys and by accept_len, committed_tokens and timing without parsing it."""
    res = row.result
    drafted = tree is not None and row.drafted
    parents = tree.parents(row.b) if drafted else []
    rec = {
        "kind": "step", "step": step, "request": row.req.req_pool_idx,
        "correct_drafts": res.correct_drafts, "bonus_token": res.bonus_token,
        "accept_tokens": res.accept_tokens, "accept_len": res.accept_len,
        "committed_tokens": row.committed, "finish_reason": row.req.finish_reason,
        "draft": tree_record(tree, row.b, parents, res.decisions, trace_topk) if drafted else None,
        "verify": verify_record(row, parents, trace_topk),
        "accept": {"rule": rule if drafted else "none", "accept_nodes": res.accept_nodes,
                   "decisions": res.decisions, "bonus_from": res.bonus_from},
        "kv": kv,
        "timing": timing,
    }
    if adaptive is not None:
        rec["adaptive"] = adaptive
    return rec


def prefill_record(row, first_token: int, kv: dict, timing: dict) -> dict:
    return {"kind": "prefill", "request": row.req.req_pool_idx,
            "prompt_len": len(row.req.prompt_ids), "first_token": first_token,
            "finish_reason": row.req.finish_reason, "kv": kv, "timing": timing}


def record_token_ids(rec: dict) -> set[int]:
    """Every token a step record mentions: the trace carries their text."""
    ids = set(rec["verify"]["tokens"]) | set(rec["accept_tokens"])
    ids |= {t for pairs in rec["verify"]["target_topk"] for t, _ in pairs}
    if rec["draft"] is not None:
        ids |= {t for pairs in rec["draft"]["draft_topk"] for t, _ in pairs}
        ids |= set(rec["draft"].get("candidates", {}).get("tokens", []))
    if rec["accept"]["bonus_from"] is not None:
        ids |= {t for t, _ in rec["accept"]["bonus_from"]["topk"]}
    return ids

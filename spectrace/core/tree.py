"""Draft trees as SGLang builds and walks them (EAGLE-2 style: fixed topk, steps and tree size).

Notation: `bs` requests, `K = topk`, `S = num_steps` (spec_steps), `n = num_draft_tokens`
(tree size including the root, the last committed token).

    select_top_k_tokens        one level of the draft loop: keep the K best paths by path score
    organize_draft_results     the n-1 best of all K + (S-1)K^2 candidates, in candidate order
    build_tree_kernel_efficient  tree mask, positions and the retrive_* linked lists
    reconstruct_indices_from_tree_mask  the same indices, recovered from a mask alone
(The greedy walk over the tree, `verify_tree_greedy`, is an acceptance rule: acceptance/greedy.py.)

Written as plain loops over requests and nodes, one per CUDA thread of SGLang's kernels, so
each line can be read against the kernel. `spectrace.compat.sglang` exposes them under
SGLang's names and argument order.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from spectrace.core.sampling import sample_without_replacement


class TreeMaskMode(enum.IntEnum):
    FULL_MASK = 0  # per request n x (prefix + n) rows, flattened and concatenated
    QLEN_ONLY = 1  # per request n x n (the tree part only)
    QLEN_ONLY_BITPACKING = 2  # one integer per row, bit j = node j


# ---- the draft loop --------------------------------------------------------------------------

def select_top_k_tokens(i: int, topk_p, topk_index, hidden_states, scores, topk: int):
    """Level i of the draft loop (SGLang's `select_top_k_tokens`).

    i == 0: topk_p, topk_index (bs, K) are the draft's top-K after the root.
    i >= 1: topk_p, topk_index (bs*K, K): top-K children of each of the K kept paths; a child's
    path score is its parent's score times its own probability, and the K best over all K*K
    children are kept. Returns the next input ids (bs*K,), their hidden rows, the kept scores
    (bs, K) and tree_info = (scores of all candidates of this level, their tokens, the flat
    candidate index of each kept path's parent)."""
    bs = scores.shape[0] if scores is not None else topk_p.shape[0]
    if i == 0:
        input_ids = topk_index.flatten()
        hidden_states = hidden_states.repeat_interleave(topk, dim=0) if hidden_states is not None else None
        scores = topk_p  # (bs, K)
        parents = torch.arange(-1, topk, device=topk_p.device).unsqueeze(0).expand(bs, topk + 1)
        tree_info = (topk_p.unsqueeze(1), topk_index, parents)  # (bs,1,K), (bs,K), (bs,K+1)
    else:
        expand_scores = scores.unsqueeze(2) * topk_p.view(-1, topk, topk)  # (bs, K, K) path scores
        topk_cs_p, topk_cs_index = torch.topk(expand_scores.flatten(1), topk, dim=-1)  # (bs, K)
        scores = topk_cs_p
        topk_index = topk_index.view(-1, topk * topk)  # (bs, K*K)
        input_ids = torch.gather(topk_index, 1, topk_cs_index).flatten()
        if hidden_states is not None:
            offset = torch.arange(0, bs * topk, topk, device=topk_p.device).unsqueeze(1)
            hidden_states = hidden_states[(topk_cs_index // topk + offset).flatten()]
        # candidate blocks: step 0 has K entries, step i >= 1 starts at K + (i-1)K^2
        tree_info = (expand_scores, topk_index, topk_cs_index + (topk * topk * (i - 1) + topk))
    return input_ids, hidden_states, scores, tree_info


def organize_draft_results(score_list, token_list, parents_list, num_draft_token: int):
    """Keep the n-1 candidates with the highest path scores, re-sorted by candidate index so the
    node order is "by level, then by beam, then by child" and parents come before children."""
    score_list = torch.cat(score_list, dim=1).flatten(1)  # (bs, K + (S-1)K^2)
    ss_token_list = torch.cat(token_list, dim=1)  # (bs, K + (S-1)K^2)
    # SGLang's torch.topk; a stable sort breaks ties toward the lower candidate index (a parent,
    # an earlier sibling), which topk leaves unspecified and sampled trees rely on
    best = torch.sort(score_list, dim=-1, descending=True, stable=True).indices[:, :num_draft_token - 1]
    top_scores_index = torch.sort(best).values  # (bs, n-1)
    draft_tokens = torch.gather(ss_token_list, 1, top_scores_index)  # (bs, n-1)
    if len(parents_list) > 1:
        parent_list = torch.cat(parents_list[:-1], dim=1)  # (bs, K(S-1)+1)
    else:
        parent_list = torch.empty(score_list.shape[0], 0, dtype=torch.int64, device=score_list.device)
    return parent_list, top_scores_index, draft_tokens


# ---- building the tree -------------------------------------------------------------------------

def _parent_node(sel, parents, pos: int, topk: int, n: int) -> int:
    """Tree node index of the parent of node pos+1 (0 = the root; n = not among the nodes)."""
    ptb = int(sel[pos]) // topk  # which row of the candidate list the node was expanded from
    if ptb == 0:
        return 0
    token_idx = int(parents[ptb])  # flat candidate index of the parent
    # SGLang's kernel scans j < n, one past the row's n-1 entries; we stop at the row's end
    for j in range(n - 1):
        if int(sel[j]) == token_idx:
            return j + 1
    return n


def build_tree(parent_list, top_scores_index, seq_lens, topk: int, num_verify_tokens: int,
               tree_mask_mode: TreeMaskMode = TreeMaskMode.FULL_MASK):
    """SGLang's `build_tree_kernel_efficient` kernel for every request.

    seq_lens (bs,): committed prefix length, root excluded. Returns the flat tree mask (layout
    by mode), positions (bs*n,) and retrive_index / retrive_next_token / retrive_next_sibling
    (bs, n), with -1 for "none"."""
    bs, n = len(seq_lens), num_verify_tokens
    device = top_scores_index.device
    seq_lens = [int(s) for s in seq_lens]
    if tree_mask_mode == TreeMaskMode.FULL_MASK:  # prefix columns stay True (the wrapper's fill)
        tree_mask = torch.ones(sum(seq_lens) * n + n * n * bs, dtype=torch.bool, device=device)
    elif tree_mask_mode == TreeMaskMode.QLEN_ONLY:
        tree_mask = torch.ones(n * n * bs, dtype=torch.bool, device=device)
    else:  # SGLang packs rows into uint8/16/32: at most 32 nodes
        if n > 32:
            raise ValueError(f"QLEN_ONLY_BITPACKING holds at most 32 tree nodes, not {n}")
        dtype = [torch.uint8, torch.int16, torch.int32][(n > 8) + (n > 16)]
        tree_mask = torch.zeros(n * bs, dtype=dtype, device=device)
    positions = torch.empty(bs * n, dtype=torch.int64, device=device)
    retrive_index, retrive_next_token, retrive_next_sibling = torch.full(
        (3, bs, n), -1, dtype=torch.int64, device=device)

    def set_mask(b, row, node, value: bool):
        if tree_mask_mode == TreeMaskMode.FULL_MASK:
            width = seq_lens[b] + n
            start = sum(seq_lens[:b]) * n + b * n * n
            tree_mask[start + row * width + seq_lens[b] + node] = value
        elif tree_mask_mode == TreeMaskMode.QLEN_ONLY:
            tree_mask[b * n * n + row * n + node] = value
        elif value:
            tree_mask[b * n + row] |= 1 << node

    for b in range(bs):
        sel, par = top_scores_index[b], parent_list[b]
        for row in range(n):  # each row sees the root and, below, its own ancestors and itself
            set_mask(b, row, 0, True)
            for node in range(1, n):
                set_mask(b, row, node, False)
        # linked lists (kernel thread 0): children pushed to the front, scanning nodes downward,
        # so next_token is the lowest-index child and siblings run in increasing index
        positions[b * n] = seq_lens[b]
        for i in range(n - 1, 0, -1):
            retrive_index[b, i] = b * n + i
            p = _parent_node(sel, par, i - 1, topk, n)
            if p == n:  # SGLang prints "invalid eagle tree" and drops the node
                continue
            if retrive_next_token[b, p] != -1:
                retrive_next_sibling[b, i] = retrive_next_token[b, p]
            retrive_next_token[b, p] = i
        retrive_index[b, 0] = b * n
        # ancestors and depth (kernel threads 1..n-1)
        for tid in range(1, n):
            cur, depth = tid - 1, 0
            while True:
                depth += 1
                set_mask(b, tid, cur + 1, True)
                ptb = int(sel[cur]) // topk
                if ptb == 0:
                    break
                nxt = _parent_node(sel, par, cur, topk, n)
                if nxt == n:
                    break
                cur = nxt - 1
            positions[b * n + tid] = seq_lens[b] + depth
    return tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling


def tree_mask_rows(tree_mask, seq_lens, n: int, mode: TreeMaskMode) -> list[torch.Tensor]:
    """Each request's (n, n) bool tree part of a mask in any layout."""
    out = []
    for b, L in enumerate(int(s) for s in seq_lens):
        if mode == TreeMaskMode.FULL_MASK:
            start = sum(int(s) for s in seq_lens[:b]) * n + b * n * n
            out.append(tree_mask[start:start + n * (L + n)].view(n, L + n)[:, L:])
        elif mode == TreeMaskMode.QLEN_ONLY:
            out.append(tree_mask[b * n * n:(b + 1) * n * n].view(n, n))
        else:
            rows = tree_mask[b * n:(b + 1) * n].to(torch.int64)
            bits = 1 << torch.arange(n, device=rows.device)
            out.append((rows.unsqueeze(1) & bits) != 0)
    return out


def reconstruct_indices_from_tree_mask(tree_mask, seq_lens, n: int):
    """Recover positions and the retrive_* lists from a QLEN_ONLY mask (bs*n*n,), as SGLang's
    NGRAM path does. Returns (positions, retrive_index, retrive_next_token, retrive_next_sibling)."""
    bs = len(seq_lens)
    device = tree_mask.device
    m = tree_mask.view(bs, n, n)
    positions = torch.empty(bs * n, dtype=torch.int64, device=device)
    retrive_index, retrive_next_token, retrive_next_sibling = torch.full(
        (3, bs, n), -1, dtype=torch.int64, device=device)
    for b in range(bs):
        for tid in range(n):
            above = [i for i in range(tid) if m[b, tid, i]]
            parent = above[-1] if above else -1
            retrive_index[b, tid] = b * n + tid
            positions[b * n + tid] = int(seq_lens[b]) + len(above)
            children = [i for i in range(tid + 1, n) if m[b, i, tid]]
            if children:
                retrive_next_token[b, tid] = children[0]
            if parent != -1:
                for i in range(tid + 1, n):
                    if m[b, i, parent] and not any(m[b, i, j] for j in range(parent + 1, i)):
                        retrive_next_sibling[b, tid] = i
                        break
    return positions, retrive_index, retrive_next_token, retrive_next_sibling


# ---- one step's draft tree, end to end -----------------------------------------------------------

@dataclass
class DraftTree:
    """A batch's draft trees, ready to verify. Node 0 of each request is the root."""

    draft_tokens: torch.Tensor  # (bs, n) root first
    tree_mask: torch.Tensor  # (bs, n, n) bool: row j = root, ancestors and j itself
    positions: torch.Tensor  # (bs, n) prefix length + depth
    retrive_index: torch.Tensor  # (bs, n)
    retrive_next_token: torch.Tensor  # (bs, n)
    retrive_next_sibling: torch.Tensor  # (bs, n)
    q: torch.Tensor  # (bs, n-1) draft probability of each node given its parent
    scores: torch.Tensor  # (bs, n-1) path score (product of q from the root)
    draft_topk: list[list[list]]  # per request and node: the draft's top [token, q] at its parent
    draft_probs: torch.Tensor | None = None  # sampled drafts: (bs, n-1, V), row j = the q node j+1 was drawn from
    sibling_worth: torch.Tensor | None = None  # sampled trees: (bs, K), what ranked the j-th draws
    sizes: list[int] | None = None  # nodes per request, root included, when they differ (n-gram chains)
    proposers: list[dict | None] | None = None  # per request: where a model-free proposal came from

    def size(self, b: int) -> int:
        return self.sizes[b] if self.sizes is not None else self.draft_tokens.shape[1]

    def parents(self, b: int) -> list[int]:
        """Parent node of each node 1..size-1 (0 = root), read off the mask."""
        m = self.tree_mask[b]
        return [max(i for i in range(j) if m[j, i]) for j in range(1, self.size(b))]


def chain_tree(proposals: list[list[int]], root_tokens: list[int], seq_lens,
               proposers: list[dict | None] | None = None, device="cpu") -> DraftTree:
    """Chains of model-free drafts (n-gram), one per request, each as long as its proposal (q = 1
    for a copied token). Padded to the longest; `sizes` says where each request's chain ends."""
    bs, n = len(proposals), 1 + max((len(p) for p in proposals), default=0)
    tokens = torch.zeros(bs, n, dtype=torch.int64)
    nt, ns = torch.full((2, bs, n), -1, dtype=torch.int64)
    for b, (root, p) in enumerate(zip(root_tokens, proposals)):
        tokens[b, :len(p) + 1] = torch.tensor([root] + list(p))
        nt[b, :len(p)] = torch.arange(1, len(p) + 1)
    ones = torch.ones(bs, n - 1)
    return DraftTree(
        draft_tokens=tokens.to(device), tree_mask=torch.ones(n, n, dtype=torch.bool).tril().expand(bs, n, n).to(device),
        positions=(torch.tensor([int(s) for s in seq_lens]).view(bs, 1) + torch.arange(n)).to(device),
        retrive_index=(torch.arange(bs * n).view(bs, n)).to(device), retrive_next_token=nt.to(device),
        retrive_next_sibling=ns.to(device), q=ones, scores=ones,
        draft_topk=[[[[t, 1.0]] for t in p] for p in proposals], sizes=[len(p) + 1 for p in proposals],
        proposers=proposers)


@dataclass
class SampledDrafts:
    """Drafts sampled from q, for the lossless sampling rules, instead of the draft's top K."""

    generators: list  # one torch.Generator per request
    sibling_worth: torch.Tensor | None = None  # (bs, K): how much a node's j-th draw is worth; needed when K > 1


def draft_tree(first_probs, forward_beams, root_tokens, seq_lens, topk: int, num_steps: int,
               num_draft_tokens: int, trace_topk: int = 5, sampled: SampledDrafts | None = None) -> DraftTree:
    """SGLang's EAGLE draft loop, then `organize_draft_results` and `build_tree`.

    first_probs (bs, V): the draft's distribution after the root. forward_beams(i, input_ids,
    parent_beam) runs the drafter on the K kept paths of level i (input_ids (bs*K,); parent_beam
    (bs, K) says which path of level i-1 each extends, None at level 0) and returns the next
    distributions (bs*K, V). The last level runs no forward. seq_lens: the target's committed
    KV length per request (root excluded).

    sampled: the K children of a path are K draws without replacement from its q, in draw order
    (a chain draws one, as SGLang's `sample_draft_proposal` does for rejection sampling), and
    the tree keeps the q each node was drawn from. Which nodes the tree keeps must not depend
    on what they drew: a node kept or dropped for its token's q would bias the tree rule (the
    chi-square test of tests/test_acceptance.py catches it). So a child's path score uses, in
    place of its own q, `sibling_worth[j]`: what the j-th draw of a node is worth, measured
    before this step (acceptance/tree_rejection.py). The shape is then fixed before the draws,
    as in SpecInfer's and Sequoia's static trees; ties go to the earlier candidate."""
    bs, K = first_probs.shape[0], topk
    wide = min(max(K, trace_topk), first_probs.shape[-1])
    level_probs = []

    def top(probs):  # (q, tokens, rank) of each path's K children; the trace keeps the top `wide`
        p, i = torch.topk(probs, wide, dim=-1)
        pairs = [[[int(a), round(float(b), 6)] for a, b in zip(ii, pp)] for ii, pp in zip(i, p)]
        if sampled is None:
            q = p[:, :K].contiguous()
            return q, i[:, :K].contiguous(), q, pairs
        level_probs.append(probs)
        per = probs.shape[0] // bs  # paths per request
        gens = sampled.generators
        draws = [sample_without_replacement(probs[row], K, gens[row // per]) for row in range(probs.shape[0])]
        # a path whose q has fewer than K tokens with mass pads with q = 0 (never tried)
        ids = torch.tensor([d + d[:1] * (K - len(d)) for d in draws], device=probs.device)
        real = torch.tensor([[j < len(d) for j in range(K)] for d in draws], device=probs.device)
        q = torch.where(real, torch.gather(probs, 1, ids), 0.0)
        worth = torch.ones(bs, 1) if K == 1 else sampled.sibling_worth
        return q, ids, worth.to(probs.device).repeat_interleave(per, dim=0), pairs

    topk_q, topk_index, topk_rank, beam_pairs = top(first_probs)
    score_list, token_list, parents_list, q_list, cand_pairs = [], [], [], [], [[] for _ in range(bs)]
    scores = None
    for i in range(num_steps):
        input_ids, _, scores, info = select_top_k_tokens(i, topk_rank, topk_index, None, scores, K)
        score_list.append(info[0])
        token_list.append(info[1])
        parents_list.append(info[2])
        q_list.append(topk_q.reshape(bs, -1))  # each candidate's probability given its parent
        for b in range(bs):  # candidate c of this level was drawn from beam c // K (root at level 0)
            beams = [beam_pairs[b]] if i == 0 else beam_pairs[b * K:(b + 1) * K]
            cand_pairs[b] += [beams[c // K] if i else beams[0] for c in range(K if i == 0 else K * K)]
        if i == num_steps - 1:
            break
        parent_beam = None if i == 0 else (info[2] - (K * K * (i - 1) + K)) // K
        topk_q, topk_index, topk_rank, beam_pairs = top(forward_beams(i, input_ids, parent_beam))

    parent_list, top_scores_index, draft_tokens = organize_draft_results(
        score_list, token_list, parents_list, num_draft_tokens)
    all_scores = torch.cat([s.flatten(1) for s in score_list], dim=1)
    n = num_draft_tokens
    mask, positions, ri, rnt, rns = build_tree(parent_list, top_scores_index, seq_lens, K, n,
                                               TreeMaskMode.QLEN_ONLY)
    draft_probs = None
    if sampled is not None:  # the q each kept node was drawn from: its parent path's distribution
        paths = torch.cat([level_probs[0].view(bs, 1, -1)] + [lp.view(bs, K, -1) for lp in level_probs[1:]], dim=1)
        path_of = torch.tensor([0] * K + [1 + (i - 1) * K + c // K for i in range(1, num_steps) for c in range(K * K)],
                               device=paths.device)  # candidate -> row of `paths`
        draft_probs = torch.stack([paths[b, path_of[top_scores_index[b]]] for b in range(bs)])
    return DraftTree(
        draft_tokens=torch.cat([root_tokens.view(bs, 1), draft_tokens], dim=1),
        tree_mask=mask.view(bs, n, n), positions=positions.view(bs, n), retrive_index=ri,
        retrive_next_token=rnt, retrive_next_sibling=rns,
        q=torch.gather(torch.cat(q_list, dim=1), 1, top_scores_index),
        scores=torch.gather(all_scores, 1, top_scores_index),
        draft_topk=[[cand_pairs[b][int(c)] for c in top_scores_index[b]] for b in range(bs)],
        draft_probs=draft_probs, sibling_worth=sampled.sibling_worth if sampled is not None else None)


def beam_features(h_prev: torch.Tensor, i: int, parent_beam, topk: int) -> torch.Tensor:
    """The hidden states level i's K paths continue (bs*K, H): at level 0 every path continues the
    root's (h_prev (bs, H)); later, path k continues the path of level i-1 it was expanded from
    (h_prev (bs*K, H), parent_beam (bs, K))."""
    if i == 0:
        return h_prev.repeat_interleave(topk, dim=0)
    offset = torch.arange(0, parent_beam.shape[0] * topk, topk, device=h_prev.device).unsqueeze(1)
    return h_prev[(parent_beam + offset).flatten()]


def children(node: int, next_token: list[int], next_sibling: list[int]) -> list[int]:
    """A node's children in sibling order, read off the retrive_* linked lists."""
    out, cur = [], next_token[node]
    while cur != -1:
        out.append(cur)
        cur = next_sibling[cur]
    return out


def tree_capacity(topk: int, num_steps: int) -> int:
    """Candidates the draft loop scores: the most draft nodes a tree can hold (n - 1)."""
    return topk + (num_steps - 1) * topk * topk

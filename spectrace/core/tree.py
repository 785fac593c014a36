"""Draft trees as SGLang builds and walks them (EAGLE-2 style: fixed topk, steps and tree size).

Notation: `bs` requests, `K = topk`, `S = num_steps` (spec_steps), `n = num_draft_tokens`
(tree size including the root, the last committed token).

    select_top_k_tokens        one level of the draft loop: keep the K best paths by path score
    organize_draft_results     the n-1 best of all K + (S-1)K^2 candidates, in candidate order
    build_tree_kernel_efficient  tree mask, positions and the retrive_* linked lists
    reconstruct_indices_from_tree_mask  the same indices, recovered from a mask alone
    DraftTree                  one step's trees, as drafters hand them to the engine
(The draft loop itself, SGLang's `draft_forward`, is drafters/eagle_worker.py; the walks over the
tree are acceptance rules, acceptance/.)

Written as plain loops over requests and nodes, one per CUDA thread of SGLang's kernels, so
each line can be read against the kernel. `spectrace.compat.sglang` exposes them under
SGLang's names and argument order.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


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
        hidden_states = (hidden_states.repeat_interleave(topk, dim=0) if hidden_states is not None
                         else None)
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
    best = torch.sort(score_list, dim=-1, descending=True, stable=True).indices
    best = best[:, :num_draft_token - 1]
    top_scores_index = torch.sort(best).values  # (bs, n-1)
    draft_tokens = torch.gather(ss_token_list, 1, top_scores_index)  # (bs, n-1)
    if len(parents_list) > 1:
        parent_list = torch.cat(parents_list[:-1], dim=1)  # (bs, K(S-1)+1)
    else:
        parent_list = torch.empty(score_list.shape[0], 0, dtype=torch.int64,
                                  device=score_list.device)
    return parent_list, top_scores_index, draft_tokens


# ---- building the tree -------------------------------------------------------------------------

def _parent_position(selected_index: list[int], parents: list[int], i: int, topk: int,
                     n: int) -> int:
    """Tree node of the parent of node i+1, as the kernel finds it (0: the root; n: not among the
    nodes). selected_index (n-1,) and parents (K(S-1)+1,) are one request's rows."""
    parent_tb_idx = selected_index[i] // topk  # the row of parent_list the node was expanded from
    if parent_tb_idx == 0:
        return 0
    token_idx = parents[parent_tb_idx]  # flat candidate index of the parent
    # the kernel scans parent_position < n, one past the row's n-1 entries; we stop at the row's end
    for parent_position in range(n - 1):
        if selected_index[parent_position] == token_idx:
            return parent_position + 1
    return n


def build_tree(parent_list, top_scores_index, seq_lens, topk: int, num_verify_tokens: int,
               tree_mask_mode: TreeMaskMode = TreeMaskMode.FULL_MASK):
    """SGLang's `build_tree_kernel_efficient` kernel (sgl-kernel `eagle_utils.cu`) for every
    request.

    seq_lens (bs,): committed prefix length, root excluded (the kernel's verified_seq_len).
    Returns the flat tree mask (layout by mode), positions (bs*n,) and retrive_index /
    retrive_next_token / retrive_next_sibling (bs, n), with -1 for "none". Each request's
    (n, n) tree part is computed on lists, then laid out as the mode says (`lay_out_mask`)."""
    bs, n = len(seq_lens), num_verify_tokens
    seq_lens = [int(s) for s in seq_lens]
    tree_rows, positions = [], []
    retrive_index, retrive_next_token, retrive_next_sibling = ([[-1] * n for _ in range(bs)]
                                                               for _ in range(3))
    for b in range(bs):  # one CUDA block per request
        selected_index, parents = top_scores_index[b].tolist(), parent_list[b].tolist()
        # each row sees the root and, below, its own ancestors and itself
        mask = [[True] + [False] * (n - 1) for _ in range(n)]
        pos = [seq_lens[b]] * n
        # linked lists (thread 0): children pushed to the front, scanning nodes downward,
        # so next_token is the lowest-index child and siblings run in increasing index
        next_token, next_sibling = retrive_next_token[b], retrive_next_sibling[b]
        for i in range(n - 1, 0, -1):
            retrive_index[b][i] = b * n + i
            parent_position = _parent_position(selected_index, parents, i - 1, topk, n)
            if parent_position == n:  # SGLang prints "invalid eagle tree" and drops the node
                continue
            if next_token[parent_position] != -1:
                next_sibling[i] = next_token[parent_position]
            next_token[parent_position] = i
        retrive_index[b][0] = b * n
        # ancestors and depth (threads 1..n-1)
        for tid in range(1, n):
            cur_position, depth = tid - 1, 0
            while True:
                depth += 1
                mask[tid][cur_position + 1] = True
                parent_position = _parent_position(selected_index, parents, cur_position, topk, n)
                if parent_position in (0, n):  # reached the root (or a dropped node)
                    break
                cur_position = parent_position - 1
            pos[tid] = seq_lens[b] + depth
        tree_rows.append(mask)
        positions += pos
    device = top_scores_index.device
    as_tensor = lambda x: torch.tensor(x, dtype=torch.int64, device=device)  # noqa: E731
    return (lay_out_mask(torch.tensor(tree_rows, dtype=torch.bool, device=device).view(bs, n, n),
                         seq_lens, tree_mask_mode),
            as_tensor(positions), as_tensor(retrive_index), as_tensor(retrive_next_token),
            as_tensor(retrive_next_sibling))


# backend -> build_tree, as the drafters look it up by their KV cache's backend; kernels/backend.py
# adds "triton"
BUILD_TREE = {"explicit": build_tree}


def lay_out_mask(tree_rows: torch.Tensor, seq_lens: list[int], mode: TreeMaskMode) -> torch.Tensor:
    """Each request's (n, n) tree part (bs, n, n) in SGLang's flat layouts:
    FULL_MASK    per request n rows of (prefix + n) columns, the prefix all True (the wrapper's
                 fill), blocks concatenated
    QLEN_ONLY    per request the n x n tree part
    BITPACKING   one integer per row, bit j = node j; uint8 / int16 / int32 for n <= 8 / 16 / 32"""
    bs, n = tree_rows.shape[:2]
    if mode == TreeMaskMode.FULL_MASK:
        if not bs:
            return tree_rows.flatten()
        prefix = [torch.ones(n, L, dtype=torch.bool, device=tree_rows.device) for L in seq_lens]
        return torch.cat([torch.cat([p, rows], 1).flatten() for p, rows in zip(prefix, tree_rows)])
    if mode == TreeMaskMode.QLEN_ONLY:
        return tree_rows.flatten()
    if n > 32:
        raise ValueError(f"QLEN_ONLY_BITPACKING holds at most 32 tree nodes, not {n}")
    bits = (tree_rows.to(torch.int64) << torch.arange(n, device=tree_rows.device)).sum(-1)
    return bits.flatten().to([torch.uint8, torch.int16, torch.int32][(n > 8) + (n > 16)])


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
    NGRAM path does. Returns (positions, retrive_index, retrive_next_token,
    retrive_next_sibling)."""
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


# ---- one step's draft trees ---------------------------------------------------------------------

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
    # sampled drafts: (bs, n-1, V), row j = the q node j+1 was drawn from
    draft_probs: torch.Tensor | None = None
    # (bs, n-1, V) q at node j+1's parent, sampled or not (--record-probs)
    q_dists: torch.Tensor | None = None
    sibling_worth: torch.Tensor | None = None  # sampled trees: (bs, K), what ranked the j-th draws
    # per request: every candidate the draft loop scored (eagle_worker.py)
    candidates: list[dict] | None = None
    # nodes per request, root included, when they differ (n-gram chains)
    sizes: list[int] | None = None
    proposers: list[dict | None] | None = None  # per request: where a model-free proposal came from

    def size(self, b: int) -> int:
        return self.sizes[b] if self.sizes is not None else self.draft_tokens.shape[1]

    def parents(self, b: int) -> list[int]:
        """Parent node of each node 1..size-1 (0 = root), read off the mask: the deepest
        ancestor."""
        n = self.size(b)
        mask = self.tree_mask[b, :n, :n].tolist()
        return [max(i for i in range(j) if mask[j][i]) for j in range(1, n)]


def chain_tree(proposals: list[list[int]], root_tokens: list[int], seq_lens,
               q: torch.Tensor | None = None, draft_topk: list | None = None,
               proposers: list[dict | None] | None = None, device="cpu") -> DraftTree:
    """Chains, one per request, each as long as its proposal, padded to the longest (`sizes` says
    where each ends). q (bs, n-1): each draft's probability given its parent, 1 by default (a
    copied n-gram); draft_topk: the trace's draft top-k at each node's parent (default [[token,
    q]])."""
    bs, n = len(proposals), 1 + max((len(p) for p in proposals), default=0)
    tokens = torch.zeros(bs, n, dtype=torch.int64)
    retrive_next_token, retrive_next_sibling = torch.full((2, bs, n), -1, dtype=torch.int64)
    for b, (root, p) in enumerate(zip(root_tokens, proposals)):
        tokens[b, :len(p) + 1] = torch.tensor([root] + list(p))
        retrive_next_token[b, :len(p)] = torch.arange(1, len(p) + 1)
    q = torch.ones(bs, n - 1) if q is None else q.float().cpu()
    return DraftTree(
        draft_tokens=tokens.to(device),
        tree_mask=torch.ones(n, n, dtype=torch.bool).tril().expand(bs, n, n).to(device),
        positions=(torch.tensor([int(s) for s in seq_lens]).view(bs, 1)
                   + torch.arange(n)).to(device),
        retrive_index=torch.arange(bs * n).view(bs, n).to(device),
        retrive_next_token=retrive_next_token.to(device),
        retrive_next_sibling=retrive_next_sibling.to(device), q=q, scores=torch.cumprod(q, dim=1),
        draft_topk=draft_topk if draft_topk is not None
        else [[[[t, 1.0]] for t in p] for p in proposals], sizes=[len(p) + 1 for p in proposals],
        proposers=proposers)


def children(node: int, retrive_next_token: list[int],
             retrive_next_sibling: list[int]) -> list[int]:
    """A node's children in sibling order, read off the linked lists."""
    out, cur = [], retrive_next_token[node]
    while cur != -1:
        out.append(cur)
        cur = retrive_next_sibling[cur]
    return out


def tree_capacity(topk: int, num_steps: int) -> int:
    """Candidates the draft loop scores: the most draft nodes a tree can hold (n - 1)."""
    return topk + (num_steps - 1) * topk * topk

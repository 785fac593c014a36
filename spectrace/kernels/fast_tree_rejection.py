"""tree_rejection on the fast engine (kernels/engine.py): core/acceptance/tree_rejection.py's walk
for every request at once, in torch, graph-safe.

The explicit walk moves down one node per level and, at each node, tries its children in draw
order against (p', q'), updating both after each rejection. Here the same loops run over the
batch: `max_depth` levels, `topk` tries per level (a node has at most topk children), each try
a few (bs, V) operations masked to the requests still trying, so every request takes the path,
the residual and the bonus the explicit walk takes. It also counts each sibling rank's tries and
acceptances: the host's SiblingStats need them to rank the next step's trees, and without a
trace nothing else tells the host what the walk decided.
"""
from __future__ import annotations

import torch


def tree_rejection_accept(p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor, next_token: torch.Tensor,
                          next_sibling: torch.Tensor, coins: torch.Tensor, coin_final: torch.Tensor, sample,
                          max_depth: int, topk: int):
    """p (bs, n, V) the target after each node; q (bs, n-1, V) the distribution node j + 1 was
    drawn from (its parent's); candidates, next_token, next_sibling (bs, n) node-local indices;
    coins (bs, n) float32, coin_final (bs,); sample(probs (bs, V), coins) -> (bs,) tokens.
    Returns accept_index (bs, max_depth + 1) as flat rows b * n + node, -1 after the path; accept_num (bs,);
    bonus (bs,); tried and accepted (bs, topk): tries and acceptances by sibling rank."""
    bs, device = p.shape[0], p.device
    b = torch.arange(bs, device=device)
    row = torch.zeros(bs, dtype=torch.int64, device=device)
    walking = torch.ones(bs, dtype=torch.bool, device=device)
    cur_p = p[:, 0]
    accept_index = torch.full((bs, max_depth + 1), -1, dtype=torch.int64, device=device)
    accept_index[:, 0] = 0
    tried = torch.zeros(bs, topk, dtype=torch.int64, device=device)
    accepted = torch.zeros_like(tried)
    for depth in range(max_depth):
        cur = next_token[b, row]  # the first child, -1 at a leaf
        trying = walking & (cur >= 0)
        cur_q = q[b, (cur - 1).clamp(min=0)]  # the children's q' (siblings share their parent's)
        found = torch.zeros_like(trying)
        for rank in range(topk):
            c = cur.clamp(min=0)
            tok = candidates[b, c]
            q_tok = cur_q[b, tok]
            trying &= q_tok != 0  # not a draw (q had fewer than topk tokens): nothing more to try
            ok = trying & (coins[b, c] * q_tok < cur_p[b, tok])
            rejected = trying & ~ok
            tried[:, rank] += trying
            accepted[:, rank] += ok
            found |= ok
            residual = torch.relu(cur_p - cur_q)
            mass = residual.sum(-1, keepdim=True)  # zero only when p' == q', where no draw is rejected
            cur_p = torch.where(rejected[:, None] & (mass > 0), residual / mass, cur_p)
            cur_q = torch.where(rejected[:, None], cur_q.scatter(1, tok[:, None], 0.0), cur_q)  # q'(x) = 0
            q_mass = cur_q.sum(-1, keepdim=True)
            cur_q = torch.where(rejected[:, None] & (q_mass > 0), cur_q / q_mass, cur_q)
            trying = rejected & (q_mass[:, 0] > 0)
            cur = torch.where(trying, next_sibling[b, c], cur)  # an accepted node stays in cur
            trying &= cur >= 0
        accept_index[:, depth + 1] = torch.where(found, cur, -1)
        row = torch.where(found, cur, row)
        cur_p = torch.where(found[:, None], p[b, row], cur_p)  # accepted: p after it, fresh
        walking = found
    accept_num = (accept_index[:, 1:] >= 0).sum(-1)
    flat = torch.where(accept_index >= 0, accept_index + (b * p.shape[1])[:, None], -1)  # the engine's rows
    return flat, accept_num, sample(cur_p, coin_final), tried, accepted

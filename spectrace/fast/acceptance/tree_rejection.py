"""tree_rejection on the device (core/acceptance/tree_rejection.py): the recursive rejection walk
over sampled trees, one Triton program per request (kernels/acceptance/tree_rejection.py), the bonus
drawn after it from the residual it leaves. It also returns each sibling rank's tries and
acceptances: the host's SiblingStats rank the next step's trees from them.
"""
from __future__ import annotations

import torch

from spectrace.fast.acceptance import Verdict, target_probs
from spectrace.fast.sampling import sample_rows
from spectrace.kernels.acceptance.tree_rejection import tree_rejection_walk


def tree_rejection_accept(tree, logits, target_predict, randoms, spec, max_depth) -> Verdict:
    index, num, bonus, tried, accepted = tree_rejection_walk(
        target_probs(logits, tree, spec), tree.draft_probs, tree.draft_tokens, tree.retrive_next_token,
        tree.retrive_next_sibling, randoms.coins, randoms.coin_final, sample_rows, max_depth, randoms.topk)
    return Verdict(index, num, bonus, sibling_counts=torch.cat([tried, accepted], dim=1))

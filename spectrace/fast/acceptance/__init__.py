"""Acceptance rules on the device (core/acceptance/), one entry per rule in `FAST_RULES`.

Each walks every request's verified tree at once and returns a Verdict:

    rule(tree, logits, target_predict, randoms, spec, max_depth) -> Verdict

    tree            the step's DeviceTree (candidates = its draft_tokens, root first)
    logits          (bs * n, V) the target after each node; target_predict (bs * n,) their argmax
    randoms         the step's DeviceRandoms (coins, uniforms, noise), drawn on the host
    spec            SpecConfig: sampling (p after temperature, top-k, top-p) and thresholds
    max_depth       the most drafts a walk may accept (num_steps)

greedy, target_only and rejection are the Triton twins of the explicit walks as they are
(kernels/acceptance/); vllm, tree_rejection and typical have device forms of their own, a file each.
The explicit engine's
rule walks one request's tree on the host; a fast run's trace records the explicit walk over the
same tree, and refuses a step where the two differ (fast/step_record.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from spectrace.core.sampling import probs_from_logits
from spectrace.fast.sampling import next_tokens
from spectrace.kernels.acceptance.greedy import greedy_walk
from spectrace.kernels.acceptance.rejection import rejection_walk
from spectrace.kernels.acceptance.target_only import target_only_walk
from spectrace.kernels.commit import accept_tokens


@dataclass
class Verdict:
    """ACCEPT's result for the whole batch (SGLang's names)."""

    # (bs, max_depth + 1) the accepted path as flat verify rows, root first, -1 after
    accept_index: torch.Tensor
    accept_num: torch.Tensor  # (bs,) correct drafts (SGLang's accept_length: the bonus excluded)
    bonus: torch.Tensor  # (bs,) the bonus token
    # (bs, max_depth + 1) correct drafts, the bonus, -1 after (engine)
    accept_tokens: torch.Tensor | None = None
    # (bs, 2 topk) tree_rejection: tries, then acceptances, by rank
    sibling_counts: torch.Tensor | None = None
    # accept_index with -1 read as row 0: safe to gather with (made once)
    path: torch.Tensor | None = None

    def __post_init__(self):
        self.path = self.accept_index.clamp(min=0)


def walk_outputs(bs: int, n: int, width: int, device) -> tuple[torch.Tensor, ...]:
    """The SGLang kernels' in-place outputs: predicts (bs * n,), accept_index (bs, width),
    accept_num (bs,)."""
    return (torch.full((bs * n,), -1, device=device), torch.full((bs, width), -1, device=device),
            torch.zeros(bs, dtype=torch.int64, device=device))


def verdict(predicts: torch.Tensor, accept_index: torch.Tensor, accept_num: torch.Tensor,
            **extra) -> Verdict:
    """The bonus is what the walk left in predicts at the last accepted row."""
    v = Verdict(accept_index, accept_num, None, **extra)
    v.bonus = predicts.gather(0, v.path.gather(1, accept_num[:, None]).flatten())
    return v


def target_probs(logits: torch.Tensor, tree, spec) -> torch.Tensor:
    """p after every node, (bs, n, V) float32."""
    return probs_from_logits(logits.view(tree.draft_tokens.shape[0], tree.num_nodes, -1),
                             spec.sampling)


def greedy(tree, logits, target_predict, randoms, spec, max_depth) -> Verdict:
    """greedy_walk (SGLang's verify_tree_greedy): a draft is correct when it is the target's
    argmax."""
    outs = walk_outputs(*tree.draft_tokens.shape, max_depth + 1, logits.device)
    greedy_walk(*outs, tree.draft_tokens, tree.retrive_index, tree.retrive_next_token,
                              tree.retrive_next_sibling, target_predict)
    return verdict(*outs)


def target_only(tree, logits, target_predict, randoms, spec, max_depth) -> Verdict:
    """target_only_walk (SGLang's tree_speculative_sampling_target_only) with the step's coins (q
    unused: zeros)."""
    outs = walk_outputs(*tree.draft_tokens.shape, max_depth + 1, logits.device)
    p = target_probs(logits, tree, spec)
    target_only_walk(
        *outs, tree.draft_tokens, tree.retrive_index, tree.retrive_next_token,
        tree.retrive_next_sibling, randoms.coins, randoms.coin_final, p, torch.zeros_like(p),
        spec.threshold_single, spec.threshold_acc)
    return verdict(*outs)


def rejection(tree, logits, target_predict, randoms, spec, max_depth) -> Verdict:
    """rejection_walk (SGLang's chain_speculative_sampling) over chains of drafts sampled from q."""
    outs = walk_outputs(*tree.draft_tokens.shape, tree.num_nodes, logits.device)
    rejection_walk(*outs, tree.draft_tokens, tree.retrive_index, randoms.coins, randoms.coin_final,
                   target_probs(logits, tree, spec), tree.draft_probs)
    return verdict(*outs)


def plain_sample(tree, logits, target_predict, randoms, spec, max_depth) -> Verdict:
    """--algo none at temperature > 0: each request's next token sampled from p (no tree to
    walk)."""
    bs = logits.shape[0]
    accept_index = torch.full((bs, 1), -1, device=logits.device)
    accept_index[:, 0] = torch.arange(bs, device=logits.device)
    return Verdict(accept_index, torch.zeros(bs, dtype=torch.int64, device=logits.device),
                   next_tokens(logits, spec.sampling, randoms.coin64))


def sample_undrafted(v: Verdict, tree, logits: torch.Tensor, spec, coins: torch.Tensor) -> Verdict:
    """A request that drafted nothing this step (n-gram found no match: tree.num_drafts 0) takes
    plain decoding's sample of p after its root as the bonus, as the explicit engine's
    plain_result; at temperature 0 the walk's bonus is that argmax already."""
    if tree.num_drafts is None or spec.sampling.greedy:
        return v
    first = logits.view(tree.draft_tokens.shape[0], tree.num_nodes, -1)[:, 0]
    v.bonus = torch.where(tree.num_drafts > 0, v.bonus, next_tokens(first, spec.sampling, coins))
    return v


def host_row(v: Verdict, draft_tokens: torch.Tensor) -> tuple[Verdict, torch.Tensor]:
    """What the host reads of every step, traced or not, in one copy: (bs, W + 1 [+ 2 topk]),
    accept_tokens (the correct drafts, then the bonus at column accept_num, -1 after), [the sibling
    counts,] accept_num. The verdict comes back with accept_tokens, a view of the row's first W
    columns (EXTEND reads them)."""
    W, counts = v.accept_index.shape[1], v.sibling_counts
    bs = v.accept_index.shape[0]
    row = torch.empty(bs, W + 1 + (counts.shape[1] if counts is not None else 0), dtype=torch.int64,
                      device=draft_tokens.device)
    accept_tokens(row, v.accept_index, v.accept_num, v.bonus, draft_tokens)
    if counts is not None:
        row[:, W:-1] = counts
    v.accept_tokens = row[:, :W]
    return v, row


# noqa: E402  (they import Verdict)
from spectrace.fast.acceptance import tree_rejection, typical, vllm

FAST_RULES: dict[str, Callable[..., Verdict]] = {
    "greedy": greedy, "target_only": target_only, "rejection": rejection, "vllm": vllm.vllm_accept,
    "tree_rejection": tree_rejection.tree_rejection_accept, "typical": typical.typical_accept,
}

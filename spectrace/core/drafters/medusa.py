"""Medusa (--algo medusa): K extra heads on the target's last hidden state, a static tree.

    head k (0-based) = ResBlock x L, then Linear(H, V):  ResBlock(x) = x + SiLU(Linear(x))
    on h_t (the target's final-normed hidden state at the last verified row, whose own lm_head
    prediction is the root x_{t+1}), head k predicts x_{t+k+2}: the token at tree depth k+1.

The tree is fixed before the run as "Medusa choices": paths of top-k ranks, one rank per depth,
e.g. [0, 1] = head 0's best token, then head 1's second best under it. A node's token depends only
on its depth and rank, not on its parent: each head guesses its position independently, and the
tree spends its nodes on the likeliest combinations (Medusa's Cartesian product, pruned).
All drafts come from one head pass; there is no draft KV and no draft loop.

Checkpoints use the public layout (FasterDecoding/Medusa): config.json with `medusa_num_heads`,
`medusa_num_layers`, `hidden_size`, `vocab_size`; weights `medusa_head.{k}.{j}.linear.{weight,bias}`
(ResBlock j) and `medusa_head.{k}.{L}.weight` (the head's own lm_head), in
`medusa_lm_head.safetensors` (we read no pickled `.pt`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from safetensors import SafetensorError

from spectrace.core.checkpoint import finish_loading, read_weight_file
from spectrace.core.model import CausalLM
from spectrace.core.sampling import topk_pairs
from spectrace.core.tree import DraftTree, reconstruct_indices_from_tree_mask
from spectrace.errors import SpectraceError

# Medusa's mc_sim_7b_63 (medusa/model/medusa_choices.py), in its order: likeliest paths first
MC_SIM_7B_63 = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4],
                [2, 0], [0, 5], [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8],
                [0, 0, 2], [3, 0], [0, 9], [8], [9], [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3],
                [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0], [0, 1, 1], [0, 0, 6], [0, 3, 0],
                [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0], [1, 4], [7, 0],
                [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1],
                [0, 2, 1], [9, 0], [0, 6, 0], [0, 0, 0, 1], [1, 6], [0, 7, 0]]
DEFAULT_CHOICES = 24  # our default tree: the first 24 paths (depth <= 3) of mc_sim_7b_63


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        # starts as the identity: each head starts as the base lm_head
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1):
        super().__init__()
        self.num_heads, self.num_layers = num_heads, num_layers
        self.medusa_head = nn.ModuleList([
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)],
                          nn.Linear(hidden_size, vocab_size, bias=False))
            for _ in range(num_heads)])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, H) -> (K, N, V): every head's logits."""
        return torch.stack([head(hidden) for head in self.medusa_head])


def load_medusa(path: str | Path, target: CausalLM) -> MedusaHeads:
    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    try:
        K, L = int(cfg["medusa_num_heads"]), int(cfg.get("medusa_num_layers", 1))
    except (KeyError, TypeError, ValueError):
        raise SpectraceError(f"{path}/config.json is not a Medusa config "
                             "(no medusa_num_heads)") from None
    H, V = target.config.hidden_size, target.config.vocab_size
    if cfg.get("hidden_size", H) != H or cfg.get("vocab_size", V) != V:
        raise SpectraceError(f"Medusa heads in {path} are for hidden size {cfg.get('hidden_size')} "
                             f"and vocabulary {cfg.get('vocab_size')}; the target has {H} and {V}")
    weights = path / "medusa_lm_head.safetensors"
    if not weights.is_file():
        raise SpectraceError(f"no medusa_lm_head.safetensors in {path} "
                             f"(pickled .pt checkpoints are not read)")
    try:
        state = read_weight_file(weights)
    except (OSError, ValueError, SafetensorError) as e:
        raise SpectraceError(f"cannot load Medusa heads from {path}: "
                             f"{str(e).splitlines()[0]}") from None
    # Medusa also saves the ModuleList alone
    if not any(k.startswith("medusa_head.") for k in state):
        state = {f"medusa_head.{k}": v for k, v in state.items()}
    return finish_loading(lambda: MedusaHeads(H, V, K, L), state, target, path,
                          f"Medusa checkpoint of {K} heads x {L} layers")


def check_choices(choices, num_heads: int) -> list[list[int]]:
    """Medusa choices as a sorted tree: every path's parent present, depth <= the heads."""
    try:
        paths = [list(map(int, c)) for c in choices]
    except (TypeError, ValueError):
        paths = None
    if not paths or any(not p or min(p) < 0 for p in paths):
        raise SpectraceError("Medusa choices must be non-empty paths "
                             "of ranks >= 0, e.g. [[0], [0, 0], [1]]")
    seen = {tuple(p) for p in paths}
    if len(seen) != len(paths):
        raise SpectraceError("Medusa choices repeat a path")
    for p in paths:
        if len(p) > num_heads:
            raise SpectraceError(f"Medusa choice {p} is {len(p)} deep; "
                                 f"the checkpoint has {num_heads} heads")
        if len(p) > 1 and tuple(p[:-1]) not in seen:
            raise SpectraceError(f"Medusa choice {p} has no parent {p[:-1]} in the tree")
    return sorted(paths, key=lambda p: (len(p), p))  # generate_medusa_buffers' order


def load_choices(path: str) -> list[list[int]]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SpectraceError(f"--medusa-choices {path}: {e}") from None


@dataclass(frozen=True)
class MedusaTree:
    """The static tree of Medusa choices (Medusa's `generate_medusa_buffers`): node i+1 is
    choices[i], sorted by depth, then ranks; its parent is its path without the last rank."""

    choices: list[list[int]]
    parent: list[int]  # parent node of nodes 1..n-1 (0 = the root)
    mask: torch.Tensor  # (n, n) bool: row j = the root, j's ancestors and j

    @classmethod
    def from_choices(cls, choices, num_heads: int) -> "MedusaTree":
        choices = check_choices(choices, num_heads)
        index = {tuple(c): i + 1 for i, c in enumerate(choices)}
        n = len(choices) + 1
        mask = torch.eye(n, dtype=torch.bool)
        mask[:, 0] = True
        for i, c in enumerate(choices):
            for d in range(1, len(c)):
                mask[i + 1, index[tuple(c[:d])]] = True
        return cls(choices, [index.get(tuple(c[:-1]), 0) for c in choices], mask)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(num_steps, topk, num_draft_tokens): its depth, its widest rank and its size."""
        return (max(map(len, self.choices)), max(max(c) for c in self.choices) + 1,
                len(self.choices) + 1)


class MedusaDrafter:
    kv = None  # the heads read the target's hidden state; nothing of their own to cache
    capture_layers = ()

    def __init__(self, heads: MedusaHeads, tree: MedusaTree, trace_topk: int = 5):
        self.heads, self.tree, self.trace_topk = heads, tree, trace_topk
        self.num_steps, self.topk, self.num_draft_tokens = tree.shape
        self.last_hidden: dict[int, torch.Tensor] = {}  # req -> (H,) h_t of the root's parent row

    def draft_extend_for_prefill(self, items) -> None:
        for req, _, feats in items:
            self.last_hidden[req] = feats[-1]

    def draft_extend(self, items) -> None:
        # the last accepted row: its lm_head gave the bonus, the next root
        for req, _, feats in items:
            self.last_hidden[req] = feats[-1]

    @torch.no_grad()
    def draft(self, reqs: list[int], root_tokens: list[int], seq_lens: list[int],
              sampled=None) -> DraftTree:
        bs, n, wide = len(reqs), self.num_draft_tokens, max(self.topk, self.trace_topk)
        # (K, bs, V)
        probs = torch.softmax(self.heads(torch.stack([self.last_hidden[r] for r in reqs])).float(),
                              -1)
        top_p, top_i = torch.topk(probs, wide, dim=-1)
        depth = [len(c) - 1 for c in self.tree.choices]
        rank = [c[-1] for c in self.tree.choices]
        # (bs, n-1): node i+1 takes head depth[i]'s rank[i]-th token
        tokens = top_i[depth, :, rank].T
        q = top_p[depth, :, rank].T
        scores = q.clone()
        for i, p in enumerate(self.tree.parent):  # parents come first in the sorted choices
            if p:
                scores[:, i] *= scores[:, p - 1]
        masks = self.tree.mask.to(probs.device).expand(bs, n, n)
        positions, ri, rnt, rns = reconstruct_indices_from_tree_mask(masks.reshape(-1), seq_lens, n)
        pairs = topk_pairs(probs, wide)  # (K, bs) lists: each head's top tokens
        return DraftTree(
            draft_tokens=torch.cat([torch.tensor(root_tokens, device=probs.device).view(bs, 1),
                                    tokens], 1),
            tree_mask=masks, positions=positions.view(bs, n), retrive_index=ri,
            retrive_next_token=rnt, retrive_next_sibling=rns, q=q, scores=scores,
            draft_topk=[[pairs[d][b] for d in depth] for b in range(bs)])

    def release(self, req: int) -> None:
        self.last_hidden.pop(req, None)

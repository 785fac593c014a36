"""The draft side of SGLang's EAGLE worker (`EAGLEWorker.draft` and `draft_forward`), shared by
every drafter that grows a tree level by level: the EAGLE-1, EAGLE-3 and NEXTN/MTP heads, the
standalone draft LM (SGLang's StandaloneWorker subclasses EAGLEWorker the same way) and the
FROZEN_KV_MTP assistant.

    draft_forward     num_steps levels; each keeps the K best paths by path score
                      (select_top_k_tokens) and runs the draft model once over them
    build_draft_tree  organize_draft_results + build_tree_kernel_efficient, plus what the trace
                      and the sampling rules keep of each node
    ScratchKVDrafter  the skeleton of a drafter with a KV of its own: DRAFT over scratch KV
                      (scratch.py), DRAFT_EXTEND commits the accepted tokens' KV
    EagleDrafter      the heads that read the target's features (eagle.py, eagle3.py, mtp.py)

Sampled drafts. For the lossless sampling rules the K children of a path are K draws without
replacement from its q, the first K arrivals of an exponential race (a chain draws one, as
SGLang's `sample_draft_proposal` does for rejection sampling), and the tree keeps the q each
node was drawn from. Which nodes the tree keeps must not depend on what they drew, so a sampled
child's path score uses, in place of its own q, `sibling_worth[j]`: what the j-th draw of a node
is worth, estimated from the request's earlier steps (acceptance/tree_rejection.py). The shape
is then fixed before the draws, as in SpecInfer's and Sequoia's static trees; ties go to the
earlier candidate.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from spectrace.core.batch import ForwardBatch
from spectrace.core.drafters import SampledDrafts
from spectrace.core.drafters.scratch import TreeScratch
from spectrace.core.kv import KVCache
from spectrace.core.model import CausalLM
from spectrace.core.sampling import exponential_race, topk_pairs
from spectrace.core.tree import (BUILD_TREE, DraftTree, TreeMaskMode, organize_draft_results,
                                 select_top_k_tokens)


def propose_children(probs: torch.Tensor, topk: int, sampled: SampledDrafts | None):
    """The K children of each path, probs (P, V) with P = bs * paths per request: the draft's top
    K (SGLang's `fast_topk`), or K draws without replacement from q in draw order (an exponential
    race on the request's generator). Returns their q (P, K), their tokens (P, K) and what ranks
    them in the path score (P, K): q itself for the top K; for sampled trees sibling_worth, so
    the tree's shape does not depend on the draws."""
    if sampled is None:
        topk_p, topk_index = torch.topk(probs, topk, dim=-1)
        return topk_p, topk_index, topk_p
    if sampled.noise is not None:  # exponential_race with the level's noise drawn ahead
        arrivals = torch.topk(probs / next(sampled.noise), topk, dim=-1)
        topk_index, real = arrivals.indices, arrivals.values > 0
    else:
        bs = len(sampled.generators)
        draws = [exponential_race(rows, topk, gen)
                 for rows, gen in zip(probs.reshape(bs, -1, probs.shape[-1]),
                                                                         sampled.generators)]
        topk_index, real = torch.cat([d[0] for d in draws]), torch.cat([d[1] for d in draws])
    # a path whose q has fewer than K tokens with mass pads with q = 0 (never tried)
    topk_q = torch.where(real, torch.gather(probs, 1, topk_index), 0.0)
    if topk == 1:
        return topk_q, topk_index, torch.ones_like(topk_q)
    worth = sampled.sibling_worth
    return (topk_q, topk_index,
            worth.to(probs.device).repeat_interleave(probs.shape[0] // worth.shape[0], dim=0))


@dataclass
class DraftLevels:
    """What the draft loop leaves, one entry per level: SGLang's score_list, token_list and
    parents_list, each candidate's q given its parent, and the distributions it was drawn from."""

    score_list: list = field(default_factory=list)
    token_list: list = field(default_factory=list)
    parents_list: list = field(default_factory=list)
    q_list: list = field(default_factory=list)  # (bs, K) at level 0, (bs, K*K) later
    probs_list: list = field(default_factory=list)  # (bs, V) at level 0, (bs*K, V) later


def draft_forward(forward, probs: torch.Tensor, hidden_states: torch.Tensor | None, num_steps: int,
                  topk: int, sampled: SampledDrafts | None = None) -> DraftLevels:
    """SGLang's `EAGLEWorker.draft_forward`.

    probs (bs, V): the draft's q after each root, kept by the last DRAFT_EXTEND; hidden_states
    (bs, H): what a head continues from at the root (None for a draft LM). forward(i, input_ids,
    hidden_states, parents) runs the draft model once over level i's kept paths: input_ids
    (bs*K,), hidden_states (bs*K, H) or None, parents (bs, K) their flat candidate indices (the
    scratch KV reads their ancestry from them); it returns (probs (bs*K, V), hidden_states).
    The last level runs no forward."""
    bs, levels, scores = probs.shape[0], DraftLevels(), None
    topk_q, topk_index, topk_p = propose_children(probs, topk, sampled)
    for i in range(num_steps):
        input_ids, hidden_states, scores, tree_info = select_top_k_tokens(
            i, topk_p, topk_index, hidden_states, scores, topk)
        levels.score_list.append(tree_info[0])
        levels.token_list.append(tree_info[1])
        levels.parents_list.append(tree_info[2])
        levels.q_list.append(topk_q.reshape(bs, -1))
        levels.probs_list.append(probs)
        if i == num_steps - 1:
            break
        probs, hidden_states = forward(i, input_ids, hidden_states, tree_info[2][:, -topk:])
        topk_q, topk_index, topk_p = propose_children(probs, topk, sampled)
    return levels


def build_draft_tree(levels: DraftLevels, root_tokens: torch.Tensor, seq_lens: list[int],
                     num_draft_tokens: int, topk: int, trace_topk: int,
                     sampled: SampledDrafts | None, backend: str = "explicit") -> DraftTree:
    """SGLang's `organize_draft_results` and `build_tree_kernel_efficient` over the loop's
    candidates. Each node also keeps its q, its path score and the distribution it was drawn
    from: its parent path's, row `top_scores_index // topk` of parent_list (the kernel's
    parent_tb_idx). The trace keeps that distribution's top tokens; sampling rules and
    --record-probs read it whole."""
    n, bs = num_draft_tokens, root_tokens.shape[0]
    parent_list, top_scores_index, draft_tokens = organize_draft_results(
        levels.score_list, levels.token_list, levels.parents_list, n)
    tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling = \
        BUILD_TREE[backend](parent_list, top_scores_index, seq_lens, topk, n,
                            TreeMaskMode.QLEN_ONLY)
    # one distribution per row of parent_list: the root's, then K per level (bs, 1 + K(S-1), V)
    dists = torch.cat([p.view(bs, -1, p.shape[-1]) for p in levels.probs_list], dim=1)
    parent_tb_idx = top_scores_index // topk  # (bs, n-1)
    pairs = topk_pairs(dists, min(max(topk, trace_topk), dists.shape[-1]))
    # (bs, n-1, V)
    at_parent = torch.gather(dists, 1, parent_tb_idx.unsqueeze(-1).expand(-1, -1, dists.shape[-1]))
    return DraftTree(
        draft_tokens=torch.cat([root_tokens.view(bs, 1), draft_tokens], dim=1),
        tree_mask=tree_mask.view(bs, n, n), positions=positions.view(bs, n),
        retrive_index=retrive_index, retrive_next_token=retrive_next_token,
        retrive_next_sibling=retrive_next_sibling,
        q=torch.gather(torch.cat(levels.q_list, dim=1), 1, top_scores_index),
        scores=torch.gather(torch.cat([s.flatten(1) for s in levels.score_list], dim=1), 1,
                            top_scores_index),
        draft_topk=[[pairs[b][row] for row in parent_tb_idx[b].tolist()] for b in range(bs)],
        draft_probs=at_parent if sampled is not None else None, q_dists=at_parent,
        candidates=draft_candidates(*level_tensors(levels), top_scores_index, topk),
        sibling_worth=sampled.sibling_worth if sampled is not None else None)


def level_tensors(levels: DraftLevels) -> tuple[torch.Tensor, ...]:
    """Every candidate the draft loop scored, in SGLang's flat candidate order (level 0's K, then
    K*K per level): tokens, q, path scores (bs, C), and parent_list (bs, 1 + K(S-1)): the flat
    candidate index of each kept path, -1 for the root; candidate c's parent is parent_list[c //
    K]."""
    return (torch.cat(levels.token_list, dim=1), torch.cat(levels.q_list, dim=1),
            torch.cat([s.flatten(1) for s in levels.score_list], dim=1),
            torch.cat(levels.parents_list, dim=1))


def draft_candidates(tokens, q, scores, parent_list, top_scores_index, topk: int) -> list[dict]:
    """For the trace, per request: every candidate the loop scored (level_tensors), with its level
    (0 = a child of the root), its parent candidate, and the tree node it became (-1: dropped,
    below the n-1 best path scores that organize_draft_results keeps). The walkthrough draws the
    dropped ones faded beside the tree, so a learner sees the cut."""
    out = []
    for b in range(tokens.shape[0]):
        kept = {c: j + 1 for j, c in enumerate(top_scores_index[b].tolist())}
        paths = parent_list[b].tolist()
        C = tokens.shape[1]
        out.append({
            "tokens": tokens[b].tolist(),
            "q": [round(x, 6) for x in q[b].tolist()],
            "scores": [round(x, 6) for x in scores[b].tolist()],
            "levels": [0 if c < topk else 1 + (c - topk) // (topk * topk) for c in range(C)],
            "parents": [paths[c // topk] for c in range(C)],
            "nodes": [kept.get(c, -1) for c in range(C)],
        })
    return out


class ScratchKVDrafter(ABC):
    """A drafter with its own paged KV, run as SGLang's EAGLE worker runs it:

        DRAFT         num_steps - 1 forwards over the K kept paths (the first level comes from
                      the kept q); their KV is scratch, released right after drafting
        DRAFT_EXTEND  one forward over the step's accept_tokens, which commits their KV and
                      keeps what the next DRAFT starts from: q after the last committed token,
                      and for heads their output there
    Subclasses say what one forward of their model is (`forward`, `compute_logits`)."""

    # target layers whose inputs are the features; () = last hidden
    capture_layers: tuple[int, ...] = ()
    # deeper levels read the model's own output (heads), not only tokens (an LM)
    feeds_hidden = False

    def __init__(self, kv: KVCache, num_steps: int, topk: int = 1,
                 num_draft_tokens: int | None = None, temperature: float = 1.0,
                 trace_topk: int = 5):
        self.kv, self.num_steps, self.topk, self.trace_topk = kv, num_steps, topk, trace_topk
        self.num_draft_tokens = num_draft_tokens or num_steps + 1
        # q = softmax(logits / T): T of the run when drafts are sampled, else 1
        self.temperature = temperature
        # req -> (V,) q after the last committed token
        self.next_probs: dict[int, torch.Tensor] = {}
        # req -> (H,) the model's output there (heads)
        self.last_hidden: dict[int, torch.Tensor] = {}

    @abstractmethod
    def forward(self, batch: ForwardBatch, hidden_states: torch.Tensor) -> torch.Tensor:
        """The draft model over one batch, reading the draft KV: (N, H) outputs. hidden_states
        (N, F): what a head reads beside each token (a target feature, or at deeper levels its
        own output); a draft LM reads none."""

    @abstractmethod
    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        """(N, V) float32 logits of the next token from `forward`'s outputs."""

    def probs(self, h: torch.Tensor) -> torch.Tensor:
        """The draft's q = softmax(logits / T) after each output row."""
        return torch.softmax(self.compute_logits(h) / self.temperature, dim=-1)

    @torch.no_grad()
    def _extend(self, items) -> None:
        """Append each request's tokens to its draft KV; keep q and the output after the last."""
        batch = ForwardBatch.build(self.kv,
                                   [(req, self.kv.seq_lens[req], toks) for req, toks, _ in items])
        h = self.forward(batch, torch.cat([f for _, _, f in items]))
        last = torch.cumsum(torch.tensor([len(toks) for _, toks, _ in items]), 0) - 1
        q = self.probs(h[last])
        for j, (req, toks, _) in enumerate(items):
            self.kv.commit(req, self.kv.seq_lens[req], len(toks), list(range(len(toks))))
            self.next_probs[req], self.last_hidden[req] = q[j], h[last[j]]

    def draft_extend_for_prefill(self, items) -> None:
        self._extend(items)

    def draft_extend(self, items) -> None:
        self._extend(items)

    @torch.no_grad()
    def draft(self, reqs: list[int], root_tokens: list[int], seq_lens: list[int],
              sampled=None) -> DraftTree:
        # level 0 sits right after the committed draft KV
        scratch = TreeScratch(self.kv, reqs, self.topk, self.num_steps,
                              [self.kv.seq_lens[r] for r in reqs])

        def forward(i, input_ids, hidden_states, parents):
            h = self.forward(scratch.batch(i, input_ids, parents), hidden_states)
            return self.probs(h), h if self.feeds_hidden else None

        hidden = torch.stack([self.last_hidden[r] for r in reqs]) if self.feeds_hidden else None
        levels = draft_forward(forward, torch.stack([self.next_probs[r] for r in reqs]), hidden,
                               self.num_steps, self.topk, sampled)
        scratch.release()
        roots = torch.tensor(root_tokens, device=self.kv.req_to_token.device)
        return build_draft_tree(levels, roots, seq_lens, self.num_draft_tokens, self.topk,
                                self.trace_topk, sampled, self.kv.backend)

    def set_num_steps(self, num_steps: int) -> None:
        """Adaptive steps switch the chain's length between steps (topk 1)."""
        self.num_steps, self.num_draft_tokens = num_steps, num_steps + 1

    def release(self, req: int) -> None:
        self.kv.release(req)
        self.next_probs.pop(req, None)
        self.last_hidden.pop(req, None)


class EagleDrafter(ScratchKVDrafter):
    """EAGLE-1, EAGLE-3 and NEXTN/MTP heads (EagleHead and its subclasses): each reads pairs
    (feature f_t, token x_{t+1}) at position t of its own KV; deeper levels read its own output.

        prefill       pairs (f_0, x_1) .. (f_{L-1}, x_L): the prompt shifted by one, ending with
                      the first generated token
        DRAFT_EXTEND  pairs (f_root, d_1) .. (f_{d_c}, bonus): the accepted rows' features with
                      the step's accept_tokens, so the head's KV always matches the target's"""

    feeds_hidden = True

    def __init__(self, head, target: CausalLM, kv: KVCache, num_steps: int, topk: int = 1,
                 num_draft_tokens: int | None = None, temperature: float = 1.0,
                 trace_topk: int = 5):
        super().__init__(kv, num_steps, topk, num_draft_tokens, temperature, trace_topk)
        self.head, self.lm_head = head, target.lm_head
        self.capture_layers = head.capture_layers

    def forward(self, batch, hidden_states):
        return self.head(batch, self.kv, hidden_states)

    def compute_logits(self, h):
        return self.head.compute_logits(h, self.lm_head)

    def draft_extend_for_prefill(self, items) -> None:
        self._extend([(req, toks[1:], f) for req, toks, f in items])

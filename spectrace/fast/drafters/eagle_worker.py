"""The EAGLE worker on the fast engine (core/drafters/eagle_worker.py and scratch.py): the EAGLE-1,
EAGLE-3 and NEXTN/MTP heads and the standalone draft LM, drafting over a draft KV of their own.

    DRAFT          core's draft_forward over the scratch KV (fast/batch.py: scratch_batch): level
                   i's K paths each write scratch column k * (num_steps - 1) + i after the
                   committed draft KV and read that KV and their own path's columns; then
                   build_draft_tree (organize_draft_results, the Triton build_tree, what the
                   sampling rules and the trace keep). Greedy runs without --record-probs run
                   fused_draft_forward instead: each level's selection is one Triton program per
                   request (kernels/draft_level.py), and the tree two (build_fused_tree)
    DRAFT_EXTEND   the step's accept_tokens padded to num_steps + 1 per request (causal: a real
                   row never sees a padding row), as SGLang's draft-extend graph runs them
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from spectrace.core.drafters import SampledDrafts
from spectrace.core.drafters.eagle_worker import DraftLevels, draft_forward, level_tensors
from spectrace.core.tree import TreeMaskMode, organize_draft_results
from spectrace.fast.batch import extend_batch, ramp, scratch_batch, scratch_slots
from spectrace.fast.kv import StaticKV
from spectrace.fast.tree import DeviceTree
from spectrace.kernels.commit import commit_draft_state
from spectrace.kernels.draft_level import DraftBuffers, select_level
from spectrace.kernels.tree import build_tree
from spectrace.kernels.tree import organize_draft_results as organize_buffers


def build_draft_tree(levels: DraftLevels, roots: torch.Tensor, seq_lens: torch.Tensor, topk: int,
                     n: int, keep_q: bool, trace_topk: int | None) -> DeviceTree:
    """core/drafters/eagle_worker.py: build_draft_tree on the device, its mask QLEN_ONLY
    (fast/tree.py).
    keep_q: the q each node was drawn from (sampled rules, --record-probs); trace_topk: what the
    trace keeps (None: no trace)."""
    bs = roots.shape[0]
    parent_list, top_scores_index, draft_tokens = organize_draft_results(
        levels.score_list, levels.token_list, levels.parents_list, n)
    tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling = build_tree(
        parent_list, top_scores_index, seq_lens, topk, n, TreeMaskMode.QLEN_ONLY)
    tree = DeviceTree(torch.cat([roots[:, None], draft_tokens], dim=1), positions.view(bs, n),
                      tree_mask.view(bs, n, n), retrive_index, retrive_next_token,
                      retrive_next_sibling)
    if not keep_q and trace_topk is None:
        return tree
    # a row per parent_list row
    dists = torch.cat([p.view(bs, -1, p.shape[-1]) for p in levels.probs_list], dim=1)
    parent_rows = (top_scores_index // topk)[..., None]  # (bs, n-1, 1): the kernel's parent_tb_idx
    if keep_q:
        # (bs, n-1, V)
        tree.draft_probs = torch.gather(dists, 1, parent_rows.expand(-1, -1, dists.shape[-1]))
    if trace_topk is not None:  # recording runs only: a dozen kernels more
        tree.q = torch.gather(torch.cat(levels.q_list, dim=1), 1, top_scores_index)
        tree.scores = torch.gather(torch.cat([s.flatten(1) for s in levels.score_list], dim=1), 1,
                                   top_scores_index)
        top = torch.topk(dists, min(max(topk, trace_topk, 1), dists.shape[-1]), dim=-1)
        rows = parent_rows.expand(-1, -1, top.values.shape[-1])
        tree.draft_top = (torch.gather(top.values, 1, rows), torch.gather(top.indices, 1, rows))
        # every candidate the loop scored
        tree.candidates = (*level_tensors(levels), top_scores_index)
    return tree


def fused_draft_forward(forward, first: torch.Tensor, hidden_states, num_steps: int, topk: int,
                        probs: bool, token_map: torch.Tensor | None = None,
                        trace_topk: int | None = None) -> tuple[DraftBuffers, list | None]:
    """core's draft_forward for greedy runs that record nothing: every level's softmax, top-K,
    path scores, K-of-K*K select and path bookkeeping as one Triton program per request
    (kernels/draft_level.py), its candidates written straight into one step's DraftBuffers.
    first (bs, V): the draft's q after each root (probs=True) or its logits; forward(i, input_ids,
    hidden_states, paths) runs the draft model over level i's kept paths (paths (bs, K, i + 1):
    their scratch columns) and returns (logits (bs*K, V), hidden_states or None); token_map: the
    target token of each column of those logits, where the draft has its own vocabulary (EAGLE-3).
    trace_topk (a recording run): also the top max(topk, trace_topk) of q after every path each
    level extends, (values, target ids), what the trace keeps of the distributions, picked by the
    same kernels as the children."""
    bs, device = first.shape[0], first.device
    buffers = DraftBuffers.empty(bs, topk, num_steps, device)
    k, tops = max(topk, trace_topk or 0), [] if trace_topk is not None else None

    # the level's top k of q, which select_level fills beside its own top K
    def trace_top(rows: int):
        if tops is None:
            return None
        tops.append((torch.empty(rows, k, device=device),
                     torch.empty(rows, k, dtype=torch.int64, device=device)))
        return tops[-1]

    scores, input_ids, hidden_states, paths = select_level(first, None, None, hidden_states, 0,
                                                           num_steps, buffers, probs,
                                                           trace_top=trace_top(bs))
    for i in range(num_steps - 1):
        logits, h = forward(i, input_ids, hidden_states, paths)
        scores, input_ids, hidden_states, paths = select_level(logits, scores, paths, h, i + 1,
                                                               num_steps, buffers,
                                                               token_map=token_map,
                                                               trace_top=trace_top(bs * topk))
    return buffers, tops


def build_fused_tree(buffers: DraftBuffers, roots: torch.Tensor, seq_lens: torch.Tensor, topk: int,
                     n: int, tops: list | None = None) -> DeviceTree:
    """build_draft_tree over fused_draft_forward's buffers: organize_draft_results and build_tree,
    two Triton programs per request; with `tops` (a recording run) what the trace keeps, as
    build_draft_tree keeps it. A candidate's q is its parent's k-th best: the first topk of each
    row of `tops`, in the loop's candidate order."""
    bs = roots.shape[0]
    top_scores_index, draft_tokens = organize_buffers(buffers.scores, buffers.tokens, roots, n)
    tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling = build_tree(
        buffers.parents, top_scores_index, seq_lens, topk, n, TreeMaskMode.QLEN_ONLY)
    tree = DeviceTree(draft_tokens, positions.view(bs, n), tree_mask.view(bs, n, n), retrive_index,
                      retrive_next_token, retrive_next_sibling)
    if tops is None:
        return tree
    # (bs, 1 + (S-1)K, k): a row a parent
    values = torch.cat([v.view(bs, -1, v.shape[-1]) for v, _ in tops], dim=1)
    ids = torch.cat([i.view(bs, -1, i.shape[-1]) for _, i in tops], dim=1)
    q = values[..., :topk].reshape(bs, -1)  # (bs, C): every candidate's q
    rows = (top_scores_index // topk)[..., None].expand(-1, -1, values.shape[-1])
    tree.q, tree.scores = (torch.gather(q, 1, top_scores_index),
                           torch.gather(buffers.scores, 1, top_scores_index))
    tree.draft_top = (torch.gather(values, 1, rows), torch.gather(ids, 1, rows))
    tree.candidates = (buffers.tokens, q, buffers.scores,
                       buffers.parents[:, :1 + (len(tops) - 1) * topk], top_scores_index)
    return tree


class EagleWorker:
    """A head (reads (token, target feature) pairs shifted by one and feeds its own output to
    deeper levels) or a draft LM (reads tokens at their own positions), its draft KV, and what
    the next DRAFT starts from: q after each request's last committed token, and a head's output
    there."""

    drafts_on_host = False

    def __init__(self, model, target, is_head: bool, bs: int, columns: int, topk: int,
                 sampled: bool, keep_q: bool, trace_topk: int | None, temperature: float = 1.0,
                 fused: bool = False):
        self.model, self.target, self.is_head = model, target, is_head
        self.capture_layers = model.capture_layers if is_head else ()
        self.kv = StaticKV(model, bs, columns)
        self.topk, self.samples_drafts = topk, sampled
        self.keep_q, self.trace_topk = keep_q, trace_topk
        # q = softmax(logits / T): the run's T when drafts are sampled
        self.temperature = temperature
        self.fused = fused  # fused_draft_forward (engines.py: fast_drafter says when)
        # EAGLE-3's draft -> target ids, made once
        self.vocab_ids = model.vocab_ids if is_head else None
        device, dtype = target.lm_head.weight.device, target.lm_head.weight.dtype
        # q after the root
        self.next_probs = torch.zeros(bs, target.config.vocab_size, device=device)
        self.last_hidden = torch.zeros(bs, model.config.hidden_size, dtype=dtype, device=device)

    def reset(self) -> None:
        self.kv.reset()

    def forward(self, batch, features) -> torch.Tensor:
        return (self.model(batch, self.kv, features) if self.is_head
                else self.model(batch, self.kv).hidden_states)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return (self.model.compute_logits(h, self.target.lm_head) if self.is_head
                else self.model.lm_head(h).float())

    def probs(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.logits(h)
        return torch.softmax(logits / self.temperature if self.temperature != 1.0 else logits,
                             dim=-1)

    def prefill(self, prompt_ids, prompt_lens, roots, features) -> None:
        """Heads read pairs (f_t, x_{t+1}): the prompt shifted by one, ending with the first token;
        a draft LM reads the prompt and the first token."""
        bs, L = prompt_ids.shape
        width = L if self.is_head else L + 1
        tokens = F.pad(prompt_ids[:, 1:] if self.is_head else prompt_ids, (0, 1))  # (bs, width)
        tokens.scatter_(1, (prompt_lens - 1 if self.is_head else prompt_lens)[:, None],
                        roots[:, None])
        rows = torch.arange(width, device=roots.device)
        h = self.forward(extend_batch(self.kv, tokens.flatten(), rows.repeat(bs), width),
                         features if self.is_head else None)
        lens = prompt_lens if self.is_head else prompt_lens + 1
        last = torch.arange(bs, device=roots.device) * width + lens - 1
        self.next_probs.copy_(self.probs(h[last]))
        self.last_hidden.copy_(h[last])
        self.kv.seq_lens.copy_(lens)

    def draft(self, roots, seq_lens, num_steps, num_draft_tokens, randoms) -> DeviceTree:
        positions, slots = scratch_slots(self.kv, num_steps, self.topk)

        # level i over its kept paths' scratch columns
        def forward(i, input_ids, hidden_states, paths):
            return self.forward(scratch_batch(self.kv, input_ids, positions[i], slots[i], paths),
                                hidden_states)

        hidden = self.last_hidden if self.is_head else None
        if self.fused:
            # logits in the model's dtype, over the draft's own vocabulary: select_level reads them
            # in float32 and maps its picks to target ids
            def logits_forward(*level):
                h = forward(*level)
                if not self.is_head:
                    return self.model.lm_head(h), None
                return self.model.vocab_logits(h, self.target.lm_head), h

            buffers, tops = fused_draft_forward(logits_forward, self.next_probs, hidden, num_steps,
                                                self.topk, probs=True, token_map=self.vocab_ids,
                                                trace_topk=self.trace_topk)
            return build_fused_tree(buffers, roots, seq_lens, self.topk, num_draft_tokens, tops)
        levels = self.draft_levels(forward, hidden, num_steps, randoms)
        return build_draft_tree(levels, roots, seq_lens, self.topk, num_draft_tokens, self.keep_q,
                                self.trace_topk)

    def draft_levels(self, forward, hidden, num_steps, randoms) -> DraftLevels:
        """core's draft_forward, its forward over the scratch KV: every level's q kept (sampled
        drafts, --record-probs, the trace)."""
        K, bs = self.topk, self.next_probs.shape[0]
        own = ramp(K, num_steps - 1, self.next_probs.device).view(1, K, 1).expand(bs, K, 1)
        paths = []  # the scratch columns of each kept path's nodes, (bs, K, level + 1)

        def probs_forward(i, input_ids, hidden_states, parents):
            if i == 0:
                paths.append(own)
            else:  # a kept path extends path (parents // K - 1) % K of level i - 1
                beam = (parents // K - (1 + K * (i - 1)))[..., None].expand(-1, -1, i)
                paths.append(torch.cat([torch.gather(paths[-1], 1, beam), own + i], dim=2))
            h = forward(i, input_ids, hidden_states, paths[-1])
            return self.probs(h), h if self.is_head else None

        sampled = (SampledDrafts(None, randoms.worth if K > 1 else None, iter(randoms.noise))
                   if self.samples_drafts else None)
        return draft_forward(probs_forward, self.next_probs, hidden, num_steps, K, sampled)

    def draft_extend(self, tree, verdict, features, live) -> None:
        bs, E = verdict.accept_tokens.shape
        kv = self.kv
        cols = kv.seq_lens[:, None] + ramp(E, 1, live.device)
        batch = extend_batch(kv, verdict.accept_tokens.clamp(min=0).flatten(), cols.flatten(), E)
        h = self.forward(batch, features[verdict.path.flatten()] if self.is_head else None)
        # each request's last accepted row
        h_last = h[ramp(bs, E, live.device) + verdict.accept_num]
        commit_draft_state(self.next_probs, self.last_hidden if self.is_head else None, kv.seq_lens,
                           self.probs(h_last), h_last, verdict.accept_num, live)

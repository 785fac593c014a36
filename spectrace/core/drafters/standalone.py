"""STANDALONE: a smaller LM with the target's tokenizer drafts a chain (topk 1) or a tree.

The drafter keeps its own paged KV. Its KV always covers every committed token (the target's
lags one behind: the last bonus token gets its target KV in the next verify), and it keeps the
distribution that follows the last committed token, so a step costs as in SGLang's EAGLE worker:
    DRAFT         num_steps - 1 forwards over the K kept paths (the first level comes from the
                  kept distribution); their KV is scratch, released right after drafting
    DRAFT_EXTEND  one forward over the step's accept_tokens (correct drafts + bonus), which
                  commits their KV and yields the next kept distribution
Scratch KV is laid out as SGLang lays it, `[topk][step]` after the committed tokens; a path at
level i attends to the prefix and its own ancestors' scratch slots (a tree mask).
SGLang runs STANDALONE through its EAGLE worker, which feeds the draft model token t+1 at
position t; a plain LM is indifferent to that shift (RoPE sees only relative positions), so we
keep tokens at their own positions, which reads more simply in the trace.
"""
from __future__ import annotations

import torch

from spectrace.core.batch import ForwardBatch
from spectrace.core.kv import KVCache
from spectrace.core.model import CausalLM
from spectrace.core.tree import DraftTree, draft_tree


class StandaloneDrafter:
    algo = "standalone"

    def __init__(self, model: CausalLM, kv: KVCache, num_steps: int, topk: int = 1,
                 num_draft_tokens: int | None = None, trace_topk: int = 5):
        self.model, self.kv, self.trace_topk = model, kv, trace_topk
        self.num_steps, self.topk = num_steps, topk
        self.num_draft_tokens = num_draft_tokens or num_steps + 1
        self.next_probs: dict[int, torch.Tensor] = {}  # req -> (vocab,) draft p(. | committed)

    def _extend(self, items: list[tuple[int, list[int]]]) -> None:
        """Append tokens to each request's draft KV and keep the distribution after the last."""
        batch = ForwardBatch.build(self.kv, [(req, self.kv.seq_lens[req], toks) for req, toks in items])
        logits = self.model(batch, self.kv).logits
        end = 0
        for req, toks in items:
            start = self.kv.seq_lens[req]
            self.kv.commit(req, start, len(toks), list(range(len(toks))))
            end += len(toks)
            self.next_probs[req] = torch.softmax(logits[end - 1], dim=-1)

    def draft_extend_for_prefill(self, items: list[tuple[int, list[int]]]) -> None:
        """items: (req, prompt + first token): the draft reads what the target has committed."""
        self._extend(items)

    def draft_extend(self, items: list[tuple[int, list[int]]]) -> None:
        """items: (req, accept_tokens) of this step."""
        self._extend(items)

    def draft(self, reqs: list[int], root_tokens: list[int], target_seq_lens: list[int]) -> DraftTree:
        K, S = self.topk, self.num_steps
        T = [self.kv.seq_lens[r] for r in reqs]  # committed draft KV, root included
        width = K * (S - 1)  # scratch columns per request: [topk][step]
        device = self.kv.req_to_token.device
        scratch = [self.kv.prepare(r, t, width) for r, t in zip(reqs, T)]
        paths: list[list[list[int]]] = []  # per request and kept path: its scratch columns

        def forward_beams(i, input_ids, parent_beam):
            nonlocal paths
            cols = [[k * (S - 1) + i for k in range(K)] for _ in reqs]  # this level's columns
            if i == 0:
                paths = [[[c] for c in cols[b]] for b in range(len(reqs))]
            else:
                paths = [[paths[b][int(parent_beam[b, k])] + [cols[b][k]] for k in range(K)]
                         for b in range(len(reqs))]
            masks, locs = [], []
            for b, r in enumerate(reqs):
                m = torch.zeros(K, T[b] + width, dtype=torch.bool, device=device)
                m[:, :T[b]] = True
                for k in range(K):
                    m[k, [T[b] + c for c in paths[b][k]]] = True
                masks.append(m)
                locs.append(scratch[b][cols[b]])
                self.kv.record_write(r, [T[b] + i] * K, scratch[b][cols[b]],
                                     input_ids[b * K:(b + 1) * K].tolist())
            batch = ForwardBatch(
                input_ids=input_ids, positions=torch.tensor([t + i for t in T for _ in range(K)], device=device),
                req_pool_indices=list(reqs), seq_lens=[t + width for t in T], extend_lens=[K] * len(reqs),
                out_cache_loc=torch.cat(locs), custom_masks=masks)
            return torch.softmax(self.model(batch, self.kv).logits, dim=-1)

        first = torch.stack([self.next_probs[r] for r in reqs])
        tree = draft_tree(first, forward_beams, torch.tensor(root_tokens, device=device),
                          target_seq_lens, K, S, self.num_draft_tokens, self.trace_topk)
        for r, t in zip(reqs, T):  # drafting KV is scratch: keep none of it
            if width:
                self.kv.commit(r, t, width, keep=[])
        return tree

    def release(self, req: int) -> None:
        self.kv.release(req)
        self.next_probs.pop(req, None)

"""STANDALONE: a smaller LM with the target's tokenizer drafts a chain (topk 1) or a tree.

The drafter keeps its own paged KV. Its KV always covers every committed token (the target's
lags one behind: the last bonus token gets its target KV in the next verify), and it keeps the
distribution that follows the last committed token, so a step costs as in SGLang's EAGLE worker:
    DRAFT         num_steps - 1 forwards over the K kept paths (the first level comes from the
                  kept distribution); their KV is scratch, released right after drafting
    DRAFT_EXTEND  one forward over the step's accept_tokens (correct drafts + bonus), which
                  commits their KV and yields the next kept distribution
Scratch KV: drafters/scratch.py.
SGLang runs STANDALONE through its EAGLE worker, which feeds the draft model token t+1 at
position t; a plain LM is indifferent to that shift (RoPE sees only relative positions), so we
keep tokens at their own positions, which reads more simply in the trace.
"""
from __future__ import annotations

import torch

from spectrace.core.batch import ForwardBatch
from spectrace.core.kv import KVCache
from spectrace.core.model import CausalLM
from spectrace.core.drafters.scratch import TreeScratch
from spectrace.core.tree import DraftTree, draft_tree


class StandaloneDrafter:
    algo = "standalone"
    capture_layers: tuple[int, ...] = ()  # reads no target features

    def __init__(self, model: CausalLM, kv: KVCache, num_steps: int, topk: int = 1,
                 num_draft_tokens: int | None = None, trace_topk: int = 5):
        self.model, self.kv, self.trace_topk = model, kv, trace_topk
        self.num_steps, self.topk = num_steps, topk
        self.num_draft_tokens = num_draft_tokens or num_steps + 1
        self.next_probs: dict[int, torch.Tensor] = {}  # req -> (vocab,) draft p(. | committed)
        self.temperature = 1.0  # q = softmax(logits / T); the engine sets T when drafts are sampled

    def _extend(self, items) -> None:
        """Append tokens to each request's draft KV and keep the distribution after the last.
        items: (req, tokens, target features); a standalone LM has no use for the features."""
        batch = ForwardBatch.build(self.kv, [(req, self.kv.seq_lens[req], toks) for req, toks, _ in items])
        logits = self.model(batch, self.kv).logits
        end = 0
        for req, toks, _ in items:
            start = self.kv.seq_lens[req]
            self.kv.commit(req, start, len(toks), list(range(len(toks))))
            end += len(toks)
            self.next_probs[req] = torch.softmax(logits[end - 1] / self.temperature, dim=-1)

    def draft_extend_for_prefill(self, items) -> None:
        """items: (req, prompt + first token, _): the draft reads what the target has committed."""
        self._extend(items)

    def draft_extend(self, items) -> None:
        """items: (req, accept_tokens of this step, _)."""
        self._extend(items)

    def draft(self, reqs: list[int], root_tokens: list[int], target_seq_lens: list[int],
              sampled=None) -> DraftTree:
        # level-0 inputs follow the root, which the draft KV already holds
        scratch = TreeScratch(self.kv, reqs, self.topk, self.num_steps, [self.kv.seq_lens[r] for r in reqs])

        def forward_beams(i, input_ids, parent_beam):
            logits = self.model(scratch.batch(i, input_ids, parent_beam), self.kv).logits
            return torch.softmax(logits / self.temperature, dim=-1)

        first = torch.stack([self.next_probs[r] for r in reqs])
        tree = draft_tree(first, forward_beams, torch.tensor(root_tokens, device=first.device),
                          target_seq_lens, self.topk, self.num_steps, self.num_draft_tokens, self.trace_topk,
                          sampled)
        scratch.release()
        return tree

    def release(self, req: int) -> None:
        self.kv.release(req)
        self.next_probs.pop(req, None)

"""STANDALONE: a smaller LM with the target's tokenizer drafts a chain (topk 1) or a tree.

It runs through the EAGLE worker's skeleton (drafters/eagle_worker.py: ScratchKVDrafter), as
SGLang's StandaloneWorker subclasses EAGLEWorker: its own paged KV always covers every committed
token (the target's lags one behind: the last bonus token gets its target KV in the next verify),
and it keeps the distribution after the last committed token, so a step costs
    DRAFT         num_steps - 1 forwards over the K kept paths, in scratch KV
    DRAFT_EXTEND  one forward over the step's accept_tokens (correct drafts + bonus)
SGLang feeds the draft model token t+1 at position t, as for EAGLE heads; a plain LM is
indifferent to that shift (RoPE sees only relative positions), so we keep tokens at their own
positions, which reads more simply in the trace.
"""
from __future__ import annotations

from spectrace.core.drafters.eagle_worker import ScratchKVDrafter
from spectrace.core.kv import KVCache
from spectrace.core.model import CausalLM


class StandaloneDrafter(ScratchKVDrafter):
    def __init__(self, model: CausalLM, kv: KVCache, num_steps: int, topk: int = 1,
                 num_draft_tokens: int | None = None, temperature: float = 1.0,
                 trace_topk: int = 5):
        super().__init__(kv, num_steps, topk, num_draft_tokens, temperature, trace_topk)
        self.model = model

    def forward(self, batch, hidden_states):  # a draft LM reads tokens only
        return self.model(batch, self.kv).hidden_states

    def compute_logits(self, h):
        return self.model.lm_head(h).float()

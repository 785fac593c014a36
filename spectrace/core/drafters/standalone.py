"""STANDALONE: a smaller LM with the target's tokenizer drafts a chain of `num_steps` tokens.

The drafter keeps its own paged KV. Its KV always covers every committed token (the target's
lags one behind: the last bonus token gets its target KV in the next verify), and it keeps the
distribution that follows the last committed token, so a step costs as in SGLang's EAGLE worker:
    DRAFT         num_steps - 1 one-token forwards (the first draft comes from the kept
                  distribution); their KV is scratch, released right after drafting
    DRAFT_EXTEND  one forward over the step's accept_tokens (correct drafts + bonus), which
                  commits their KV and yields the next kept distribution
SGLang runs STANDALONE through its EAGLE worker, which feeds the draft model token t+1 at
position t; a plain LM is indifferent to that shift (RoPE sees only relative positions), so we
keep tokens at their own positions, which reads more simply in the trace.
"""
from __future__ import annotations

import torch

from spectrace.core.batch import ForwardBatch
from spectrace.core.drafters import DraftProposal
from spectrace.core.kv import KVCache
from spectrace.core.model import CausalLM


class StandaloneDrafter:
    algo = "standalone"

    def __init__(self, model: CausalLM, kv: KVCache, num_steps: int, trace_topk: int = 5):
        self.model, self.kv, self.num_steps, self.trace_topk = model, kv, num_steps, trace_topk
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

    def _pick(self, probs: torch.Tensor):
        top_p, top_i = torch.topk(probs, self.trace_topk)
        token = int(top_i[0])  # the draft's argmax (its tie-breaks cannot change the output)
        return token, float(top_p[0]), [[int(i), round(float(p), 6)] for i, p in zip(top_i, top_p)]

    def draft(self, reqs: list[int]) -> dict[int, DraftProposal]:
        K = self.num_steps
        chains = {r: DraftProposal([], [], [], [], [], []) for r in reqs}
        probs = {r: self.next_probs[r] for r in reqs}
        base = {r: self.kv.seq_lens[r] for r in reqs}  # committed draft KV length T
        for i in range(K):
            for r in reqs:
                token, q, topk = self._pick(probs[r])
                c = chains[r]
                c.tokens.append(token)
                c.parents.append(i - 1)
                c.depths.append(i + 1)
                c.q.append(q)
                c.scores.append((c.scores[-1] if c.scores else 1.0) * q)
                c.draft_topk.append(topk)
            if i == K - 1:
                break  # the last draft needs no forward of its own
            # draft i+1 at position T+i, KV in scratch slots
            batch = ForwardBatch.build(self.kv, [(r, base[r] + i, [chains[r].tokens[i]]) for r in reqs])
            logits = self.model(batch, self.kv).logits
            for j, r in enumerate(reqs):
                probs[r] = torch.softmax(logits[j], dim=-1)
        if K > 1:
            for r in reqs:  # drafting KV is scratch: keep none of it
                self.kv.commit(r, base[r], K - 1, keep=[])
        return chains

    def release(self, req: int) -> None:
        self.kv.release(req)
        self.next_probs.pop(req, None)

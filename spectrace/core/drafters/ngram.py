"""The n-gram drafter, vLLM style (--algo ngram): each request's chain is copied from an earlier
occurrence of its context's suffix (spectrace/core/ngram/lookup.py). No model, no KV; the
context is the prompt and every committed token. A request with no match drafts nothing and
its step is a plain decode, as vLLM skips requests whose proposer returned None.
"""
from __future__ import annotations

from spectrace.core.ngram.lookup import propose_first_match, propose_longest_match
from spectrace.core.tree import DraftTree, chain_tree

MATCHES = {"first": propose_first_match, "longest": propose_longest_match}  # v0.8.5, current vLLM


class NgramDrafter:
    kv = None  # no draft model, no draft KV
    capture_layers = ()

    def __init__(self, k: int, min_n: int, max_n: int, match: str, max_model_len: int, device="cpu"):
        self.k, self.min_n, self.max_n, self.max_model_len = k, min_n, max_n, max_model_len
        self.propose = MATCHES[match]
        self.device = device
        self.temperature = 1.0  # unused: copied drafts have no q
        self.context: dict[int, list[int]] = {}

    def draft_extend_for_prefill(self, items) -> None:
        """items: (req, prompt + first token, target features (unused))."""
        for req, toks, _ in items:
            self.context[req] = list(toks)

    def draft_extend(self, items) -> None:
        """items: (req, accept_tokens, target features (unused)): the committed tokens."""
        for req, toks, _ in items:
            self.context[req] += list(toks)

    def draft(self, reqs: list[int], root_tokens: list[int], target_seq_lens: list[int], sampled=None) -> DraftTree:
        proposals, sources = [], []
        for req in reqs:
            ctx = self.context[req]
            m = self.propose(ctx, self.min_n, self.max_n, self.k, self.max_model_len)
            proposals.append(m.tokens if m else [])
            # the trace shows the suffix that matched and where its earlier occurrence sits
            sources.append({"kind": "ngram", "n": m.n, "match_start": m.start - m.n, "context_len": len(ctx),
                            "matched": ctx[m.start - m.n:m.start]} if m else None)
        return chain_tree(proposals, root_tokens, target_seq_lens, sources, self.device)

    def release(self, req: int) -> None:
        self.context.pop(req, None)

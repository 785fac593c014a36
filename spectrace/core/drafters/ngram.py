"""The n-gram drafters (--algo ngram). No model, no KV; a request's context is its prompt and
every committed token.

    NgramDrafter      vLLM (default): each request's chain is copied from an earlier occurrence
                      of its context's suffix (spectrace/core/ngram/lookup.py). A request with no
                      match drafts nothing and its step is a plain decode, as vLLM skips requests
                      whose proposer returned None.
    TrieNgramDrafter  SGLang (--ngram-style sglang): a trie of recent windows shared by all
                      requests proposes a tree of num_draft_tokens nodes
                      (spectrace/core/ngram/trie.py),
                      verified like an EAGLE tree; with no match it is the root and padding.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spectrace.core.ngram.lookup import propose_first_match, propose_longest_match
from spectrace.core.ngram.trie import NgramTrie, TrieConfig
from spectrace.core.tree import DraftTree, chain_tree, reconstruct_indices_from_tree_mask
from spectrace.errors import SpectraceError

MATCHES = {"first": propose_first_match, "longest": propose_longest_match}  # v0.8.5, current vLLM


@dataclass(frozen=True)
class NgramConfig:
    """The n-gram drafters' options: vLLM's prompt lookup (style vllm, the default) or SGLang's
    trie (style sglang)."""

    style: str = "vllm"
    prompt_lookup_min: int = 5  # vLLM's defaults when neither is given
    prompt_lookup_max: int = 5
    match: str = "first"  # first: v0.8.5's proposer; longest: current vLLM's
    trie: TrieConfig = field(default_factory=TrieConfig)

    def __post_init__(self):
        """vLLM's rules: 1 <= min <= max. (SGLang's trie checks its own, TrieConfig.)"""
        if self.style not in ("vllm", "sglang"):
            raise SpectraceError(f"unknown --ngram-style {self.style!r} (choose from vllm, sglang)")
        if self.style == "sglang":
            return
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo < 1 or hi < lo:
            raise SpectraceError(f"--prompt-lookup-min {lo} and "
                                 f"--prompt-lookup-max {hi}: need 1 <= min <= max")
        if self.match not in MATCHES:
            raise SpectraceError(f"unknown --ngram-match {self.match!r} "
                                 f"(choose from first, longest)")

    def drafter(self, num_steps: int, num_draft_tokens: int, max_model_len: int, device):
        if self.style == "sglang":
            return TrieNgramDrafter(num_draft_tokens, self.trie, device)
        return NgramDrafter(num_steps, self.prompt_lookup_min, self.prompt_lookup_max, self.match,
                            max_model_len, device)


class NgramDrafter:
    kv = None  # no draft model, no draft KV
    capture_layers = ()

    def __init__(self, k: int, min_n: int, max_n: int, match: str, max_model_len: int,
                 device="cpu"):
        self.k, self.min_n, self.max_n, self.max_model_len = k, min_n, max_n, max_model_len
        self.propose = MATCHES[match]
        self.device = device
        self.context: dict[int, list[int]] = {}

    def draft_extend_for_prefill(self, items) -> None:
        """items: (req, prompt + first token, target features (unused))."""
        for req, toks, _ in items:
            self.context[req] = list(toks)

    def draft_extend(self, items) -> None:
        """items: (req, accept_tokens, target features (unused)): the committed tokens."""
        for req, toks, _ in items:
            self.context[req] += list(toks)

    def draft(self, reqs: list[int], root_tokens: list[int], seq_lens: list[int],
              sampled=None) -> DraftTree:
        proposals, sources = [], []
        for req in reqs:
            ctx = self.context[req]
            m = self.propose(ctx, self.min_n, self.max_n, self.k, self.max_model_len)
            proposals.append(m.tokens if m else [])
            # the trace shows the suffix that matched and where its earlier occurrence sits
            sources.append({"kind": "ngram", "n": m.n, "match_start": m.start - m.n,
                            "context_len": len(ctx),
                            "matched": ctx[m.start - m.n:m.start]} if m else None)
        return chain_tree(proposals, root_tokens, seq_lens, proposers=sources, device=self.device)

    def release(self, req: int) -> None:
        self.context.pop(req, None)


class TrieNgramDrafter:
    kv = None
    capture_layers = ()

    def __init__(self, num_draft_tokens: int, config: TrieConfig, device="cpu"):
        self.trie = NgramTrie(config)
        self.num_draft_tokens, self.device = num_draft_tokens, device
        self.context: dict[int, list[int]] = {}

    def _put(self, req: int) -> None:
        """SGLang's `_update_ngram_cache`: the last branch_length tokens of prompt + output."""
        self.trie.insert(self.context[req][-self.trie.config.branch_length:])

    def draft_extend_for_prefill(self, items) -> None:
        for req, toks, _ in items:
            self.context[req] = list(toks)
            self._put(req)

    def draft_extend(self, items) -> None:
        for req, toks, _ in items:
            self.context[req] += list(toks)
            self._put(req)

    def draft(self, reqs: list[int], root_tokens: list[int], seq_lens: list[int],
              sampled=None) -> DraftTree:
        n = self.num_draft_tokens
        masks = torch.zeros(len(reqs), n, n, dtype=torch.bool)
        tokens, sources = [], []
        for b, req in enumerate(reqs):
            ctx = self.context[req]
            prop = self.trie.propose(ctx, n)
            for row, parent in enumerate(prop.parents):  # the root, the parent's ancestors, itself
                if parent >= 0:
                    masks[b, row] = masks[b, parent]
                masks[b, row, row] = masks[b, row, 0] = True
            tokens.append(prop.tokens)
            w = prop.anchors[0] if prop.anchors else 0
            sources.append({"kind": "ngram_trie", "match_type": self.trie.config.match_type,
                            "anchors": prop.anchors, "matched": ctx[len(ctx) - w:] if w else [],
                            "from_trie": prop.real - 1, "padding": n - prop.real,
                            "trie_nodes": self.trie.size})
        positions, ri, rnt, rns = reconstruct_indices_from_tree_mask(masks.reshape(-1), seq_lens, n)
        ones = torch.ones(len(reqs), n - 1)
        return DraftTree(
            draft_tokens=torch.tensor(tokens, device=self.device), tree_mask=masks.to(self.device),
            positions=positions.view(len(reqs), n).to(self.device), retrive_index=ri,
            retrive_next_token=rnt, retrive_next_sibling=rns, q=ones, scores=ones,
            draft_topk=[[[[t, 1.0]] for t in tk[1:]] for tk in tokens], proposers=sources)

    def release(self, req: int) -> None:
        self.context.pop(req, None)  # the trie keeps what it learnt: it serves every request

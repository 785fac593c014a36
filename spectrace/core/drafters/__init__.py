"""Drafters propose a draft tree (a chain is a tree of topk 1) for the target to verify.

Each lives in its own module; the engine sees only this interface. SGLang's EAGLE worker names
the phases: DRAFT is `draft`, DRAFT_EXTEND is `forward_draft_extend` (after prefill) and
`forward_draft_extend_after_decode` (after each verify).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

import torch

from spectrace.core.kv import KVCache
from spectrace.core.tree import DraftTree

# what DRAFT_EXTEND hands a drafter, per request: (req_pool_idx, tokens, target features (len, F))
ExtendItem = tuple[int, list[int], torch.Tensor]


@dataclass
class SampledDrafts:
    """What DRAFT asks for under the lossless sampling rules: drafts sampled from q (each
    request's generator) instead of the draft's top K, and q kept (DraftTree.draft_probs)."""

    generators: list  # one torch.Generator per request
    # (bs, K): what a node's j-th draw is worth; needed when K > 1
    sibling_worth: torch.Tensor | None = None
    # the fast engine: each level's Exp(1) noise (bs * paths, V), drawn ahead on the host from the
    # same generators in the same order, in place of drawing it here
    noise: Iterator[torch.Tensor] | None = None


class Drafter(Protocol):
    kv: KVCache | None  # the drafter's own paged KV (the engine files its events), or None
    # target layers whose inputs the features are; () = last hidden state
    capture_layers: tuple[int, ...]

    def draft_extend_for_prefill(self, items: list[ExtendItem]) -> None:
        """After prefill: tokens = prompt + the first generated token; features of the prompt
        rows."""

    def draft(self, reqs: list[int], root_tokens: list[int], seq_lens: list[int],
              sampled: SampledDrafts | None = None) -> DraftTree:
        """DRAFT for every request: a tree rooted at its last committed token, whose nodes sit after
        the target's committed KV (seq_lens, root excluded). sampled: `SampledDrafts` when the
        rule needs drafts sampled from q (drafters that cannot sample are refused before the
        run)."""

    def draft_extend(self, items: list[ExtendItem]) -> None:
        """After a verify: tokens = the step's accept_tokens; features of the accepted path's rows
        (root .. last correct draft)."""

    def release(self, req: int) -> None:
        """A finished request: forget it, return its KV."""

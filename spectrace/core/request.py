"""A request and its part of one step, as both engines carry them: `Request` (its prompt, its
output so far, why it finished, its own random numbers), `append_tokens` (a step's tokens
committed up to EOS or max_new_tokens) and `StepRow` (what each phase of core/engine.py's step
reads and leaves for the next, and what a step record is made from)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spectrace.core.acceptance import AcceptResult


@dataclass
class Request:
    req_pool_idx: int  # its row in req_to_token (SGLang's name)
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "eos" or "length"
    gen: torch.Generator | None = None  # this request's random numbers (sampling only)


def append_tokens(r: Request, tokens: list[int], eos: set[int], max_new_tokens: int) -> list[int]:
    """Commit tokens to a request's output until EOS or max_new_tokens; returns what entered."""
    entered = []
    for t in tokens:
        r.output_ids.append(t)
        entered.append(t)
        if t in eos:
            r.finish_reason = "eos"
        elif len(r.output_ids) >= max_new_tokens:
            r.finish_reason = "length"
        if r.finish_reason:
            break
    return entered


@dataclass
class StepRow:
    """One request's part of one step: what each phase reads and leaves for the next."""

    req: Request
    seq_len: int  # the target's KV before the step: committed tokens but the root
    draft_seq_len: int | None  # the drafter's KV before the step (None: it keeps none)
    tail_before: dict | None  # the last entries of req_to_token before the step, for the trace
    b: int = 0  # this request's index in the step's DraftTree
    drafted: bool = False  # the drafter proposed something (n-gram may not)
    candidates: list[int] = field(default_factory=list)  # (n,) node tokens, root first
    positions: list[int] = field(default_factory=list)  # (n,) RoPE positions: seq_len + depth
    first_row: int = 0  # this request's first row in the forward batch
    # (n,) the target's argmax after each node
    target_predict: list[int] = field(default_factory=list)
    target_probs: torch.Tensor | None = None  # (n, V) p after each node, on the CPU
    # or what a record keeps of it, reduced on the device (the fast engine's greedy steps):
    target_topk: list | None = None  # (n, trace_topk) [token, p] pairs after each node
    p_tokens: list | None = None  # (n, n) p after node r of node j's token
    result: AcceptResult | None = None
    committed: list[int] = field(default_factory=list)  # accept_tokens up to EOS or max_new_tokens
    # this step's KV events, tagged with their phase
    events: list[dict] = field(default_factory=list)

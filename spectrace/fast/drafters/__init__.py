"""The fast engine's drafters (core/drafters/), one file each, with the batch on the device.

Each takes the whole bucket at once and returns a DeviceTree; everything it keeps between steps
lives in buffers allocated once, so DRAFT and EXTEND replay from CUDA graphs. The engine sees
only this interface; spectrace/engines.py builds the drafter of a run's checkpoint format.

    eagle_worker.py   EAGLE, EAGLE-3, NEXTN/MTP heads and the standalone draft LM: the draft loop
                      over a draft KV of their own (SGLang's EAGLE worker)
    frozen_kv_mtp.py  the MTP assistant that reads the target's KV, through the same draft loop
    medusa.py         the heads over a static tree
    dflash.py         one non-causal block over per-layer context buffers
    ngram.py          drafted on the host by the explicit drafters, verified on the device
"""
from __future__ import annotations

from typing import Protocol

import torch

from spectrace.fast.acceptance import Verdict
from spectrace.fast.kv import StaticKV
from spectrace.fast.sampling import DeviceRandoms
from spectrace.fast.tree import DeviceTree


class FastDrafter(Protocol):
    kv: StaticKV | None  # a draft KV of its own (the trace shows its lengths), or None
    # target layers whose inputs are the features; () = last hidden state
    capture_layers: tuple[int, ...]
    # DRAFT runs on the host before the step's graphs (n-gram: host_prefill, host_draft and
    drafts_on_host: bool
    #                host_extend over the requests' histories; `sizes`, `tree` and `index` say what
    # it drafted)
    # drafts sampled from q (the lossless sampling rules), each level reading randoms' race noise
    samples_drafts: bool

    def reset(self) -> None:
        """Before a run (and after the CUDA-graph captures, which write into the buffers)."""

    def prefill(self, prompt_ids: torch.Tensor, prompt_lens: torch.Tensor, roots: torch.Tensor,
                features: torch.Tensor) -> None:
        """After the target's prefill (SGLang's forward_draft_extend): prompt_ids (bs, L) padded,
        prompt_lens (bs,), roots (bs,) the first generated tokens, features (bs * L, F) the
        target's features at every prompt row (captured layers, or the last hidden state)."""

    def draft(self, roots: torch.Tensor, seq_lens: torch.Tensor, num_steps: int,
              num_draft_tokens: int, randoms: DeviceRandoms) -> DeviceTree:
        """DRAFT: every request's tree of num_draft_tokens nodes rooted at roots (bs,), after the
        target's committed KV (seq_lens); sampled drafts read randoms' race noise."""

    def draft_extend(self, tree: DeviceTree, verdict: Verdict, features: torch.Tensor,
                     live: torch.Tensor) -> None:
        """EXTEND (DRAFT_EXTEND): each live request's accept_tokens with the target's features
        (bs * n, F) at the accepted path's rows; a frozen row keeps its state."""

"""Forward batches with their attention metadata computed on the device (core/batch.py:
ForwardBatch.build and kernels/backend.py's host-side metadata, here from the step's tensors), so
a CUDA graph replays them without the host. Three layouts:

    extend_batch    `width` new tokens after each request's committed KV, causal or under a
                    QLEN_ONLY tree mask (prefill, verify, draft extend): extend_attention_fwd
                    reads each request's prefix straight from its req_to_token row
    scratch_batch   one level of the draft loop: each kept path is its own sequence, the
                    committed draft KV then its path's scratch columns (drafters/scratch.py's
                    [topk][step] layout), read by decode_attention_fwd from req_to_token; every
                    level's positions and slots come from scratch_slots, once a step
`decode_rows_batch` is --deterministic's verify: every node a one-token decode of its own.
`PromptBuffers` holds the prefill's inputs: every prompt padded to the longest, and their lengths.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from spectrace.core.batch import ForwardBatch


@functools.cache
def ramp(n: int, step: int, device: torch.device) -> torch.Tensor:
    """arange(n) * step on the device, made once: the index vectors every forward reads (a CUDA
    graph's warm-up makes them, so its replays launch no kernel for them)."""
    return torch.arange(n, device=device) * step


def extend_batch(kv, input_ids, positions, width: int, tree_mask=None) -> ForwardBatch:
    """A forward adding `width` tokens to every request after its seq_lens: tree_mask (bs, width,
    width) for a verify (QLEN_ONLY: every prefix column is visible), else causal. Shapes are fixed
    by (bs, width); the metadata costs two kernels (the new tokens' slots)."""
    bs, device = kv.seq_lens.shape[0], kv.seq_lens.device
    meta = dict(qo_indptr=ramp(bs + 1, width, device), kv_indptr=None, kv_indices=None,
                custom_mask=None, mask_indptr=None, max_len_extend=width,
                req_to_token=kv.req_to_token, prefix_lens=kv.seq_lens)
    if tree_mask is not None:
        meta.update(custom_mask=tree_mask.flatten(),
                    mask_indptr=ramp(bs + 1, width * width, device), qlen_mask=True)
    slots = kv.req_to_token.gather(1, kv.seq_lens[:, None] + ramp(width, 1, device))
    return ForwardBatch(input_ids=input_ids, positions=positions, req_pool_indices=list(range(bs)),
                        seq_lens=[], extend_lens=[width] * bs, out_cache_loc=slots.flatten(),
                        custom_masks=[], attn_metadata={"extend": meta})


@functools.cache
def _scratch_grid(num_steps: int, topk: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_steps, 1, K) each: the level of path k's node at level i, and the scratch column it
    writes."""
    level = torch.arange(num_steps, device=device).view(-1, 1, 1).expand(-1, 1, topk).contiguous()
    return level, level + torch.arange(topk, device=device) * (num_steps - 1)


def scratch_slots(kv, num_steps: int, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where every level of one step's draft loop writes, known before the loop (the kept paths
    change which columns a level reads, never the one it writes): level i's path k is at position
    T + i and writes scratch column k * (num_steps - 1) + i after the committed draft KV T
    (drafters/scratch.py). -> positions, out_cache_loc (num_steps, bs * K): four kernels a step."""
    bs = kv.seq_lens.shape[0]
    level, column = _scratch_grid(num_steps, topk, kv.seq_lens.device)
    T = kv.seq_lens.view(1, bs, 1)
    rows = (kv.seq_lens + ramp(bs, kv.req_to_token.stride(0), kv.seq_lens.device)).view(1, bs, 1)
    slots = kv.req_to_token.view(-1)[rows + column]
    return (T + level).view(num_steps, bs * topk), slots.view(num_steps, bs * topk)


def scratch_batch(kv, input_ids, positions, out_cache_loc, paths: torch.Tensor) -> ForwardBatch:
    """One level of the draft loop over K kept paths per request: paths (bs, K, level + 1) the
    scratch columns of each path's nodes, its own last, at `positions`, writing `out_cache_loc`
    (a row of scratch_slots). The attention kernel reads the committed draft KV, then the path's
    columns, through req_to_token (decode_attention_fwd's rows form): no metadata to build."""
    bs, K = paths.shape[:2]
    meta = dict(req_to_token=kv.req_to_token, prefix_lens=kv.seq_lens, paths=paths)
    return ForwardBatch(input_ids=input_ids, positions=positions, req_pool_indices=[], seq_lens=[],
                        extend_lens=[K] * bs, custom_masks=[], attn_metadata={"branch": meta},
                        out_cache_loc=out_cache_loc)


def decode_rows_batch(kv, tree, invariant: bool) -> ForwardBatch:
    """--deterministic's verify, and plain decoding's: every node of the (bs, w) trees a one-token
    decode of its own, over its request's committed KV, then its ancestors and itself in index
    order (the columns its tree_mask row shows; parents come first), as one logical sequence in
    the tiles and the fixed KV splits a one-token decode over the same keys reads
    (decode_attention_fwd's path_lens). With invariant (the fused forward's fixed-tile matmuls,
    kernels/matmul.py) every row's numbers are the ones an autoregressive decode of its token
    computes, so bf16 greedy speculative output equals bf16 greedy plain decoding: core/model.py's
    batch_invariant in one batched forward, where the explicit engine makes one pass a row."""
    bs, w = tree.draft_tokens.shape
    device = kv.seq_lens.device
    shown = (torch.ones(bs, 1, 1, dtype=torch.bool, device=device) if tree.tree_mask is None
             else tree.tree_mask)
    # (bs, w, w): the shown nodes first
    paths = torch.argsort((~shown).to(torch.int8), dim=-1, stable=True)
    # fixed: a row's tiles and splits depend on its keys alone
    splits = 4 if device.type == "cuda" else 1
    meta = dict(req_to_token=kv.req_to_token, prefix_lens=kv.seq_lens, paths=paths,
                path_lens=shown.sum(-1), num_kv_splits=splits)
    slots = kv.req_to_token.gather(1, kv.seq_lens[:, None] + ramp(w, 1, device))
    return ForwardBatch(input_ids=tree.draft_tokens.flatten(), positions=tree.positions.flatten(),
                        req_pool_indices=[], seq_lens=[], extend_lens=[w] * bs,
                        out_cache_loc=slots.flatten(), custom_masks=[],
                        attn_metadata={"branch": meta}, batch_invariant=invariant)


@dataclass
class PromptBuffers:
    """The prefill's static inputs, (bs, L) prompt ids and (bs,) their lengths, and once captured
    the
    prefill graph that reads them."""

    ids: torch.Tensor
    lens: torch.Tensor
    graph: torch.cuda.CUDAGraph | None = None

    @classmethod
    def empty(cls, bs: int, L: int, device) -> "PromptBuffers":
        """Buffers for prompts of up to L tokens (every prompt is padded to the longest)."""
        return cls(torch.zeros(bs, L, dtype=torch.int64, device=device),
                   torch.ones(bs, dtype=torch.int64, device=device))

    def fill(self, reqs) -> None:
        """Each prompt padded with 0s; the bucket's spare rows are one token (the first prompt's
        first)."""
        bs, L = self.ids.shape
        ids = [r.prompt_ids + [0] * (L - len(r.prompt_ids)) for r in reqs]
        ids += [[reqs[0].prompt_ids[0]] + [0] * (L - 1)] * (bs - len(reqs))
        self.ids.copy_(torch.tensor(ids))
        self.lens.copy_(torch.tensor([len(r.prompt_ids) for r in reqs] + [1] * (bs - len(reqs))))


def features(out) -> torch.Tensor:
    """What drafters read of a target forward: the captured layers' inputs, or the last hidden
    state."""
    return torch.cat(out.aux_hidden_states, dim=-1) if out.aux_hidden_states else out.hidden_states

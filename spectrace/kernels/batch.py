"""The attention metadata of a forward batch on the device, as SGLang's Triton backend builds it:
each request's prefix slots gathered into one `kv_indices` (and `kv_indptr`), and the tree masks
packed into `custom_mask` / `mask_indptr` for kernels/attention.py: extend_attention_fwd.

Explicit counterpart: core/batch.py: ForwardBatch.build, which gathers the same slots on the host.
The fast engine builds neither: its attention reads req_to_token rows itself (fast/batch.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.kernels import check

__all__ = ["create_kv_indices", "pack_custom_mask"]


@triton.jit
def _kv_indices_kernel(req_to_token, req_pool_indices, paged_kernel_lens, kv_indptr, kv_start_idx, kv_indices,
                       req_to_token_stride, HAS_START: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)  # one program per request: copy its row of req_to_token
    req = tl.load(req_pool_indices + b)
    start = 0
    if HAS_START:
        start = tl.load(kv_start_idx + b)
    length = tl.load(paged_kernel_lens + b)
    out = kv_indices + tl.load(kv_indptr + b)
    for i in range(0, length, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        slot = tl.load(req_to_token + req * req_to_token_stride + start + offs, mask=offs < length)
        tl.store(out + offs, slot, mask=offs < length)


def create_kv_indices(req_to_token, req_pool_indices, paged_kernel_lens, kv_indptr, kv_start_idx, kv_indices) -> None:
    """SGLang's create_flashinfer_kv_indices_triton: request b's slots
    req_to_token[req_pool_indices[b], start : start + paged_kernel_lens[b]] into
    kv_indices[kv_indptr[b]:], start = kv_start_idx[b] (0 when None). The explicit path's
    `kv.req_to_token[req, :seq_len]` gather, for the whole batch in one launch."""
    device = req_to_token.device
    check("req_to_token", req_to_token, (torch.int32, torch.int64), (None, None), device)
    bs = req_pool_indices.shape[0]
    for name, t in [("req_pool_indices", req_pool_indices), ("paged_kernel_lens", paged_kernel_lens)] + (
            [("kv_start_idx", kv_start_idx)] if kv_start_idx is not None else []):
        check(name, t, (torch.int32, torch.int64), (bs,), device)
    check("kv_indptr", kv_indptr, (torch.int32, torch.int64), (bs + 1,), device)
    check("kv_indices", kv_indices, req_to_token.dtype, (None,), device)
    _kv_indices_kernel[(bs,)](req_to_token, req_pool_indices, paged_kernel_lens, kv_indptr,
                              kv_start_idx if kv_start_idx is not None else kv_indptr, kv_indices,
                              req_to_token.stride(0), HAS_START=kv_start_idx is not None, BLOCK=512)


def pack_custom_mask(masks: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's per-request masks (extend_len, seq_len) bool -> (custom_mask, mask_indptr):
    the rows flattened and concatenated, and where each request's rows start (bs + 1 entries).
    This is the layout build_tree writes directly in FULL_MASK mode, so a verify pass packs nothing."""
    device = masks[0].device
    sizes = torch.tensor([0] + [m.numel() for m in masks], dtype=torch.int64, device=device)
    return torch.cat([m.flatten() for m in masks]), sizes.cumsum(0)

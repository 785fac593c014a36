"""Triton twins of the paged KV bookkeeping (`core/kv.py`), with SGLang's kernel names and signatures:

    assign_req_to_token_pool   KVCache.assign: map a request's positions to slots
    fill_accept_out_cache_loc  KVCache.accepted_slots: the slots of the accepted rows, compacted
    move_kv_cache              TokenToKVPool.move: a vLLM-style commit copies the kept rows' K and V
                               down onto the next positions, every layer

One program per request (or per accept_index entry, or per layer); a request's offset into the
packed out_cache_loc is summed inside its program over the requests before it, SGLang's trick,
so no host cumsum and no `.item()`. `TritonKVCache` is a KVCache whose tensor operations are
these twins; allocation, commit decisions and the trace's events stay the explicit code.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from spectrace.core.kv import KVCache, TokenToKVPool
from spectrace.kernels import check

__all__ = ["assign_req_to_token_pool", "fill_accept_out_cache_loc", "move_kv_cache", "TritonKVCache"]

INDEX = (torch.int32, torch.int64)


@triton.jit
def _assign_req_to_token_pool_kernel(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                     pool_len, bs_upper: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    before = tl.arange(0, bs_upper) < b
    lens = (tl.load(end_offset + tl.arange(0, bs_upper), mask=before, other=0)
            - tl.load(start_offset + tl.arange(0, bs_upper), mask=before, other=0))
    out_offset = tl.sum(lens)  # where request b's slots start in out_cache_loc: sum over j < b of end - start
    req = tl.load(req_pool_indices + b)
    start = tl.load(start_offset + b)
    n = tl.load(end_offset + b) - start
    for i in range(0, n, BLOCK):  # req_to_token[req, start:end] = out_cache_loc[out_offset:out_offset + n]
        offs = i + tl.arange(0, BLOCK)
        slot = tl.load(out_cache_loc + out_offset + offs, mask=offs < n)
        tl.store(req_to_token + req * pool_len + start + offs, slot, mask=offs < n)


def assign_req_to_token_pool(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc) -> None:
    """req_to_token[req_pool_indices[b], start_offset[b]:end_offset[b]] = request b's run of the packed
    out_cache_loc, for every b, in place."""
    device, bs = req_to_token.device, req_pool_indices.shape[0]
    check("req_to_token", req_to_token, INDEX, (None, None), device)
    for name, t in (("req_pool_indices", req_pool_indices), ("start_offset", start_offset),
                    ("end_offset", end_offset)):
        check(name, t, INDEX, (bs,), device)
    check("out_cache_loc", out_cache_loc, INDEX, (None,), device)
    _assign_req_to_token_pool_kernel[(bs,)](req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                            req_to_token.shape[1], bs_upper=triton.next_power_of_2(bs), BLOCK=32)


@triton.jit
def _fill_accept_out_cache_loc_kernel(accept_index, out_cache_loc, accept_out_cache_loc, size_upper: tl.constexpr):
    pid = tl.program_id(0)  # one program per accept_index entry
    lanes = tl.arange(0, size_upper)
    earlier = tl.load(accept_index + lanes, mask=lanes < pid, other=-1)
    dst = tl.sum((earlier != -1).to(tl.int32))  # valid entries before this one: where it lands
    row = tl.load(accept_index + pid)
    if row != -1:
        tl.store(accept_out_cache_loc + dst, tl.load(out_cache_loc + row))


def fill_accept_out_cache_loc(accept_index, out_cache_loc, accept_out_cache_loc) -> None:
    """accept_out_cache_loc[:k] = out_cache_loc[the k entries of accept_index that are not -1],
    in order: the kept rows' slots, compacted, in place."""
    device = out_cache_loc.device
    check("accept_index", accept_index, INDEX, None, device)
    check("out_cache_loc", out_cache_loc, INDEX, (None,), device)
    check("accept_out_cache_loc", accept_out_cache_loc, out_cache_loc.dtype, (None,), device)
    size = accept_index.numel()
    if size:
        _fill_accept_out_cache_loc_kernel[(size,)](accept_index, out_cache_loc, accept_out_cache_loc,
                                                   size_upper=triton.next_power_of_2(size))


@triton.jit
def _move_kv_cache_kernel(k, v, tgt_loc, src_loc, num_locs, layer_stride, row: tl.constexpr, BLOCK: tl.constexpr):
    layer = tl.program_id(0)  # one program per layer, K and V alike
    # in order, one location at a time, as SGLang's copy_all_layer_kv_cache (not parallel over
    # locations: the copy is in place). TokenToKVPool.move reads every source first; walking forward
    # gives the same because tgt[i] = slots[i] and src[i] = slots[keep[i]] with keep increasing, so a
    # target is only ever the source of a location at or before it, already read.
    for i in range(num_locs):
        src = layer * layer_stride + tl.load(src_loc + i) * row
        tgt = layer * layer_stride + tl.load(tgt_loc + i) * row
        for j in range(0, row, BLOCK):
            offs = j + tl.arange(0, BLOCK)
            tl.store(k + tgt + offs, tl.load(k + src + offs, mask=offs < row), mask=offs < row)
            tl.store(v + tgt + offs, tl.load(v + src + offs, mask=offs < row), mask=offs < row)


def move_kv_cache(k, v, tgt_loc, src_loc) -> None:
    """k, v (num_layers, num_slots, num_kv_heads, head_dim): every layer's rows src_loc[i] into
    rows tgt_loc[i], in place. As in the explicit commit, tgt_loc[i] is the i-th kept position's
    slot and src_loc[i] the slot of a row at or after it."""
    device = k.device
    check("k", k, None, (None, None, None, None), device)
    check("v", v, k.dtype, tuple(k.shape), device)
    check("tgt_loc", tgt_loc, INDEX, (None,), device)
    check("src_loc", src_loc, INDEX, tuple(tgt_loc.shape), device)
    row = k.shape[2] * k.shape[3]
    _move_kv_cache_kernel[(k.shape[0],)](k, v, tgt_loc, src_loc, tgt_loc.shape[0], k.stride(0), row=row,
                                         BLOCK=min(1024, triton.next_power_of_2(row)))


class TritonKVPool(TokenToKVPool):
    def move(self, src: list[int], dst: list[int]) -> None:
        index = torch.tensor([dst, src], dtype=torch.int64, device=self.k.device)
        move_kv_cache(self.k, self.v, index[0], index[1])


class TritonKVCache(KVCache):
    """The explicit KVCache with its req_to_token writes, accepted-slot gathers and KV moves run by
    the twins (one request per call, as the engine commits them)."""

    pool_class = TritonKVPool
    backend = "triton"  # and so attention, tree build and walks go through the twins (kernels/backend.py)

    def assign(self, req: int, start: int, slots: list[int]) -> None:
        device = self.req_to_token.device
        offsets = torch.tensor([req, start, start + len(slots)], dtype=torch.int64, device=device)
        assign_req_to_token_pool(offsets[0:1], self.req_to_token, offsets[1:2], offsets[2:3],
                                 torch.tensor(slots, dtype=torch.int64, device=device))

    def accepted_slots(self, slots: list[int], keep: list[int]) -> list[int]:
        device = self.req_to_token.device
        out = torch.empty(len(keep), dtype=torch.int64, device=device)
        fill_accept_out_cache_loc(torch.tensor(keep, dtype=torch.int64, device=device),
                                  torch.tensor(slots, dtype=torch.int64, device=device), out)
        return out.tolist()

"""`spectrace bench --target-shape NAME --profile`: a plain decode forward, a verify and an EAGLE-3
draft level at a real model's shape against the memory roofline, kernel group by kernel group.

At batch 1 a Llama-3.1-8B decode reads 15 GB of weight matrices (the embedding table only one row
at a time) for 7.5 G multiply-adds: the time is the bytes over the memory's bandwidth (4.5 ms at
an H100's 3.35 TB/s), and every microsecond spent elsewhere is a microsecond off the roofline.
The forward is replayed from its CUDA graph (as the fast engine runs it) under torch.profiler;
each kernel is put in a group by its name, and a group that streams known bytes gets its rate:

    linear       the GEMVs and rows_linear (kernels/gemv.py) or cuBLAS's GEMMs: every weight matrix once
    attention    the decode attention and its split merge (kernels/attention.py): the KV once
    norm, rope + KV write, silu_mul, other (the embedding, the RoPE table lookup, the logits' cast)
    gaps         the graph's span where no kernel runs
    span         the forward, first kernel's start to last kernel's end: all its bytes over it

With programmatic dependent launch (kernels/pdl.py) a kernel starts before the one ahead of it
ends and waits: kernels overlap, a group's time counts its kernels' waits too, and the span is the
number to read; SPECTRACE_PDL=0 gives each kernel's own time.
"""
from __future__ import annotations

import torch
import torch.nn as nn

GROUPS = (("linear", ("gemv", "rows_kernel", "gemm", "nvjet", "splitk", "cutlass", "xmma")),
          ("attention", ("_fwd_kernel", "merge_splits")), ("norm", ("rms_norm",)),
          ("rope + KV write", ("split_rope",)), ("silu_mul", ("silu_mul",)))


def group_of(kernel: str) -> str:
    name = kernel.lower()
    return next((group for group, keys in GROUPS if any(k in name for k in keys)), "other")


def roofline_rows(kernels: list[tuple[str, float, float]], streamed: dict[str, int]) -> list[dict]:
    """kernels: (name, start µs, end µs) of one forward; streamed: the bytes a group must read
    -> a row a group (kernels, µs, bytes, TB/s), then "gaps" and "span"."""
    rows: dict[str, dict] = {}
    for name, start, end in kernels:
        row = rows.setdefault(group_of(name), {"kernels": 0, "us": 0.0})
        row["kernels"] += 1
        row["us"] += end - start
    out = [{"group": g, **r, "bytes": streamed.get(g), "tb_s": streamed[g] / r["us"] / 1e6 if g in streamed else None}
           for g, r in sorted(rows.items(), key=lambda item: -item[1]["us"])]
    busy, reach = 0.0, float("-inf")  # the union of the kernels' spans
    for _, start, end in sorted(kernels, key=lambda k: k[1]):
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    span = max(e for _, _, e in kernels) - min(s for _, s, _ in kernels) if kernels else 0.0
    total = sum(streamed.values())
    return out + [{"group": "gaps", "kernels": None, "us": span - busy, "bytes": None, "tb_s": None},
                  {"group": "span", "kernels": len(kernels), "us": span, "bytes": total,
                   "tb_s": total / span / 1e6 if span else None}]


def streamed_bytes(model: nn.Module, bs: int, kv_len: int, unread: tuple[nn.Module, ...] = ()) -> dict[str, int]:
    """What a forward of bs requests after kv_len cached tokens each must read: every linear
    layer's weight (lm_head too, tied or not) but the `unread` ones (a draft level's fc, which only
    target features pass), and every layer's K and V."""
    cfg, p = model.config, next(model.parameters())
    weights = sum(m.weight.numel() * m.weight.element_size() for m in model.modules()
                  if isinstance(m, nn.Linear) and not any(m is u for u in unread))
    kv = 2 * bs * kv_len * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * p.element_size()
    return {"linear": weights, "attention": kv}


def profiled_kernels(graph: torch.cuda.CUDAGraph) -> list[tuple[str, float, float]]:
    """(name, start µs, end µs) of every kernel of one replay of `graph` (after three unprofiled)."""
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    return [(e.name(), e.start_ns() / 1e3, e.end_ns() / 1e3) for e in prof.profiler.kineto_results.events()
            if e.device_type() == torch.autograd.DeviceType.CUDA and "memcpy" not in e.name().lower()]


def print_roofline(model: nn.Module, graph: torch.cuda.CUDAGraph, bs: int, kv_len: int, what: str = "one decode forward",
                   unread: tuple[nn.Module, ...] = ()) -> list[dict]:
    rows = roofline_rows(profiled_kernels(graph), streamed_bytes(model, bs, kv_len, unread))
    print(f"  batch {bs}: {what}'s kernels by group (torch.profiler, one replay)")
    print(f"  {'group':<16} {'kernels':>7} {'µs':>9} {'MB':>9} {'TB/s':>6}")
    for r in rows:
        kernels = "" if r["kernels"] is None else r["kernels"]
        mb = "" if r["bytes"] is None else f"{r['bytes'] / 1e6:.1f}"
        rate = "" if r["tb_s"] is None else f"{r['tb_s']:.2f}"
        print(f"  {r['group']:<16} {kernels:>7} {r['us']:>9.1f} {mb:>9} {rate:>6}")
    return rows

"""`spectrace bench kernels`: each Triton twin (spectrace/kernels/, under the peers' names of
spectrace/compat/triton.py) against the explicit function it mirrors, on the same device and the
same inputs.

A row prints the twin's time twice: replayed from a CUDA graph with the L2 cache flushed (the GPU's
work alone, as the CUDA-graph engine will run it) and called eagerly from Python (launches included,
as `--backend triton` runs it today); the explicit path's time and the eager twin's speed-up over it
(the explicit walks and samplers take their inputs to the CPU, as the engine runs them, and the copy
is timed with them); and where an operation streams a known number of bytes, its effective bandwidth
(from the graph time) as a % of the device's measured copy bandwidth. SDPA and the causal attention
are graph times too. Bytes counted are the unique bytes the operation must touch: for the sampling
walks the target (and draft) probability rows the bonus draw scans; for attention each request's K
and V, prefix and new tokens, once per KV head. Attention rows also time torch's SDPA over the same
KV (dense, every key visible, no tree mask) and the twin without its tree mask (causal), so the
mask's overhead shows.

Walk inputs are chains of n tokens drawn from the draft distribution (topk 1): a tree of the same
n costs the walks no more than the sibling checks, which touch single floats.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from spectrace.compat import sglang as explicit
from spectrace.core.kv import TokenToKVPool
from spectrace.core.tree import TreeMaskMode, organize_draft_results, select_top_k_tokens

NUM_VERIFY_TOKENS = 8


def time_ms(fn, device: str) -> float:
    """Median milliseconds per call: triton's do_bench on CUDA (events, L2 flushed), else wall time."""
    if device.startswith("cuda"):
        import triton.testing
        return triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median")
    fn()
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(runs)


def replay_ms(fn, device: str, reps: int = 40) -> float:
    """Median milliseconds of fn captured in a CUDA graph and replayed, the L2 cache flushed before
    each replay: the GPU's time for the work, without Python's launch cost (as a CUDA-graph engine
    runs it). Wall time on the CPU."""
    if not device.startswith("cuda"):
        return time_ms(fn, device)
    from spectrace.fast.graphs import capture, replay_ms as graph_ms

    fn()  # compile outside the capture
    flush = torch.empty(256 << 20, dtype=torch.int8, device=device)
    return graph_ms(capture(fn, warmup=1), reps, before=flush.zero_)


def twin_ms(fn, device: str) -> tuple[float, float]:
    """A twin's (graph replay, eager) milliseconds."""
    return replay_ms(fn, device), time_ms(fn, device)


def copy_bandwidth(device: str) -> float:
    """Bytes/s of a device-to-device copy (read + write) of a buffer far larger than the caches."""
    n = (1 << 28) if device.startswith("cuda") else (1 << 22)  # 1 GiB / 16 MiB of float32
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / (time_ms(lambda: dst.copy_(src), device) / 1e3)


class Table:
    """One row per twin: its GPU time replayed from a CUDA graph (what the % of copy bandwidth is
    computed from), its eager time (a Python call, launches included), the explicit path's time and
    the speed-up of the eager twin over it."""

    def __init__(self, bandwidth: float):
        self.bandwidth = bandwidth
        print(f"{'kernel':<34} {'shape':<32} {'graph ms':>9} {'eager ms':>9} {'explicit ms':>12} {'speed-up':>9} "
              f"{'% copy BW':>10}")

    def row(self, kernel: str, shape: str, twin: tuple[float, float], explicit_ms: float | None,
            nbytes: int | None = None, note: str = ""):
        graph_ms, eager_ms = twin
        ref = f"{explicit_ms:>12.3f}" if explicit_ms is not None else f"{'-':>12}"
        speed = f"{explicit_ms / eager_ms:>8.{1 if explicit_ms > eager_ms else 3}f}x" if explicit_ms else f"{'-':>9}"
        bw = f"{100 * nbytes / (graph_ms / 1e3) / self.bandwidth:>9.0f}%" if nbytes else f"{'-':>10}"
        print(f"{kernel:<34} {shape:<32} {graph_ms:>9.3f} {eager_ms:>9.3f} {ref} {speed} {bw}  {note}".rstrip())


def draft_tree_inputs(bs: int, topk: int, steps: int, n: int, vocab: int, gen: torch.Generator):
    """organize_draft_results' outputs for a random draft loop, as the EAGLE worker produces them."""
    def probs(rows):
        return torch.softmax(torch.randn(rows, vocab, generator=gen) * 3, -1)

    topk_p, topk_index = torch.topk(probs(bs), topk)
    scores, score_list, token_list, parents_list = None, [], [], []
    for i in range(steps):
        _, _, scores, info = select_top_k_tokens(i, topk_p, topk_index, None, scores, topk)
        score_list.append(info[0]), token_list.append(info[1]), parents_list.append(info[2])
        topk_p, topk_index = torch.topk(probs(bs * topk), topk)
    return organize_draft_results(score_list, token_list, parents_list, n)


def chain_inputs(bs: int, vocab: int, device: str, gen: torch.Generator):
    """A chain walk's tensors: drafts sampled from q, p a perturbation of q, uniform coins."""
    n = NUM_VERIFY_TOKENS
    draft_logits = torch.randn(bs, n, vocab, generator=gen) * 2
    draft_probs = torch.softmax(draft_logits, -1)
    target_probs = torch.softmax(draft_logits + torch.randn(bs, n, vocab, generator=gen) * 0.5, -1)
    drafts = torch.multinomial(draft_probs.view(-1, vocab), 1, generator=gen).view(bs, n)
    candidates = torch.cat((torch.zeros(bs, 1, dtype=torch.int64), drafts[:, :-1]), 1)
    next_token = torch.arange(1, n + 1).repeat(bs, 1)
    next_token[:, -1] = -1
    t = dict(candidates=candidates, retrive_index=torch.arange(bs * n).view(bs, n), retrive_next_token=next_token,
             retrive_next_sibling=torch.full((bs, n), -1), uniform_samples=torch.rand(bs, n, generator=gen),
             uniform_samples_for_final_sampling=torch.rand(bs, generator=gen), target_probs=target_probs,
             draft_probs=draft_probs)
    return {k: v.to(device) for k, v in t.items()}


def walk_outputs(bs: int, width: int, device: str):
    n = NUM_VERIFY_TOKENS
    return dict(predicts=torch.full((bs * n,), -1, dtype=torch.int32, device=device),
                accept_index=torch.full((bs, width), -1, dtype=torch.int32, device=device),
                accept_token_num=torch.zeros(bs, dtype=torch.int32, device=device))


def bench_tree_and_walks(table: Table, device: str, batch_sizes, vocabs, gen) -> None:
    from spectrace.compat import triton as twin
    from spectrace.kernels.sampling import sample_from_prob

    n = NUM_VERIFY_TOKENS
    for bs in batch_sizes:
        parent_list, sel, draft_tokens = draft_tree_inputs(bs, 4, 3, n, 64, gen)
        args = [t.to(device) for t in (torch.arange(bs), parent_list, sel, draft_tokens,
                                       torch.randint(100, 2000, (bs,), generator=gen))]
        call = (int(args[-1].sum()), 4, 3, n, TreeMaskMode.FULL_MASK)
        table.row("build_tree_kernel_efficient", f"bs {bs} topk 4 steps 3 n {n}",
                  twin_ms(lambda: twin.build_tree_kernel_efficient(*args, *call), device),
                  time_ms(lambda: explicit.build_tree_kernel_efficient(*args, *call), device))
        t = chain_inputs(bs, 64, device, gen)
        tree_keys = ("candidates", "retrive_index", "retrive_next_token", "retrive_next_sibling")
        greedy = [t[k] for k in tree_keys]
        predict = torch.randint(0, 64, (bs, n), generator=gen).to(device)

        def greedy_walk(module):
            module.verify_tree_greedy(*walk_outputs(bs, n, device).values(), *greedy, predict)
        table.row("verify_tree_greedy", f"bs {bs} n {n}", twin_ms(lambda: greedy_walk(twin), device),
                  time_ms(lambda: greedy_walk(explicit), device))
        for vocab in vocabs:
            t = chain_inputs(bs, vocab, device, gen)
            row_bytes = vocab * 4

            t["chain_draft_probs"] = t["draft_probs"][:, :-1].contiguous()
            twin_outs = walk_outputs(bs, n, device).values()

            # The twins time the launch alone, on tensors already in place (reused: their in-place
            # writes change no decision); the explicit walks run on the CPU, as the engine runs
            # them, so p and q go there first.
            def target_only(module, dev, outs):
                tt = {k: v.to(dev) for k, v in t.items()}
                module.tree_speculative_sampling_target_only(
                    *outs, *[tt[k] for k in tree_keys], tt["uniform_samples"],
                    tt["uniform_samples_for_final_sampling"], tt["target_probs"], tt["draft_probs"])

            def chain(module, dev, outs):
                tt = {k: v.to(dev) for k, v in t.items()}
                module.chain_speculative_sampling(
                    *outs, tt["candidates"], tt["retrive_index"], tt["uniform_samples"],
                    tt["uniform_samples_for_final_sampling"], tt["target_probs"], tt["chain_draft_probs"])
            shape = f"bs {bs} n {n} V {vocab} fp32"
            # the bonus scans its target row and, after a rejection, the draft row: count both
            table.row("tree_spec_sampling_target_only", shape,
                      twin_ms(lambda: target_only(twin, device, twin_outs), device),
                      time_ms(lambda: target_only(explicit, "cpu", walk_outputs(bs, n, "cpu").values()), device),
                      2 * bs * row_bytes)
            table.row("chain_speculative_sampling", shape, twin_ms(lambda: chain(twin, device, twin_outs), device),
                      time_ms(lambda: chain(explicit, "cpu", walk_outputs(bs, n, "cpu").values()), device),
                      2 * bs * row_bytes)
            # the walks' last launches alone: each request's bonus from relu(p - q) at a middle row
            rows = (torch.arange(bs, device=device) * n + n // 2) * vocab
            bonus_draw = torch.stack((rows // vocab, rows, rows, torch.ones_like(rows)), 1)
            predicts = next(iter(twin_outs))
            table.row("sample_from_prob (the walks' draw)", shape,
                      twin_ms(lambda: sample_from_prob(bonus_draw, t["target_probs"], t["draft_probs"],
                                                   t["uniform_samples_for_final_sampling"], predicts), device),
                      None, 2 * bs * row_bytes)


def bench_vllm(table: Table, device: str, batch_sizes, vocabs, gen) -> None:
    from spectrace.compat import vllm as explicit_vllm
    from spectrace.compat import triton as twin

    k = NUM_VERIFY_TOKENS - 1
    for bs in batch_sizes:
        meta = explicit_vllm.SpecDecodeMetadata.make_dummy(torch.randint(0, 64, (bs, k), generator=gen).tolist(),
                                                          device)
        cpu_meta = explicit_vllm.SpecDecodeMetadata.make_dummy(meta.draft_token_ids.view(bs, k).tolist(), "cpu")
        bonus = torch.zeros(bs, 1, dtype=torch.int64, device=device)
        greedy = explicit_vllm.SamplingMetadata(None, all_greedy=True, all_random=False)
        for vocab in vocabs:
            for dtype in (torch.float32, torch.bfloat16):
                logits = torch.randn(bs * k, vocab, generator=gen).to(device, dtype)
                table.row("vllm RejectionSampler greedy", f"bs {bs} k {k} V {vocab} {str(dtype)[6:]}",
                          twin_ms(lambda: twin.RejectionSampler()(meta, None, logits, bonus, greedy), device),
                          time_ms(lambda: explicit_vllm.RejectionSampler()(cpu_meta, None, logits.cpu(), bonus.cpu(),
                                                                           greedy), device),
                          logits.numel() * logits.element_size(), "argmax reads the logits")
            draft_probs = torch.softmax(torch.randn(bs * k, vocab, generator=gen), -1).to(device)
            target_probs = torch.softmax(torch.randn(bs * k, vocab, generator=gen), -1).to(device)
            inv_q = (1 / torch.empty(bs, vocab).exponential_(generator=gen)).to(device)
            cu = meta.cu_num_draft_tokens.to(device)
            ids = meta.draft_token_ids.to(device)
            table.row("vllm sample_recovered_tokens", f"bs {bs} k {k} V {vocab} fp32",
                      twin_ms(lambda: twin.sample_recovered_tokens(k, meta.num_draft_tokens, cu, ids, draft_probs,
                                                                   target_probs, inv_q), device),
                      None, 2 * target_probs.numel() * 4 + inv_q.numel() * 4,
                      "explicit: drawn with its randoms on the CPU, not separable")


def attention_inputs(bs: int, prefix: int, heads: int, kv_heads: int, head_dim: int, dtype, device: str, gen):
    n = NUM_VERIFY_TOKENS
    num_slots = bs * prefix

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype)
    pool = TokenToKVPool(1, num_slots, kv_heads, head_dim, dtype, device)
    pool.k[0], pool.v[0] = randn(num_slots, kv_heads, head_dim), randn(num_slots, kv_heads, head_dim)
    tree = torch.eye(n, dtype=torch.bool)
    for j in range(1, n):
        tree[j] |= tree[(j - 1) // 2]  # a binary tree of 8 nodes
    mask = torch.cat((torch.ones(n, prefix, dtype=torch.bool), tree), 1).flatten()
    args = dict(q_extend=randn(bs * n, heads, head_dim), k_extend=randn(bs * n, kv_heads, head_dim),
                v_extend=randn(bs * n, kv_heads, head_dim), o_extend=torch.empty(bs * n, heads, head_dim,
                                                                                   dtype=dtype, device=device),
                k_buffer=pool.k[0], v_buffer=pool.v[0],
                qo_indptr=torch.arange(0, (bs + 1) * n, n, device=device),
                kv_indptr=torch.arange(0, (bs + 1) * prefix, prefix, device=device),
                kv_indices=torch.randperm(num_slots, generator=gen).to(device),
                custom_mask=mask.repeat(bs).to(device),
                mask_indptr=torch.arange(0, (bs + 1) * mask.numel(), mask.numel(), device=device),
                max_len_extend=n)
    return args


def bench_attention(table: Table, device: str, batch_sizes, prefix: int, heads: int, kv_heads: int, head_dim: int,
                    gen) -> None:
    from spectrace.kernels import attention as twin

    n = NUM_VERIFY_TOKENS
    for bs in batch_sizes:
        for dtype in (torch.float32, torch.bfloat16):
            a = attention_inputs(bs, prefix, heads, kv_heads, head_dim, dtype, device, gen)
            shape = f"bs {bs} n {n} kv {prefix} {str(dtype)[6:]}"
            nbytes = 2 * bs * (prefix + n) * kv_heads * head_dim * a["q_extend"].element_size()
            # SDPA over the same KV, contiguous and dense: (bs, heads, n, d) against (bs, kv_heads, prefix + n, d)
            q = a["q_extend"].view(bs, n, heads, head_dim).transpose(1, 2).contiguous()
            kv_shape = (bs, prefix + n, kv_heads, head_dim)
            k = torch.randn(kv_shape, generator=gen).to(device, dtype).transpose(1, 2).contiguous()
            v = torch.randn(kv_shape, generator=gen).to(device, dtype).transpose(1, 2).contiguous()
            sdpa = replay_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), device)
            tree = twin_ms(lambda: twin.extend_attention_fwd(**a), device)
            causal = {**a, "custom_mask": None, "mask_indptr": None}
            splits = twin.auto_kv_splits(a["q_extend"].device, bs * kv_heads, bs * prefix, bs)  # one block of 8 tokens
            causal_ms = replay_ms(lambda: twin.extend_attention_fwd(**causal), device)
            tree_ms = tree[0]
            table.row("extend_attention_fwd (tree mask)", shape, tree,
                      time_ms(lambda: explicit.extend_attention_fwd(**a), device), nbytes,
                      f"SDPA {sdpa:.3f} ms ({tree_ms / sdpa:.2f}x); causal {causal_ms:.3f} ms "
                      f"(mask {100 * (tree_ms / causal_ms - 1):+.0f}%); KV splits {splits}")


def bench_kv(table: Table, device: str, batch_sizes, layers: int, kv_heads: int, head_dim: int, gen) -> None:
    from spectrace.kernels import kv as twin

    n = NUM_VERIFY_TOKENS
    for bs in batch_sizes:
        req_to_token = torch.full((bs, 4096), -1, dtype=torch.int64, device=device)
        reqs, starts = torch.arange(bs, device=device), torch.randint(0, 4000, (bs,), generator=gen).to(device)
        out_cache_loc = torch.randperm(bs * n, generator=gen).to(device)

        def assign_loop():  # KVCache.assign, request by request
            for b, (req, start) in enumerate(zip(reqs.tolist(), starts.tolist())):
                req_to_token[req, start:start + n] = out_cache_loc[b * n:(b + 1) * n]
        table.row("assign_req_to_token_pool", f"bs {bs} n {n}",
                  twin_ms(lambda: twin.assign_req_to_token_pool(reqs, req_to_token, starts, starts + n, out_cache_loc),
                          device), time_ms(assign_loop, device))
    for dtype in (torch.float32, torch.bfloat16):
        pool = TokenToKVPool(layers, 1024, kv_heads, head_dim, dtype, device)
        src, dst = list(range(7, 7 + 2 * n, 2)), list(range(7, 7 + n))
        index = torch.tensor([dst, src], device=device)
        table.row("move_kv_cache", f"{layers} layers, {n} slots {str(dtype)[6:]}",
                  twin_ms(lambda: twin.move_kv_cache(pool.k, pool.v, index[0], index[1]), device),
                  time_ms(lambda: pool.move(src, dst), device),
                  2 * 2 * layers * n * kv_heads * head_dim * pool.k.element_size())


def bench_linear(table: Table, device: str, hidden: int, intermediate: int, vocab: int, gen,
                 draft_vocab: int = 32_000) -> None:
    """kernels/gemv.py against F.linear (cuBLAS), in bf16 (float16 interpreted: the interpreter has
    no bf16 products): a decoder layer's matrices and lm_head at one row (a batch-1 decode: the
    GEMV) and at 4 and 8 rows (a draft level's top-k, a verify: `rows_linear`), and at 4 rows an
    EAGLE-3 head's own (its QKV over the 2H-column [embedding, hidden] input, its draft-vocabulary
    lm_head); what each reads, per second. On Hopper `rows_linear` reads W through TMA unless
    SPECTRACE_TMA=0, so the two switches compare here."""
    from spectrace.kernels.gemv import linear

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float16
    head_dim, kv = 128 if hidden >= 1024 else 32, 8 if hidden >= 1024 else 2
    qkv = (hidden // head_dim + 2 * kv) * head_dim
    layer = {"qkv": (qkv, hidden), "o_proj": (hidden, hidden), "gate_up": (2 * intermediate, hidden),
             "down": (hidden, intermediate), "lm_head": (vocab, hidden)}
    head = {"eagle3 qkv": (qkv, 2 * hidden), "eagle3 lm_head": (min(draft_vocab, vocab), hidden)}
    runs = [(rows, name, shape) for rows in (1, 4, 8) for name, shape in layer.items()]
    runs += [(4, name, shape) for name, shape in head.items()]
    for rows, name, (n, k) in runs:
        w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(device, dtype)
        x = torch.randn(rows, k, generator=gen).to(device, dtype)
        graph_ms = replay_ms(lambda: linear(x, w), device)
        cublas_ms = replay_ms(lambda: F.linear(x, w), device)
        rate = w.numel() * w.element_size() / 1e9
        kernel = "gemv linear (one row)" if rows == 1 else f"rows_linear ({rows} rows)"
        table.row(kernel, f"{name} {n}x{k} {str(dtype)[6:]}",
                  (graph_ms, time_ms(lambda: linear(x, w), device)), time_ms(lambda: F.linear(x, w), device),
                  note=f"{rate / graph_ms:.2f} TB/s; F.linear {cublas_ms:.3f} ms graph, {rate / cublas_ms:.2f} TB/s")


def bench_kernels(device: str = "cuda", batch_sizes=(1, 8, 64), vocabs=(4096, 128_256), prefix: int = 2048,
                  heads: int = 32, kv_heads: int = 8, head_dim: int = 128, layers: int = 32, hidden: int = 4096,
                  intermediate: int = 14336) -> None:
    """The defaults are Llama-3-8B's shapes: its attention (32 query heads, 8 KV heads,
    head_dim 128, 32 layers), its matrices (hidden 4096, MLP 14336), 8 verify tokens,
    vocabularies of 4096 and Llama 3's 128256."""
    gen = torch.Generator().manual_seed(0)
    bandwidth = copy_bandwidth(device)
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "CPU (Triton interpreter)"
    print(f"{name}: measured copy bandwidth {bandwidth / 1e9:.0f} GB/s; times are medians")
    if device.startswith("cuda"):  # what the graph timing reads for a kernel that does nothing
        one = torch.zeros(1, device=device)
        print(f"floor: a graph of one 1-element kernel measures {replay_ms(one.zero_, device):.3f} ms")
    table = Table(bandwidth)
    bench_tree_and_walks(table, device, batch_sizes, vocabs, gen)
    bench_vllm(table, device, batch_sizes, vocabs, gen)
    bench_attention(table, device, batch_sizes, prefix, heads, kv_heads, head_dim, gen)
    bench_kv(table, device, batch_sizes, layers, kv_heads, head_dim, gen)
    bench_linear(table, device, hidden, intermediate, vocabs[-1], gen)

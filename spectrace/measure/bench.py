"""`spectrace bench`: tokens/s and τ of algorithms on the built-in prompts, end to end (`run`).

    algos_table   each prompt alone (batch 1), the best of --repeat timed runs per prompt
    batch_table   --batch-sizes: every algorithm at each batch size, and its speed-up over `none`
                  at the same batch. The vLLM chapter (§12.6) says speculation pays less as the
                  batch grows, because verify stops being nearly free once the GPU is busy; this
                  measures it on whatever device and backend the run uses.

    --compare-hf  transformers' own paths on the same prompts and models: measure/hf.py
    shape_table   --target-shape: a predicted speed-up by batch size at a real model's shape,
                  from phase costs measured there with random weights and τ from the embedded pair
                  (measure/grown.py: and beside it the speed-up measured at that shape on the grown
                  pair, the embedded pair computed by models of that shape)

`config(algo, prompts, batch, trace)` builds the RunConfig of one run from the command's options.
The first run of each measurement warms up and is not counted.
"""
from __future__ import annotations

import gc
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import torch

from spectrace.core.metrics import predicted_speedup
from spectrace.errors import SpectraceError
from spectrace.core.config import read_config_json
from spectrace.loading.models import drop_drafters
from spectrace.run import RunConfig, RunResult, resolve, run
from spectrace.zoo import TARGET_DIR
from spectrace.zoo.random_checkpoint import SHAPES

Config = Callable[..., RunConfig]
Progress = Callable[[str | None], None]  # a status line: a message, or None to clear it before a row prints


def _silent(message: str | None) -> None:
    """The default Progress: no status line (tests, and callers that print their own)."""


def best_run(config: Config, repeat: int, loaded: dict | None = None, **kw) -> RunResult:
    """The fastest of `repeat` timed runs, after one that warms up; loaded: the table's models,
    loaded once (an 8B model takes seconds to load; a run's time does not count it)."""
    best = None
    for rep in range(repeat + 1):
        cfg = config(**kw)
        res = run(cfg, loaded=loaded)
        release(cfg.device)
        if rep and (best is None or res.metrics["wall_s"] < best.metrics["wall_s"]):
            best = res
    return best


def release(device: str) -> None:
    """A finished run's engine sits in reference cycles with its CUDA graphs' memory pools and
    KV: collected now and the cached blocks handed back, or runs of an 8B model one after another
    fill the device with pools nothing uses any more."""
    if device.startswith("cuda"):
        gc.collect()
        torch.cuda.empty_cache()


def add_traced(traced: list[float], res: RunResult) -> None:
    """A traced run's wall time: its loop's, and with what its trace costs after the loop (trace_s:
    the fast engine closes its frames; with --record-probs it builds the records)."""
    traced[0] += res.metrics["wall_s"]
    traced[1] += res.metrics["wall_s"] + res.metrics.get("trace_s", 0.0)


def shape_of(algo: str, res: RunResult) -> str:
    sp = res.spec
    return "-" if algo == "none" else f"{sp.num_steps},{sp.topk},{sp.num_draft_tokens}"


def algos_table(config: Config, algos: list[str], prompts: list[str], repeat: int,
                progress: Progress = _silent, record_level: str = "off") -> dict[str, list[list[int]]]:
    """Prints a row per algorithm (`none` first when asked for); returns each algorithm's output
    ids, prompt by prompt. Beside tokens/s, τ and α: the mean draft, verify and other (accept,
    commit, extend) ms of a decode step, r = C_draft / C_verify, the textbook model's speed-up
    τ / (1 + r) and, with `none` in the table, the realised one (tokens/s over none's) beside the
    whole-step model τ C_AR / (C_draft + C_verify + C_other), C_AR = none's ms per step: the textbook
    formula without its two approximations (C_extend dropped, a verify costing one decode).
    `config` times runs without a trace; record_level "full" or "steps" adds two columns (`traced`):
    the wall time of the same runs recording a trace at that level over the untraced one, and the
    same with what the trace costs after the loop (trace_s)."""
    algos = sorted(algos, key=lambda a: a != "none")
    recording = record_level != "off"
    print(f"{'algo':<20} {'steps,topk,n':>12} {'tokens/s':>9} {'tau':>6} {'alpha':>6} {'verify_ct':>9} "
          f"{'draft ms':>8} {'verify ms':>9} {'other ms':>8} {'r':>6} {'tau/(1+r)':>9} {'step model':>10} "
          f"{'realised':>8}" + (f" {'recording':>9} {'+records':>8}" if recording else ""))
    outputs, none_tps, c_ar, loaded, speedups = {}, None, None, {}, {}
    for algo in algos:
        tokens = wall = verify = correct = proposed = steps = 0
        traced = [0.0, 0.0]  # the loop's wall time, and with the trace's cost after it
        phase_ms = Counter()
        outputs[algo] = []
        for i, prompt in enumerate(prompts):
            progress(f"bench: {algo}, prompt {i + 1} of {len(prompts)}")
            res = best_run(config, repeat, loaded, algo=algo, prompts=[prompt], batch=None, trace=None)
            if recording:
                add_traced(traced, best_run(config, repeat, loaded, algo=algo, prompts=[prompt], batch=None,
                                            trace=f"runs/bench/{algo}-{i}.jsonl", trace_level=record_level))
            outputs[algo].append(res.requests[0].output_ids)
            m = res.metrics
            tokens += m["completion_tokens"]
            wall += m["wall_s"]
            verify += m["verify_ct"]
            correct += m["num_correct_drafts"]
            proposed += m["num_proposed_drafts"]
            steps += m["decode_steps"]
            phase_ms.update(m["phase_ms"])
        tps = tokens / wall
        none_tps = tps if algo == "none" else none_tps
        c_draft, c_verify = phase_ms["draft"] / max(steps, 1), phase_ms["verify"] / max(steps, 1)
        c_other = sum(phase_ms.values()) / max(steps, 1) - c_draft - c_verify  # accept, commit, extend
        cells = [f"{tps:>9.1f}", f"{tokens / verify:>6.3f}" if verify else f"{'-':>6}",
                 f"{correct / proposed:>6.3f}" if proposed else f"{'-':>6}", f"{verify:>9}",
                 f"{c_draft:>8.2f}", f"{c_verify:>9.2f}", f"{c_other:>8.2f}"]
        if algo == "none":
            c_ar = c_verify + c_other
            cells += [f"{'-':>6}", f"{'-':>9}", f"{'-':>10}", f"{'-':>8}"]
        else:
            r, tau = c_draft / c_verify, tokens / verify
            step_model = f"{tau * c_ar / (c_draft + c_verify + c_other):>9.2f}x" if c_ar else f"{'-':>10}"
            cells += [f"{r:>6.3f}", f"{predicted_speedup(tau, r):>8.2f}x", step_model,
                      f"{tps / none_tps:>7.2f}x" if none_tps else f"{'-':>8}"]
        if recording:
            cells += [f"{traced[0] / wall:>8.2f}x", f"{traced[1] / wall:>7.2f}x"]
        progress(None)
        print(f"{algo:<20} {shape_of(algo, res):>12} " + " ".join(cells))
        if algo != "none" and none_tps:
            speedups[algo] = (tps / none_tps, tokens / verify)
    launch_bound_note(config, speedups, prompts)
    return outputs


def batch_runs(prompts: list[str], bs: int) -> list[list[str]]:
    """The runs of a batch size: every prompt at least once (the prompts cycled up to a whole
    batch), bs requests a run, so that τ at every batch is the τ of the same requests."""
    count = -(-max(bs, len(prompts)) // bs) * bs
    requests = [prompts[i % len(prompts)] for i in range(count)]
    return [requests[i:i + bs] for i in range(0, count, bs)]


def batch_table(config: Config, algos: list[str], prompts: list[str], batch_sizes: list[int], repeat: int,
                progress: Progress = _silent, policy: str | None = None, record_level: str = "off",
                one_drafter: bool = False) -> dict[int, dict[str, tuple]]:
    """At each batch size, runs of that many requests per algorithm (`batch_runs`): tokens/s
    (every request's tokens over the runs' wall time), τ, and tokens/s over `none`'s at the same
    batch; with `policy` (--batch-policy) each algorithm once more at the shape the policy picks
    for the batch, or drafting off; with record_level "full" or "steps" the same runs traced, over
    the untraced: the loop's time, and with the trace's cost after it. Returns {batch: {algo or
    "algo policy": (tokens/s, τ, tokens/s of the decode steps alone: no prefill, no first token)}}."""
    algos = ["none"] + [a for a in algos if a != "none"]
    columns = [(a, {}) for a in algos[1:]]
    if policy is not None:
        columns += [(a, {"batch_policy": policy, "num_steps": None, "topk": None, "num_draft_tokens": None})
                    for a in algos[1:]]
    names = [a + (" policy" if over else "") for a, over in columns]
    cost_head = f" {'recording':>9} {'+records':>8}" if record_level != "off" else ""
    print(f"{'batch':>5} {'none tok/s':>10}{cost_head}" + "".join(
        f" | {n + ' tok/s':>19} {'tau':>6} {'speed-up':>8}{cost_head}" for n in names))
    table, loaded, slow = {}, {}, {}
    for bs in batch_sizes:
        row, cost = {}, {}
        for name, (algo, over) in zip(["none"] + names, [("none", {})] + columns):
            progress(f"bench: batch {bs}, {name}")
            if one_drafter:  # the target stays loaded; the last column's drafter goes
                drop_drafters(loaded)
            runs = [best_run(config, repeat, loaded, algo=algo, prompts=group, batch=bs, trace=None, **over)
                    for group in batch_runs(prompts, bs)]
            tokens, wall = sum(r.metrics["completion_tokens"] for r in runs), sum(r.metrics["wall_s"] for r in runs)
            drafted = runs[0].spec.algo != "none"
            decoding = (tokens - sum(len(r.requests) for r in runs)) / \
                (wall - sum(r.metrics["prefill_ms"] for r in runs) / 1e3)  # the first tokens come from prefill
            row[name] = (tokens / wall, tokens / sum(r.metrics["verify_ct"] for r in runs) if drafted else None,
                         decoding)
            if cost_head:
                traced = [0.0, 0.0]
                for i, group in enumerate(batch_runs(prompts, bs)):
                    add_traced(traced, best_run(config, repeat, loaded, algo=algo, prompts=group, batch=bs,
                                                trace=f"runs/bench/{name}-{bs}-{i}.jsonl".replace(" ", "-"),
                                                trace_level=record_level, **over))
                cost[name] = f" {traced[0] / wall:>8.2f}x {traced[1] / wall:>7.2f}x"
        table[bs] = row
        progress(None)
        for a in names:
            if " " not in a and a not in slow and row[a][0] < row["none"][0]:
                slow[a] = (row[a][0] / row["none"][0], row[a][1])
        print(f"{bs:>5} {row['none'][0]:>10.1f}{cost.get('none', '')}" + "".join(
            f" | {row[n][0]:>19.1f} {f'{row[n][1]:.3f}' if row[n][1] else '-':>6} {row[n][0] / row['none'][0]:>7.2f}x"
            f"{cost.get(n, '')}" for n in names))
    launch_bound_note(config, slow, prompts)
    return table


def launch_bound_note(config: Config, speedups: dict[str, tuple[float, float]], prompts: list[str]) -> None:
    """Where drafting ran slower than plain decoding on the embedded pair on a GPU (speedups:
    algo -> (speed-up, τ)), why, in kernels, and what to run instead. The embedded pair's weights
    (about 15 MB) stay in cache: a step costs what its kernels cost to launch, so a step of
    drafting, verifying and extending must launch fewer kernels than τ plain tokens to pay."""
    base = config(algo="none", prompts=[], batch=None, trace=None)
    slow = {a: v for a, v in speedups.items() if v[0] < 1.0}
    if not slow or not base.device.startswith("cuda") or Path(base.target_model) != TARGET_DIR:
        return
    counts = {}
    if base.backend == "fast":
        from spectrace.measure.profile import profile_algo
        for algo in ["none", *slow]:
            counts[algo] = profile_algo(config, algo, prompts[:1], base.device)["phases"]["total"]["kernels"]
    for algo, (speedup, tau) in slow.items():
        kernels = (f" (counted on the first prompt: plain decoding launches {counts['none']:.0f} kernels a token, "
                   f"{algo} {counts[algo]:.0f} a step of {tau:.2f} tokens)") if counts else \
            " (spectrace bench --profile --backend fast counts them)"
        print(f"note: {algo} runs {speedup:.2f}x plain decoding here. The embedded pair is launch-bound on a GPU: "
              f"its weights stay in cache, so a step costs what its kernels cost{kernels}. At a real model's shape "
              "the bound is memory and drafting pays: spectrace bench --device cuda --backend fast --target-shape "
              "llama-3.1-8b --batch-sizes 1 measures it on the grown pair (Llama-3.1-8B's shape computing the "
              "embedded pair).")


# ---- predicted speed-up at real model shapes -------------------------------------------------

# the published models' config.json fields (zoo/random_checkpoint.py), whose costs --target-shape
# measures with random weights; "small", the grown pair's CPU size (zoo/grow), and "embedded", the
# embedded target's, for a quick look on any machine
TARGET_SHAPES = {**SHAPES, "small": None, "embedded": None}
EAGLE3_DRAFT_VOCAB = 32000  # the published EAGLE-3 heads' draft vocabulary (Llama 3.1 8B's, SpecForge's default)
# EAGLE-3's paper (SGLang, Llama-3.1-8B, one H100): speed-up by batch size
EAGLE3_PAPER_SGLANG = {2: 1.81, 64: 1.38}


def _step_forward(model, features: torch.Tensor | None):
    """model's forward as a step runs it: a target's logits, or with `features` (N, F) a draft
    head's logits over its own vocabulary."""
    if features is None:
        return lambda batch, kv: model(batch, kv)
    return lambda batch, kv: model.vocab_logits(model(batch, kv, features))


def _features(model, bs: int, rows: int, width: int) -> torch.Tensor | None:
    p = next(model.parameters())
    return torch.randn(bs * rows, width, dtype=p.dtype, device=p.device) if width else None


def forward_ms(model, kv_len: int, bs: int, rows: int, repeat: int, features: int = 0) -> float:
    """Median ms of one forward of `model` (random weights) over bs requests of `rows` new tokens
    each (causal) after kv_len cached ones, on the model's device; features: a draft head's
    input width (0: a target)."""
    from spectrace.core.batch import ForwardBatch

    p = next(model.parameters())
    kv = model.new_kv_cache("cost", "sglang", bs * (kv_len + rows), bs, kv_len + rows)
    for req in range(bs):  # a prefix's slots, mapped but never computed: its K/V values do not change the cost
        kv.prepare(req, 0, kv_len)
    batch = ForwardBatch.build(kv, [(req, kv_len, [1] * rows) for req in range(bs)])
    forward = _step_forward(model, _features(model, bs, rows, features))
    times = []
    for _ in range(repeat + 1):  # the first call warms up
        if p.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        forward(batch, kv)
        if p.is_cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times[1:])[len(times[1:]) // 2]


def fast_forward_ms(model, kv_len: int, bs: int, rows: int, repeat: int, features: int = 0) -> float:
    """forward_ms as the fast engine runs a forward (fused layers, Triton attention, replayed from a
    CUDA graph, timed with CUDA events): a decode (rows 1), a verify (rows n; a tree mask costs
    about the same) or a draft level. For `spectrace bench --target-shape` with --backend fast."""
    from spectrace.fast.graphs import replay_ms

    return replay_ms(fast_forward_graph(model, kv_len, bs, rows, features), repeat)


def fast_forward_graph(model, kv_len: int, bs: int, rows: int, features: int = 0) -> torch.cuda.CUDAGraph:
    """fast_forward_ms's forward, captured (its KV lives as long as the graph)."""
    from spectrace.fast.batch import extend_batch
    from spectrace.fast.graphs import capture, place_rotary
    from spectrace.fast.kv import StaticKV
    from spectrace.kernels import backend
    from spectrace.kernels.fused import fuse

    backend.install()
    fuse(model, kv_len + rows)
    kv = StaticKV(model, bs, kv_len + rows)
    device = kv.seq_lens.device
    place_rotary(model, device)
    kv.seq_lens.fill_(kv_len)
    ids = torch.ones(bs * rows, dtype=torch.int64, device=device)
    positions = (kv_len + torch.arange(rows, device=device)).repeat(bs)
    forward = _step_forward(model, _features(model, bs, rows, features))
    return capture(lambda: forward(extend_batch(kv, ids, positions, rows), kv))


def shape_table(config: Config, shape: str, batch_sizes: list[int], repeat: int, kv_len: int = 1024,
                tau: float | None = None, prompts: list[str] | None = None,
                profile: bool = False, grown: Path | None = None) -> dict[int, dict[str, float]]:
    """A *predicted* speed-up by batch size at a real model shape: the phase costs measured at
    that shape with random weights, the acceptance measured on the embedded pair. An EAGLE-3 step
    (num_steps S, topk K, n verify tokens) costs, as the engines run it (SGLang's EAGLE worker's
    order): a draft loop of S-1 forwards of K rows from the head's own state (a one-layer head at
    the target's width with its own lm_head over a draft vocabulary of 32k tokens; level 0 takes
    its top-k from the last draft extend's q, no forward), a verify of n rows, and a draft extend
    over the accepted tokens from the target's three captured layers (the fast engine pads them
    to S+1 rows a request, the explicit engine runs about τ); plain decoding one row.
    Predicted speed-up = τ * C_AR / (C_draft + C_verify + C_extend); the textbook τ / (1 + r)
    beside it. profile: each batch size's decode forward, verify and draft level (of K rows, from
    the head's own state) by kernel group against the roofline (measure/roofline.py). grown: a grown
    pair's directory, whose target's decode is timed beside the random one's (C_AR grown)."""
    from spectrace.core.config import ModelConfig
    from spectrace.core.drafters.eagle3 import Eagle3Head
    from spectrace.core.drafters.eagle3_layouts import default_capture_layers
    from spectrace.core.model import CausalLM, load_model

    if shape not in TARGET_SHAPES:
        raise SpectraceError(f"unknown --target-shape {shape!r} (choose from {', '.join(TARGET_SHAPES)})")
    cfg = config(algo="eagle3", prompts=[], batch=None, trace=None)
    cfg.check()
    if tau is None:  # acceptance of the embedded pair at the same tree shape, batch 1, the prompts
        from spectrace.zoo.prompts import HELD_OUT_PROMPTS
        tokens = verify = 0
        for prompt in prompts or HELD_OUT_PROMPTS:
            m = run(config(algo="eagle3", prompts=[prompt], batch=None, trace=None, trace_level="off")).metrics
            tokens, verify = tokens + m["completion_tokens"], verify + m["verify_ct"]
        tau = tokens / verify
    spec, _ = resolve(cfg)  # SGLang's automatic shape for an EAGLE-3 head over a Llama target
    S, K, n = spec.num_steps, spec.topk, spec.num_draft_tokens
    dtype = cfg.torch_dtype
    from spectrace.zoo.grow import PLANS, target_config

    raw = read_config_json(TARGET_DIR) if shape == "embedded" else TARGET_SHAPES[shape] or target_config(shape)
    target_cfg = ModelConfig.from_json(raw)
    H, L, V = target_cfg.hidden_size, target_cfg.num_hidden_layers, target_cfg.vocab_size
    taps = default_capture_layers(L)
    draft_vocab = PLANS[shape].draft_vocab if shape in PLANS else min(EAGLE3_DRAFT_VOCAB, V)
    torch.manual_seed(0)
    with torch.device(cfg.device):  # initialised where they run: an 8B model never visits host memory
        target = CausalLM(target_cfg).to(dtype).eval()
        head = Eagle3Head(ModelConfig.from_json({**raw, "num_hidden_layers": 1}), draft_vocab, H, taps).to(dtype).eval()
    grown_target = load_model(grown / "target", dtype, cfg.device) if grown else None
    cost, extend_rows = forward_ms, max(1, round(tau))
    if cfg.backend == "fast":  # the fast engine's forwards: fused, Triton attention, one CUDA graph each
        cost, extend_rows = fast_forward_ms, S + 1
    print(f"predicted, not measured end to end: costs at the {shape} shape (random weights, {kv_len}-token "
          f"context, {cfg.device} {str(dtype)[6:]}, {cfg.backend} forwards, an EAGLE-3 head of "
          f"{draft_vocab} draft tokens), tau {tau:.3f} of the embedded eagle3 ({S},{K},{n})")
    print(f"{'batch':>5} {'C_AR ms':>8} {'draft ms':>8} {'verify ms':>9} {'extend ms':>9} {'r':>6} "
          f"{'tau/(1+r)':>9} {'predicted':>9} {'EAGLE-3 paper':>13}" + (f" {'C_AR grown':>10}" if grown else ""))
    table = {}
    for bs in batch_sizes:
        c_ar = cost(target, kv_len, bs, 1, repeat)
        c_ar_grown = f" {cost(grown_target, kv_len, bs, 1, repeat):>10.2f}" if grown else ""
        c_draft = (S - 1) * cost(head, kv_len, bs, K, repeat, H)
        c_verify = cost(target, kv_len, bs, n, repeat)
        c_extend = cost(head, kv_len, bs, extend_rows, repeat, len(taps) * H)
        r = c_draft / c_verify
        predicted = tau * c_ar / (c_draft + c_verify + c_extend)
        table[bs] = dict(tau=tau, c_ar=c_ar, c_draft=c_draft, c_verify=c_verify, c_extend=c_extend,
                         predicted=predicted)
        paper = f"{EAGLE3_PAPER_SGLANG[bs]:.2f}x" if bs in EAGLE3_PAPER_SGLANG and shape == "llama-3.1-8b" else "-"
        print(f"{bs:>5} {c_ar:>8.2f} {c_draft:>8.2f} {c_verify:>9.2f} {c_extend:>9.2f} {r:>6.3f} "
              f"{predicted_speedup(tau, r):>8.2f}x {predicted:>8.2f}x {paper:>13}{c_ar_grown}")
        if profile:
            from spectrace.measure.roofline import print_roofline
            print_roofline(target, fast_forward_graph(target, kv_len, bs, 1), bs, kv_len)
            print_roofline(target, fast_forward_graph(target, kv_len, bs, n), bs, kv_len, f"a verify of {n} tokens")
            print_roofline(head, fast_forward_graph(head, kv_len, bs, K, H), bs, kv_len,
                           f"a draft level of {K} tokens", unread=(head.fc,))
    return table

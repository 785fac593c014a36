"""`spectrace bench`: tokens/s and τ of algorithms on the built-in prompts, end to end (`run`).

    algos_table   each prompt alone (batch 1), the best of --repeat timed runs per prompt
    batch_table   --batch-sizes: every algorithm at each batch size, and its speed-up over `none`
                  at the same batch. The vLLM chapter (§12.6) says speculation pays less as the
                  batch grows, because verify stops being nearly free once the GPU is busy; this
                  measures it on whatever device and backend the run uses.

`config(algo, prompts, batch, trace)` builds the RunConfig of one run from the command's options.
The first run of each measurement warms up and is not counted.
"""
from __future__ import annotations

from typing import Callable

from spectrace.run import RunConfig, RunResult, run

Config = Callable[..., RunConfig]


def best_run(config: Config, repeat: int, **kw) -> RunResult:
    """The fastest of `repeat` timed runs, after one that warms up."""
    best = None
    for rep in range(repeat + 1):
        res = run(config(**kw))
        if rep and (best is None or res.metrics["wall_s"] < best.metrics["wall_s"]):
            best = res
    return best


def shape_of(algo: str, res: RunResult) -> str:
    sp = res.spec
    return "-" if algo == "none" else f"{sp.num_steps},{sp.topk},{sp.num_draft_tokens}"


def algos_table(config: Config, algos: list[str], prompts: list[str], repeat: int) -> None:
    print(f"{'algo':<14} {'steps,topk,n':>12} {'tokens/s':>9} {'tau':>6} {'alpha':>6} {'verify_ct':>9}")
    for algo in algos:
        tokens = wall = verify = correct = proposed = 0
        for i, prompt in enumerate(prompts):
            res = best_run(config, repeat, algo=algo, prompts=[prompt], batch=None,
                           trace=f"runs/bench/{algo}-{i}.jsonl")
            m = res.metrics
            tokens += m["completion_tokens"]
            wall += m["wall_s"]
            verify += m["verify_ct"]
            correct += m["num_correct_drafts"]
            proposed += m["num_proposed_drafts"]
        tau = f"{tokens / verify:.3f}" if verify else "-"
        alpha = f"{correct / proposed:.3f}" if proposed else "-"
        print(f"{algo:<14} {shape_of(algo, res):>12} {tokens / wall:>9.1f} {tau:>6} {alpha:>6} {verify:>9}")


def batch_table(config: Config, algos: list[str], prompts: list[str], batch_sizes: list[int],
                repeat: int) -> dict[int, dict[str, tuple[float, float | None]]]:
    """At each batch size, one run per algorithm over that many requests (the prompts cycled):
    tokens/s (every request's tokens over the run's wall time), τ, and tokens/s over `none`'s at
    the same batch. Returns {batch: {algo: (tokens/s, τ)}}."""
    algos = ["none"] + [a for a in algos if a != "none"]
    spec_algos = algos[1:]
    head = f"{'batch':>5} {'none tok/s':>10}" + "".join(
        f" | {a + ' tok/s':>14} {'tau':>6} {'speed-up':>8}" for a in spec_algos)
    print(head)
    table = {}
    for bs in batch_sizes:
        row = {}
        for algo in algos:
            m = best_run(config, repeat, algo=algo, prompts=[prompts[i % len(prompts)] for i in range(bs)],
                         batch=bs, trace=f"runs/bench/batch{bs}-{algo}.jsonl").metrics
            row[algo] = (m["tokens_per_s"], m["accept_length"] if algo != "none" else None)
        table[bs] = row
        none_tps = row["none"][0]
        print(f"{bs:>5} {none_tps:>10.1f}" + "".join(
            f" | {row[a][0]:>14.1f} {row[a][1] or 0:>6.3f} {row[a][0] / none_tps:>7.2f}x" for a in spec_algos))
    return table

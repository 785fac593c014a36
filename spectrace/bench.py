"""`spectrace bench`: tokens/s and τ of algorithms on the built-in prompts, end to end (`run`).

    algos_table   each prompt alone (batch 1), the best of --repeat timed runs per prompt
    batch_table   --batch-sizes: every algorithm at each batch size, and its speed-up over `none`
                  at the same batch. The vLLM chapter (§12.6) says speculation pays less as the
                  batch grows, because verify stops being nearly free once the GPU is busy; this
                  measures it on whatever device and backend the run uses.

    hf_table      --compare-hf: transformers' own paths on the same prompts and models: plain
                  `generate`, assisted generation with the embedded draft LM (the library's
                  default schedule, and a constant 4 tokens), and prompt lookup (5 tokens)

`config(algo, prompts, batch, trace)` builds the RunConfig of one run from the command's options.
The first run of each measurement warms up and is not counted.
"""
from __future__ import annotations

import copy
import time
from collections import Counter
from typing import Callable

import torch

from spectrace.core.metrics import predicted_speedup
from spectrace.run import DTYPES, RunConfig, RunResult, load_tokenizer, run

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


def algos_table(config: Config, algos: list[str], prompts: list[str], repeat: int) -> dict[str, list[list[int]]]:
    """Prints a row per algorithm (`none` first when asked for); returns each algorithm's output
    ids, prompt by prompt. Beside tokens/s, τ and α: the mean draft, verify and other (accept,
    commit, extend) ms of a decode step, r = C_draft / C_verify, the seed's predicted speed-up
    τ / (1 + r) and, with `none` in the table, the realised one (tokens/s over none's)."""
    algos = sorted(algos, key=lambda a: a != "none")
    print(f"{'algo':<20} {'steps,topk,n':>12} {'tokens/s':>9} {'tau':>6} {'alpha':>6} {'verify_ct':>9} "
          f"{'draft ms':>8} {'verify ms':>9} {'other ms':>8} {'r':>6} {'tau/(1+r)':>9} {'realised':>8}")
    outputs, none_tps = {}, None
    for algo in algos:
        tokens = wall = verify = correct = proposed = steps = 0
        phase_ms = Counter()
        outputs[algo] = []
        for i, prompt in enumerate(prompts):
            res = best_run(config, repeat, algo=algo, prompts=[prompt], batch=None,
                           trace=f"runs/bench/{algo}-{i}.jsonl")
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
            cells += [f"{'-':>6}", f"{'-':>9}", f"{'-':>8}"]
        else:
            r = c_draft / c_verify
            cells += [f"{r:>6.3f}", f"{predicted_speedup(tokens / verify, r):>8.2f}x",
                      f"{tps / none_tps:>7.2f}x" if none_tps else f"{'-':>8}"]
        print(f"{algo:<20} {shape_of(algo, res):>12} " + " ".join(cells))
    return outputs


def hf_table(config: Config, prompts: list[str], repeat: int) -> dict[str, list[list[int]]]:
    """transformers' generate on the embedded target (and draft LM), greedy, one prompt at a
    time, best of `repeat` timed calls after a warm-up. Prints a row per path with its tokens/s
    and how many prompts gave plain generate's tokens; returns each path's output ids."""
    from transformers import LlamaForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()  # assisted generation warns about its own internal call
    cfg = config(algo="standalone", prompts=prompts[:1], batch=None, trace=None)
    dtype = DTYPES[cfg.dtype] if cfg.dtype else (torch.float32 if cfg.device == "cpu" else torch.bfloat16)
    tok = load_tokenizer(cfg.target_model)
    target = LlamaForCausalLM.from_pretrained(cfg.target_model, dtype=dtype).to(cfg.device).eval()
    draft = LlamaForCausalLM.from_pretrained(cfg.draft_path, dtype=dtype).to(cfg.device).eval()
    constant_4 = copy.deepcopy(draft.generation_config)
    constant_4.update(num_assistant_tokens=4, num_assistant_tokens_schedule="constant",
                      assistant_confidence_threshold=0.0)
    paths = {"hf generate": {}, "hf assisted": {"assistant_model": draft},
             "hf assisted k=4": {"assistant_model": draft, "assistant_config": constant_4},
             "hf prompt lookup": {"prompt_lookup_num_tokens": 5}}
    outputs = {}
    print(f"{'transformers path':<20} {'':>12} {'tokens/s':>9}")
    for name, kw in paths.items():
        default_config = draft.generation_config
        draft.generation_config = kw.pop("assistant_config", default_config)
        tokens = wall = 0
        outputs[name] = []
        for prompt in prompts:
            ids = torch.tensor([tok.encode(prompt)], device=cfg.device)
            best = None
            for rep in range(repeat + 1):
                if cfg.device.startswith("cuda"):
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = target.generate(ids, do_sample=False, max_new_tokens=cfg.max_new_tokens,
                                      pad_token_id=target.generation_config.eos_token_id, **kw)
                if cfg.device.startswith("cuda"):
                    torch.cuda.synchronize()
                if rep and (best is None or time.perf_counter() - t0 < best):
                    best = time.perf_counter() - t0
            outputs[name].append(out[0, ids.shape[1]:].tolist())
            tokens += len(outputs[name][-1])
            wall += best
        draft.generation_config = default_config
        same = sum(a == b for a, b in zip(outputs[name], outputs["hf generate"]))
        print(f"{name:<20} {'-':>12} {tokens / wall:>9.1f}  same tokens as hf generate: {same} of {len(prompts)}")
    return outputs


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

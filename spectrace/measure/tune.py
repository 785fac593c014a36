"""`spectrace tune`: the batch policy (--batch-policy FILE) of one target, drafter and device, from
measured acceptance and measured step costs.

SGLang users pick (steps, topk, n) per batch size with a sweep script that runs every
configuration end to end. Here the step model does the sweeping, from its two measured numbers:

    tau(shape)         the accept length of each candidate shape on the prompts, all of them in one
                       batch: greedy acceptance does not depend on what a request is batched with
    C(shape, bs)       ms a decode step takes with bs requests, end to end (a run's wall time less
                       its prefill, over its steps); C_AR(bs) plain decoding's
    predicted(shape, bs) = plain steps * C_AR(bs) / (speculative steps * C(shape, bs))
                       over the batches of bs requests the prompts make: a static batch steps until
                       its slowest request is done, so a batch takes as many verify steps as its
                       request that needed the most (each request's count from the tau run), where
                       plain decoding takes one a token. At batch 1 this is tau * C_AR / C; in a
                       batch a request that accepts little sets the pace (SGLang's continuous
                       batching refills a finished request's slot; these runs, like bench's, do not)

The best shape per batch size is chosen where it predicts more than plain decoding, drafting off
elsewhere; that policy is written, then each batch size runs plain and with its choice on every
prompt (the prompts cycled to whole batches, as `bench --batch-sizes` runs them), so the printed
table has the realised speed-up beside the predicted one. A choice that ran below plain decoding
is turned off (a prediction within a run's noise of 1.0x can land either side), and the file is
written again: the policy keeps only what paid end to end. --sweep also runs every shape so at
every batch size, which is SGLang's sweep, prints the choice's speed-up over the best of them, and
keeps the best of them (drafting off where none beat plain decoding).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from spectrace.batch_policy import Shape, check_shape
from spectrace.measure.bench import batch_runs, best_run, release
from spectrace.errors import SpectraceError
from spectrace.run import run

# chains of 1 to 7 steps and the trees SGLang users reach for (its Llama default (5, 4, 8) among them)
DEFAULT_SHAPES: tuple[Shape, ...] = ((1, 1, 2), (2, 1, 3), (3, 1, 4), (5, 1, 6), (7, 1, 8), (4, 2, 6), (5, 4, 8),
                                     (6, 8, 16))


def parse_shapes(texts: list[str]) -> list[Shape]:
    """--shapes 5,4,8 3,1,4 ...: each checked as a policy entry is."""
    shapes = []
    for text in texts:
        try:
            value = [int(v) for v in text.split(",")]
        except ValueError:
            raise SpectraceError(f"--shapes: {text!r} is not num_steps,topk,num_draft_tokens") from None
        shapes.append(check_shape(text, value, "--shapes:"))
    return shapes


def shape_options(shape: Shape | None) -> dict:
    steps, topk, n = shape or (None, None, None)
    return dict(num_steps=steps, topk=topk, num_draft_tokens=n)


def step_ms(config: Callable, algo: str, prompts: list[str], tokens: int, repeat: int, loaded: dict,
            shape: Shape | None) -> float:
    """ms a decode step of `prompts` in one batch takes: the wall time of the fastest of `repeat`
    runs (after one that warms up) less its prefill, over its decode steps."""
    m = best_run(config, repeat, loaded, algo=algo if shape else "none", prompts=prompts, batch=None, trace=None,
                 max_new_tokens=tokens, **shape_options(shape)).metrics
    return (m["wall_s"] * 1e3 - m["prefill_ms"]) / max(m["decode_steps"], 1)


def realised(config: Callable, algo: str, prompts: list[str], bs: int, shape: Shape | None, loaded: dict,
             repeat: int) -> float:
    """Tokens/s of every prompt in runs of `bs` requests (plain decoding where `shape` is None),
    each run the fastest of `repeat`, as `bench --batch-sizes` times them."""
    results = [best_run(config, repeat, loaded, algo=algo if shape else "none", prompts=group, batch=bs, trace=None,
                        **shape_options(shape)) for group in batch_runs(prompts, bs)]
    return sum(r.metrics["completion_tokens"] for r in results) / sum(r.metrics["wall_s"] for r in results)


def tune(config: Callable, algo: str, batch_sizes: list[int], shapes, prompts: list[str], cost_tokens: int,
         repeat: int, out: Path, progress: Callable[[str | None], None], what: str, sweep: bool = False) -> dict:
    """Prints tau per shape, the predicted speed-up of each shape at each batch size, the choice and
    its realised speed-up; writes the policy to `out`. sweep: every shape is also run end to end at
    every batch size (SGLang's sweep), the choice is set beside the best of them, and the policy
    keeps the best. Returns the policy written, {batch size: shape or None}."""
    try:
        out.write_text("")  # a path that cannot be written fails before minutes of measuring
    except OSError as e:
        raise SpectraceError(f"cannot write {out}: {e.strerror}") from None
    loaded, taus, steps = {}, {}, {}
    print(f"tune {algo}: {what}: {len(prompts)}, tau at max_new_tokens {config().max_new_tokens}, step costs from "
          f"runs of {cost_tokens} new tokens, best of {repeat}")
    for shape in shapes:
        progress(f"tune: tau of {shape}")
        cfg = config(algo=algo, prompts=prompts, batch=None, trace=None, **shape_options(shape))
        m = run(cfg, loaded=loaded).metrics
        release(cfg.device)
        taus[shape] = m["completion_tokens"] / m["verify_ct"]
        steps[shape] = [(r["completion_tokens"] - 1, r["spec_verify_ct"]) for r in m["per_request"]]  # plain, spec
    print("tau  " + "  ".join(f"{s[0]},{s[1]},{s[2]}: {taus[s]:.3f}" for s in shapes))
    print(f"{'batch':>5} {'C_AR ms':>8} " + " ".join(f"{'%d,%d,%d' % s:>9}" for s in shapes) + "   (predicted speed-up)")
    policy = {}
    for bs in batch_sizes:
        group = [prompts[i % len(prompts)] for i in range(bs)]
        progress(f"tune: step costs at batch {bs}")
        c_ar = step_ms(config, algo, group, cost_tokens, repeat, loaded, None)
        batches = batch_runs(list(range(len(prompts))), bs)  # request indices, as `realised` runs them
        predicted = {}
        for s in shapes:
            plain, spec = (sum(max(steps[s][i][k] for i in b) for b in batches) for k in (0, 1))
            predicted[s] = plain * c_ar / (spec * step_ms(config, algo, group, cost_tokens, repeat, loaded, s))
        best = max(predicted, key=predicted.get)
        policy[bs] = (best if predicted[best] > 1.0 else None, predicted[best])
        progress(None)
        print(f"{bs:>5} {c_ar:>8.3f} " + " ".join(f"{predicted[s]:>8.2f}x" for s in shapes))
    write_policy(out, {bs: shape for bs, (shape, _) in policy.items()})
    print(f"predicted policy written to {out}; confirmed end to end on every prompt"
          + (", beside every shape run end to end (the best fixed one, and the choice against it):" if sweep else ":"))
    print(f"{'batch':>5} {'choice':>8} {'tau':>6} {'predicted':>9} {'realised':>8}"
          + (f" {'best fixed':>10} {'realised':>8} {'choice/best':>11}" if sweep else "") + f" {'policy':>8}")
    kept = {}
    for bs, (shape, pred) in policy.items():
        progress(f"tune: confirming batch {bs}")
        plain = realised(config, algo, prompts, bs, None, loaded, repeat)
        run_shapes = shapes if sweep else [shape] if shape else []
        fixed = {s: realised(config, algo, prompts, bs, s, loaded, repeat) / plain for s in run_shapes}
        ratio = fixed[shape] if shape else 1.0
        kept[bs] = shape if ratio >= 1.0 else None  # a choice that ran below plain decoding: off
        progress(None)
        row = (f"{bs:>5} {name(shape):>8} {taus[shape] if shape else 1.0:>6.3f} "
               f"{pred if shape else 1.0:>8.2f}x {ratio:>7.2f}x")
        if sweep:  # drafting off is a fixed choice too: the best of the shapes and plain decoding
            best = max(fixed, key=fixed.get)
            kept[bs] = best if fixed[best] > 1.0 else None
            best_ratio = max(fixed[best], 1.0)
            row += f" {name(kept[bs]):>10} {best_ratio:>7.2f}x {ratio / best_ratio:>10.3f}"
        print(row + f" {name(kept[bs]):>8}")
    write_policy(out, kept)
    print(f"policy written to {out}: what paid end to end")
    return kept


def name(shape: Shape | None) -> str:
    return "%d,%d,%d" % shape if shape else "off"


def write_policy(out: Path, table: dict) -> None:
    """{batch size: shape or None} as the JSON object `--batch-policy FILE` reads."""
    out.write_text(json.dumps({str(bs): list(s) if s else "off" for bs, s in table.items()}, indent=1) + "\n")

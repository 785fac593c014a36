"""A batch policy (--batch-policy): the speculative shape chosen by the batch size, drafting off
where it cannot pay.

A draft tree of n nodes per request makes the verify a forward of bs * n rows. At batch 1 those
rows are free (the forward costs its kernel launches, or its weight reads on a large model), so a
wide tree pays; as the batch grows the verify's matrix products stop being free and the draft
loop's work grows with it, so the tree that pays shrinks, and at some batch none does. SGLang
keys its adaptive steps on the batch size for this reason (`adaptive_spec_params.py`, the
per-batch-size version: `DEFAULT_ADAPTIVE_CONFIG` maps batch sizes 1, 8, 32 and 64 to candidate
steps [1, 3, 5, 7], [0, 1, 3], [0, 1] and [0], where 0 steps means no drafting). That table feeds
its EMA over chains (topk 1); the policy here is the simpler half of it: each batch-size entry
fixes one shape, a tree allowed, or `off`.

    {"1": [5, 4, 8], "8": [3, 1, 4], "32": "off"}   # (num_steps, topk, num_draft_tokens) per batch

A run takes the entry of the largest batch size not above its own number of requests. The fast
engine's graphs keep the batch they were captured with as requests finish, so the choice is made
once, when the run starts (SGLang decides per forward, on the running batch).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from spectrace.algos import ALGOS
from spectrace.core.tree import tree_capacity
from spectrace.errors import SpectraceError

Shape = tuple[int, int, int]  # (num_steps, topk, num_draft_tokens)

# `auto`: the embedded pair's policy by device (docs/kernel-budget.md, "A batch policy"): on a GPU
# from `spectrace tune --device cuda --backend fast` for eagle and for eagle3 on an H100: the chain
# (2, 1, 3) at batches 2 and 3, which both tunes put above plain decoding at batch 2, and drafting
# off elsewhere (plain decoding of the tiny target, 1-16 rows through the GEMVs, was within 1% of
# every shape at batch 1, and from batch 4 no shape stayed above it for both); on a CPU the shape
# that was fastest for both with the explicit engine, where the draft head's forward is not cheap
# beside the target's.
EMBEDDED = {"cuda": {1: None, 2: (2, 1, 3), 4: None},
            "cpu": {1: (1, 1, 2)}}

# the algorithms whose shape is (num_steps, topk, num_draft_tokens); the others' drafters fix theirs
APPLIES_TO = tuple(name for name, algo in ALGOS.items() if algo.shaped)


@dataclass(frozen=True)
class BatchPolicy:
    table: dict[int, Shape | None]  # smallest batch size -> shape, or None: drafting off

    def shape_for(self, batch: int) -> Shape | None:
        """The entry of the largest batch size not above `batch` (the smallest entry below it)."""
        below = [b for b in self.table if b <= batch]
        return self.table[max(below) if below else min(self.table)]

    def describe(self, batch: int) -> str:
        shape = self.shape_for(batch)
        return f"batch {batch}: " + ("drafting off" if shape is None else "({}, {}, {})".format(*shape))


class _Pairs(list):
    """A JSON object as the list of its (key, value) pairs, in order."""


def parse_policy(text: str, device: str = "cuda") -> BatchPolicy:
    """`auto` (the embedded pair's table for the device), a JSON object, or a file holding one."""
    if text == "auto":
        return BatchPolicy(EMBEDDED["cpu" if device == "cpu" else "cuda"])
    source = text
    if not text.lstrip().startswith(("{", "[")):  # a file's name
        try:
            source = Path(text).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise SpectraceError(f"--batch-policy {text}: not auto, a JSON object or a file holding one "
                                 f"({getattr(e, 'strerror', None) or e})") from None
    try:  # an object as its (key, value) pairs: a key given twice is refused, not the last one kept
        raw = json.loads(source, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as e:
        raise SpectraceError(f"--batch-policy: not auto, a JSON object or a file holding one ({e.msg})") from None
    if not isinstance(raw, _Pairs) or not raw:
        raise SpectraceError('--batch-policy: expected an object of batch sizes, e.g. {"1": [5, 4, 8], "32": "off"}')
    table = {}
    for key, value in raw:
        if not (key.isascii() and key.isdigit() and int(key) >= 1):
            raise SpectraceError(f"--batch-policy: {key!r} is not a batch size (a whole number from 1)")
        if int(key) in table:
            raise SpectraceError(f"--batch-policy: batch size {int(key)} is given twice")
        value = dict(value) if isinstance(value, _Pairs) else value
        table[int(key)] = None if value == "off" else check_shape(key, value)
    return BatchPolicy(table)


def check_shape(key: str, value, where: str = "--batch-policy: batch") -> Shape:
    """A shape as SpecConfig accepts it: steps and topk from 1, a tree of 2 to 1 + tree_capacity
    nodes, a chain (topk 1) of num_steps + 1. `where` begins the error line."""
    if not (isinstance(value, list) and len(value) == 3 and all(type(v) is int and v >= 1 for v in value)):
        raise SpectraceError(f'{where} {key} needs [num_steps, topk, num_draft_tokens] or "off", '
                             f"got {json.dumps(value)}")
    steps, topk, n = value
    if not 2 <= n <= 1 + tree_capacity(topk, steps) or (topk == 1 and n != steps + 1):
        raise SpectraceError(f"{where} {key}: {n} draft tokens do not fit a tree of {steps} steps "
                             f"and topk {topk} (2 to {1 + tree_capacity(topk, steps)}; a chain takes num_steps + 1)")
    return steps, topk, n


# ---- a run under a policy (spectrace.run) -------------------------------------------------------

def check(cfg) -> None:
    """RunConfig.check's part: the policy parses, and it is the only thing choosing the shape."""
    if cfg.algo not in APPLIES_TO:
        raise SpectraceError(f"--batch-policy chooses (num_steps, topk, num_draft_tokens): --algo {cfg.algo} has no "
                             f"such shape (it applies to {', '.join(APPLIES_TO)})")
    shape = [f for f in ("num_steps", "topk", "num_draft_tokens") if getattr(cfg, f) is not None]
    if shape or cfg.adaptive:
        flag = "--speculative-adaptive" if cfg.adaptive else "--" + shape[0].replace("_", "-")
        raise SpectraceError(f"--batch-policy chooses the shape by the batch size: drop {flag}")
    parse_policy(cfg.batch_policy)


def apply(cfg, batch: int):
    """The RunConfig as the policy makes it for `batch` requests: the chosen shape, or plain
    decoding (no drafter loaded) where the policy turns drafting off."""
    if cfg.batch_policy is None:
        return cfg
    shape = parse_policy(cfg.batch_policy, cfg.device).shape_for(batch)
    if shape is None:
        return replace(cfg, algo="none", draft_model=None)
    return replace(cfg, num_steps=shape[0], topk=shape[1], num_draft_tokens=shape[2])


def choice(asked, batch: int) -> str | None:
    """The summary's line: what the policy chose for the run asked for."""
    if asked.batch_policy is None:
        return None
    policy = parse_policy(asked.batch_policy, asked.device)
    return f"--batch-policy {asked.batch_policy}, {asked.algo} on {asked.device} at {policy.describe(batch)}"


def header(asked, spec, batch: int) -> dict:
    """The trace header's `batch_policy`: the policy, the algorithm asked for, the batch, the shape
    chosen (None: drafting off)."""
    return {"policy": asked.batch_policy, "algo": asked.algo, "batch": batch,
            "shape": None if spec.algo == "none" else [spec.num_steps, spec.topk, spec.num_draft_tokens]}

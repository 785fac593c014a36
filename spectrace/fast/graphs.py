"""CUDA graphs as SGLang's graph runners use them: batch buckets, capture of named phases, and
timing without a sync.

    BUCKETS / bucket     the batch sizes a run is padded up to, one set of graphs each
    launch_groups        which phases share a graph (DRAFT; VERIFY + ACCEPT + COMMIT; EXTEND)
    capture              warm the phases up on a side stream (Triton compiles there), then
                         capture each, in order, into its own graph; a phase reads the tensors
                         the phases before it left in their capture, and a replay rewrites them
    replay_ms            median milliseconds of a captured graph's replays (CUDA events)
    PhaseClock           a phase's time without a sync: CUDA events, read once the step is back
    Tier                 one step shape's graphs and the static tensors they read and write
On a CPU nothing is captured: the same phases run eagerly.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from spectrace.core.model import RotaryEmbedding
from spectrace.errors import SpectraceError
from spectrace.fast.acceptance import Verdict
from spectrace.fast.sampling import DeviceRandoms
from spectrace.fast.tree import DeviceTree

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# a CUDA graph per group of phases (a drafter on the host, or none: DRAFT joins VERIFY's graph)
LAUNCHES = (("draft", ("draft",)), ("verify", ("verify", "accept", "commit")), ("extend", ("extend",)))
HOST_LAUNCHES = (("verify", ("draft", "verify", "accept", "commit")),)
PHASES = ("draft", "verify", "accept", "commit", "extend")


def launch_groups(drafter, per_phase: bool) -> tuple:
    """(launch name, its phases) in order. per_phase (bench --profile): a graph per phase, so each
    phase's kernels are counted and timed apart; a drafter on the host drafts outside the graphs."""
    if not per_phase:
        return HOST_LAUNCHES if drafter is None or drafter.on_host else LAUNCHES
    names = [p for p in PHASES if (drafter is not None or p != "extend") and not (p == "draft" and drafter
                                                                                  and drafter.on_host)]
    return tuple((name, (name,)) for name in names)


def check_batch(batch: int) -> None:
    """One line for a batch over the largest bucket."""
    if batch > BUCKETS[-1]:
        raise SpectraceError(f"--backend fast captures batches of at most {BUCKETS[-1]} requests, not {batch}")


def bucket(batch: int) -> int:
    return next(b for b in BUCKETS if b >= batch)


def place_rotary(model, device) -> None:
    """RoPE's frequencies onto the device: a plain float32 attribute that model.to() leaves on the
    host, copied at every forward, and a CUDA graph cannot copy from the host."""
    for m in model.modules():
        if isinstance(m, RotaryEmbedding):
            m.inv_freq = m.inv_freq.to(device)


def capture(phases: list[tuple[str, Callable[[], None]]], warmup: int = 2) -> dict[str, torch.cuda.CUDAGraph]:
    """One graph per (name, fn), captured in order after `warmup` eager rounds of them all."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            for _, fn in phases:
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    graphs = {}
    for name, fn in phases:
        graphs[name] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[name]):
            fn()
    return graphs


def replay_ms(graph: torch.cuda.CUDAGraph, repeat: int, before: Callable[[], None] | None = None) -> float:
    """Median milliseconds of `repeat` replays (after one that warms up), each timed with CUDA
    events; before(): run ahead of each replay, untimed (e.g. an L2 flush)."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeat + 1)]
    for start, end in events:
        if before is not None:
            before()
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events[1:])


class PhaseClock:
    """Phase times without a sync: CUDA events, read once the step's tokens have arrived; on a
    CPU, the clock. `run` returns the phase's marks, `read` their milliseconds."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def run(self, fn) -> tuple:
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return t0, time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        return start, end

    def read(self, marks: dict[str, tuple]) -> dict[str, float]:
        if self.cuda:
            return {k: round(s.elapsed_time(e), 3) for k, (s, e) in marks.items()}
        return {k: round((e - s) * 1000, 3) for k, (s, e) in marks.items()}


@dataclass
class Tier:
    """One step shape (an adaptive tier, or the run's only one): its random-number buffers, its
    graphs, and what its phases leave, which the next phase (and a replay) reads."""

    num_steps: int
    num_draft_tokens: int
    randoms: DeviceRandoms
    graphs: dict | None = None
    tree: DeviceTree | None = None
    logits: torch.Tensor | None = None  # (bs * n, V)
    features: torch.Tensor | None = None  # (bs * n, F) what the drafters read of the target
    target_predict: torch.Tensor | None = None  # (bs * n,)
    verdict: Verdict | None = None
    step_out: torch.Tensor | None = None  # what the host reads: accept_tokens, [sibling counts], accept_num

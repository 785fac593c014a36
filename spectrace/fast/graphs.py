"""CUDA graphs as SGLang's graph runners use them: batch buckets, the step's launch groups,
their capture, and timing without a sync.

    BUCKETS / bucket     the batch sizes a run is padded up to, one set of graphs each
    Phase                a step's phases, which StepRunner.step enters by name
    launch_groups        which of a step's phases share a graph (DRAFT; VERIFY + ACCEPT + COMMIT;
                         EXTEND); with_record: a recording run's pack joins the last
    PhaseGroups          the context each phase of StepRunner.step runs in: a group's context
                         (a graph's capture, or an eager launch on the clock) is entered at its
                         first phase and left after its last
    capture_step         the step warmed up on a side stream (Triton compiles there), then run
                         once under capture: a graph per launch group; `capture` likewise for
                         one function (the prefill); an engine's graphs share one memory pool
    replay_ms            median milliseconds of a captured graph's replays (CUDA events)
    PhaseClock           a group's time without a sync: CUDA events, read once the step is back
    Launched             a step on its way: its clock marks, its host row's copy, its draws
    StepOutputs, Tier    what a step leaves on the device; one step shape's graphs, random-number
                         buffers, and the outputs its graphs rewrite on every replay
On a CPU nothing is captured: the step runs eagerly.
"""
from __future__ import annotations

import enum
import statistics
import time
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable

import torch

from spectrace.core.model import RotaryEmbedding
from spectrace.errors import SpectraceError
from spectrace.fast.acceptance import Verdict
from spectrace.fast.sampling import DeviceRandoms
from spectrace.fast.tree import DeviceTree

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class Phase(enum.Enum):
    """The phases of StepRunner.step in the order it runs them; RECORD, a recording run's pack of
    the step's tensors (fast/step_record.py); FORWARD, a function captured whole (`capture`)."""
    DRAFT = "draft"
    VERIFY = "verify"
    ACCEPT = "accept"
    COMMIT = "commit"
    EXTEND = "extend"
    RECORD = "record"
    FORWARD = "forward"


STEP = (Phase.DRAFT, Phase.VERIFY, Phase.ACCEPT, Phase.COMMIT, Phase.EXTEND)
# a CUDA graph per group of phases; a drafter on the host, or none: DRAFT joins VERIFY's graph, and
# no EXTEND
LAUNCHES = (("draft", (Phase.DRAFT,)), ("verify", (Phase.VERIFY, Phase.ACCEPT, Phase.COMMIT)),
            ("extend", (Phase.EXTEND,)))
HOST_LAUNCHES = (("verify", (Phase.DRAFT, Phase.VERIFY, Phase.ACCEPT, Phase.COMMIT)),)


def launch_groups(drafter, per_phase: bool) -> tuple:
    """(launch name, its phases) in order. per_phase (bench --profile): a group per phase, so each
    phase's kernels are counted and timed apart (a host drafter's device part, which builds the
    tree from what the host uploaded, inside VERIFY's)."""
    on_device = drafter is not None and not drafter.drafts_on_host
    if not per_phase:
        return LAUNCHES if on_device else HOST_LAUNCHES
    groups = tuple((p.value, (p,)) for p in STEP[:5 if on_device else 4])
    return (groups if on_device or drafter is None
            else (("verify", (Phase.DRAFT, Phase.VERIFY)),) + groups[2:])


def with_record(groups: tuple) -> tuple:
    """The launch groups with a recording run's pack (fast/step_record.py) last in the last one."""
    *before, (name, phases) = groups
    return (*before, (name, (*phases, Phase.RECORD)))


def eager(phase: Phase):
    """The `phase` context of a step run outside any launch group: each phase just runs."""
    return nullcontext()


class PhaseGroups:
    """The `phase(Phase)` context of StepRunner.step: `group(launch name)`, a context manager, is
    entered at the first phase of each launch group and left after its last. A phase that is in
    no group, or entered out of its group's order, raises: on a GPU it would run in no graph."""

    def __init__(self, groups: tuple, group: Callable):
        order = [p for _, phases in groups for p in phases]
        if len(set(order)) < len(order):
            raise ValueError(f"a phase is in two launch groups: {groups}")
        self.next = {p: order[i + 1] if i + 1 < len(order) else None for i, p in enumerate(order)}
        self.first = {phases[0]: name for name, phases in groups}
        self.last = {phases[-1] for _, phases in groups}
        self.group, self.open, self.groups, self.expected = group, ExitStack(), groups, None

    @contextmanager
    def __call__(self, phase: Phase):
        if phase not in self.next:
            raise LookupError(f"{phase} is in no launch group {self.groups}: "
                              f"on a GPU it would run in no graph")
        if phase not in self.first and phase is not self.expected:
            raise LookupError(f"{phase} runs outside its launch group's order {self.groups}")
        if phase in self.first:
            self.open.enter_context(self.group(self.first[phase]))
        try:
            yield
        except BaseException:
            self.open.close()
            raise
        self.expected = self.next[phase]
        if phase in self.last:
            self.open.close()


def check_batch(batch: int) -> None:
    """One line for a batch over the largest bucket."""
    if batch > BUCKETS[-1]:
        raise SpectraceError(f"--backend fast captures batches of at "
                             f"most {BUCKETS[-1]} requests, not {batch}")


def bucket(batch: int) -> int:
    return next(b for b in BUCKETS if b >= batch)


def place_rotary(model, device) -> None:
    """RoPE's frequencies onto the device: a plain float32 attribute that model.to() leaves on the
    host, copied at every forward, and a CUDA graph cannot copy from the host."""
    for m in model.modules():
        if isinstance(m, RotaryEmbedding):
            m.inv_freq = m.inv_freq.to(device)


def capture(fn: Callable[[], object], warmup: int = 2, pool=None) -> torch.cuda.CUDAGraph:
    """fn as one graph (the prefill, a benchmark's forward), captured as capture_step captures."""
    def step(phases):
        with phases(Phase.FORWARD):
            fn()
    return capture_step(step, (("forward", (Phase.FORWARD,)),), warmup, pool)[0]["forward"]


def capture_step(step: Callable, groups: tuple, warmup: int = 2, pool=None):
    """step(phases) run `warmup` times eagerly on a side stream, then once under capture with a
    graph per launch group (PhaseGroups): -> (graphs in launch order, what the captured step
    returned, which its graphs rewrite on every replay). pool: a memory pool the graphs share
    (torch.cuda.graph_pool_handle(); None: a private one each)."""
    graphs = {}

    @contextmanager
    def captured(name):
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool=pool)
        try:
            yield
        finally:
            graph.capture_end()
        graphs[name] = graph

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            step(PhaseGroups(groups, lambda name: nullcontext()))
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        outputs = step(PhaseGroups(groups, captured))
    torch.cuda.current_stream().wait_stream(stream)
    return graphs, outputs


def replay_ms(graph: torch.cuda.CUDAGraph, repeat: int,
              before: Callable[[], None] | None = None) -> float:
    """Median milliseconds of `repeat` replays (after one that warms up), each timed with CUDA
    events; before(): run ahead of each replay, untimed (e.g. an L2 flush)."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeat + 1)]
    for start, end in events:
        if before is not None:
            before()
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events[1:])


class PhaseClock:
    """Launch groups' times without a sync: CUDA events, read once the step's tokens have
    arrived; on a CPU, the clock. `timed(marks, name)` marks a launch (inside the probe's
    `phase(name)` where bench --profile gives one), `read` gives milliseconds."""

    def __init__(self, device: torch.device, probe=None):
        self.cuda, self.probe = device.type == "cuda", probe

    @contextmanager
    def timed(self, marks: dict, name: str):
        with self.probe.phase(name) if self.probe else nullcontext():
            if not self.cuda:
                t0 = time.perf_counter()
                yield
                marks[name] = (t0, time.perf_counter())
                return
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            marks[name] = (start, end)

    def read(self, marks: dict[str, tuple]) -> dict[str, float]:
        if self.cuda:
            return {k: round(s.elapsed_time(e), 3) for k, (s, e) in marks.items()}
        return {k: round((e - s) * 1000, 3) for k, (s, e) in marks.items()}


def to_host(t: torch.Tensor,
            landing: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """t on its way to the host without waiting: a pinned copy (landing: where a copy already
    enqueued brings it, a recording step's Pack) and the event after which it has landed (on a
    CPU: a clone, there at once)."""
    if not t.is_cuda:
        return t.clone(), None
    host = landing
    if host is None:
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return host, done


@dataclass
class Launched:
    """A step on its way (FastEngine.launch), what finish_step reads once it has arrived."""

    marks: dict  # launch group -> its clock marks
    row: torch.Tensor  # the host row, on the host (pinned; filled once `done` has passed)
    done: torch.cuda.Event | None  # None on a CPU: the row is there already
    copied: object | None  # the recorder's Pack of the step's tensors (fast/frames.py)
    sizes: list[int]  # nodes of each request's tree (n-gram's vary; 1: plain decoding)
    randoms: list | None  # each request's draws (None: greedy)


@dataclass
class StepOutputs:
    """What one step leaves on the device (StepRunner.step): the DRAFT tree, VERIFY's logits, argmax
    and features, ACCEPT's verdict and the host row. A captured step's are its graphs' outputs,
    rewritten on every replay."""

    tree: DeviceTree
    logits: torch.Tensor  # (bs * n, V)
    target_predict: torch.Tensor  # (bs * n,)
    features: torch.Tensor  # (bs * n, F) what the drafters read of the target
    verdict: Verdict
    host_row: torch.Tensor  # (bs, W + 1 [+ 2 topk]): accept_tokens, [sibling counts,] accept_num


@dataclass
class Tier:
    """One step shape (an adaptive tier, or the run's only one): its random-number buffers, and
    once captured its graphs and the outputs they rewrite (SGLang's graph runners' static
    buffers)."""

    num_steps: int
    num_draft_tokens: int
    randoms: DeviceRandoms
    graphs: dict | None = None
    outputs: StepOutputs | None = None

"""`spectrace bench --profile`: where a fast-engine step goes, phase by phase, in kernels.

The embedded pair's weights (about 15 MB) sit in an H200's L2, so a step there costs what its
kernels cost to launch and run, about 1-1.5 µs a small one inside a CUDA graph, 2.5 µs a GEMM,
4 µs the attention kernel, whatever arithmetic they do. The speed-up τ·C_AR / (C_draft + C_verify
+ C_extend) is then, to first order, counted in kernels (docs/kernel-budget.md).

    KernelCounter   --device cpu: the kernels each phase would launch on a GPU, counted as the
                    same code runs interpreted: every torch operator that launches one (views
                    and allocations do not) and every Triton launch
    CudaProfiler    --device cuda: the kernels each phase's CUDA graph replays, from
                    torch.profiler (CUPTI): how many, and their summed GPU time
Both are the engine's probe: with one, every phase is a launch (a graph) of its own and runs
inside `probe.phase(name)`. Work outside the phases during the decode loop (the step's tokens
to the host, the live mask to the device) is the "host" row.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from spectrace.errors import SpectraceError

PHASES = ("draft", "verify", "accept", "commit", "extend", "host")
# operators that launch no kernel: allocations and metadata (views are skipped by OpOverload.is_view)
NO_KERNEL = {"empty", "empty_strided", "new_empty", "new_empty_strided", "detach", "lift_fresh", "alias",
             "_unsafe_view", "set_", "resize_", "sym_size", "sym_stride", "sym_numel", "record_stream",
             "_reshape_alias", "is_pinned", "_pin_memory", "empty_like", "scalar_tensor"}


class KernelCounter(TorchDispatchMode):
    """Counts, per phase, the operators and Triton launches a phase runs (kernel name -> launches).
    A phase's first launch is not counted: it fills the caches a GPU fills in its graph's warm-up
    (fast/batch.py: ramp), which no replay launches again."""

    def __init__(self):
        super().__init__()
        self.kernels: dict[str, Counter] = defaultdict(Counter)
        self.launches: Counter = Counter()  # how many times each phase was counted
        self.seen: Counter = Counter()
        self.current, self.in_triton = None, False

    @contextmanager
    def phase(self, name: str):
        self.seen[name] += 1
        if self.seen[name] == 1:  # the warm-up launch
            yield
            return
        self.current = name
        self.launches[name] += 1
        with self, _triton_launches(self.triton_launch):
            yield
        self.current = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.in_triton and not func.is_view and name not in NO_KERNEL:
            self.kernels[self.current][f"aten::{name}"] += 1
        return func(*args, **(kwargs or {}))

    def triton_launch(self, fn, run, *args, **kwargs):
        self.kernels[self.current][f"triton::{fn.__name__}"] += 1
        self.in_triton = True  # the interpreter's own tensor work is the kernel's, not more kernels
        try:
            return run(*args, **kwargs)
        finally:
            self.in_triton = False

    def result(self) -> dict:
        return {"kernels": {phase: dict(c) for phase, c in self.kernels.items()}, "gpu_us": {},
                "launches": dict(self.launches)}


@contextmanager
def _triton_launches(hook):
    """Every Triton kernel launch (compiled or interpreted) through hook(fn, run, *args, **kwargs)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    saved = {cls: cls.run for cls in (JITFunction, InterpretedFunction)}
    for cls, run in saved.items():
        def counted(self, *args, _run=run, **kwargs):
            return hook(self, lambda *a, **k: _run(self, *a, **k), *args, **kwargs)
        cls.run = counted
    try:
        yield
    finally:
        for cls, run in saved.items():
            cls.run = run


class CudaProfiler:
    """Each phase inside a torch.profiler range; after the run (`stop`), every kernel the GPU ran
    (a graph replay's too) is put under the phase whose range launched it, or "host"."""

    def __init__(self):
        self.kernels: dict[str, Counter] = defaultdict(Counter)
        self.gpu_us: dict[str, Counter] = defaultdict(Counter)
        self.launches: Counter = Counter()
        self.prof = None

    @contextmanager
    def phase(self, name: str):
        if self.prof is None:  # from the first step on: the prefill and the graph captures are not profiled
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                           torch.profiler.ProfilerActivity.CUDA])
            self.prof.start()
        self.launches[name] += 1
        with torch.profiler.record_function(f"spectrace:{name}"):
            yield

    def stop(self) -> None:
        """The run is over: its kernels into the phases' counts. A kernel belongs to the phase whose
        range was open when the host launched it: matched through CUPTI's correlation id to its
        launch call (cudaLaunchKernel, cudaGraphLaunch for every kernel of a graph's replay)."""
        if self.prof is None:
            return
        torch.cuda.synchronize()
        self.prof.stop()
        events = list(self.prof.profiler.kineto_results.events())
        cpu, gpu = [], []
        for e in events:
            (cpu if e.device_type() == torch.autograd.DeviceType.CPU else gpu).append(e)
        ranges = sorted((e.start_ns(), e.end_ns(), e.name().removeprefix("spectrace:")) for e in cpu
                        if e.name().startswith("spectrace:"))
        launched_at = {e.correlation_id(): e.start_ns() for e in cpu if e.name().startswith("cuda")}
        for e in gpu:
            if e.name().startswith("spectrace:"):  # the ranges' own GPU-side spans
                continue
            t = launched_at.get(e.correlation_id())
            phase = next((name for start, end, name in ranges if t is not None and start <= t <= end), "host")
            self.kernels[phase][e.name()] += 1
            self.gpu_us[phase][e.name()] += e.duration_ns() / 1000
        self.prof = None

    def result(self) -> dict:
        if not self.kernels:
            raise SpectraceError("torch.profiler recorded no GPU kernels (is CUPTI available?)")
        return {"kernels": {p: dict(c) for p, c in self.kernels.items()},
                "gpu_us": {p: dict(c) for p, c in self.gpu_us.items()}, "launches": dict(self.launches)}


def per_step(result: dict) -> dict:
    """Kernels (and GPU µs) per launch of each phase; "host" per step; "total" per step."""
    steps = max(result["launches"].get("verify", 0), 1)
    rows = {}
    for phase in PHASES:
        kernels = result["kernels"].get(phase, {})
        if phase != "host" and phase not in result["launches"]:
            continue
        n = result["launches"].get(phase, steps)
        rows[phase] = {"kernels": round(sum(kernels.values()) / n, 1),
                       "gpu_us": round(sum(result["gpu_us"].get(phase, {}).values()) / n, 1)}
    rows["total"] = {k: round(sum(r[k] for r in rows.values()), 1) for k in ("kernels", "gpu_us")}
    return rows


def top_kernels(result: dict, k: int = 10) -> list[dict]:
    """The k kernels launched most often in a step, with their mean GPU µs."""
    steps = max(result["launches"].get("verify", 0), 1)
    counts, us = Counter(), Counter()
    for phase, kernels in result["kernels"].items():
        counts.update(kernels)
        us.update(result["gpu_us"].get(phase, {}))
    return [{"kernel": name, "per_step": round(n / steps, 1), "us_each": round(us[name] / n, 2) if us else None}
            for name, n in counts.most_common(k)]


def by_phase(result: dict) -> dict:
    """Every kernel of each phase: launches per launch of the phase, and mean GPU µs (None counted
    on the CPU), most frequent first."""
    out = {}
    for phase, kernels in result["kernels"].items():
        n = result["launches"].get(phase, max(result["launches"].get("verify", 0), 1))
        us = result["gpu_us"].get(phase, {})
        out[phase] = [{"kernel": name, "per_launch": round(c / n, 2), "us_each": round(us[name] / c, 2) if us else None}
                      for name, c in Counter(kernels).most_common()]
    return out


def profile_algo(config, algo: str, prompts: list[str], device: str) -> dict:
    """One algorithm over the prompts, each alone, under a probe: its per-step rows, its top
    kernels, and (on a GPU) the wall ms of a step of an unprofiled run of the same prompts."""
    from spectrace.run import run

    probe = CudaProfiler() if device.startswith("cuda") else KernelCounter()
    steps = wall = tokens = 0
    for prompt in prompts:
        cfg = config(algo=algo, prompts=[prompt], batch=None, trace=None, trace_level="off")
        if device.startswith("cuda"):  # the speed of the same run, unprofiled (after a warm-up)
            run(cfg)
            m = run(cfg).metrics
            steps, wall, tokens = steps + m["decode_steps"], wall + m["wall_s"], tokens + m["completion_tokens"]
        run(cfg, probe=probe)
        if isinstance(probe, CudaProfiler):
            probe.stop()
    result = probe.result()
    out = {"algo": algo, "phases": per_step(result), "top_kernels": top_kernels(result),
           "kernels_by_phase": by_phase(result)}
    if steps:
        out["wall_ms_per_step"] = round(wall * 1000 / steps, 3)
        out["tokens_per_s"] = round(tokens / wall, 1)
    return out


def profile_table(config, algos: list[str], prompts: list[str], device: str, json_path: str | None = None,
                  progress=lambda m: None) -> list[dict]:
    """Prints, per algorithm, a row per phase (kernels and GPU µs per step) and its ten most
    frequent kernels; writes them all to json_path when given."""
    cuda = device.startswith("cuda")
    if not cuda:  # a step launches the same kernels whatever its prompt: one prompt, interpreted, is enough
        prompts = prompts[:1]
        print("counted on the CPU (interpreted): the kernels a GPU step would launch, first prompt only")
    results = []
    print(f"{'algo':<14} {'phase':<8} {'kernels/step':>12}" + (f" {'GPU us/step':>11}" if cuda else ""))
    for algo in algos:
        progress(f"bench --profile: {algo}")
        res = profile_algo(config, algo, prompts, device)
        results.append(res)
        progress(None)
        for i, (phase, row) in enumerate(res["phases"].items()):
            cells = f"{row['kernels']:>12.1f}" + (f" {row['gpu_us']:>11.1f}" if cuda else "")
            print(f"{algo if i == 0 else '':<14} {phase:<8} {cells}")
        if "wall_ms_per_step" in res:
            print(f"{'':<14} wall ms per step (unprofiled) {res['wall_ms_per_step']:.3f}, "
                  f"{res['tokens_per_s']:.1f} tokens/s")
    for res in results:
        print(f"most frequent kernels, {res['algo']} (per step" + (", µs each)" if cuda else ")"))
        for row in res["top_kernels"]:
            us = f" {row['us_each']:>7.2f}" if row["us_each"] is not None else ""
            print(f"  {row['per_step']:>6.1f}{us}  {row['kernel'][:100]}")
    if json_path:
        try:
            Path(json_path).write_text(json.dumps({"device": device, "algos": results}, indent=1) + "\n")
        except OSError as e:
            raise SpectraceError(f"cannot write --json {json_path}: {e.strerror}") from None
    return results

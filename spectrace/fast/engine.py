"""The fast engine (`--backend fast`): core/engine.py's speculative step with the whole batch on
the device, the Triton twins for attention, tree build and the walks, and CUDA graphs as SGLang
captures them. Split as nano-vllm splits LLMEngine and ModelRunner:

    fast/runner.py   StepRunner: the device half, graph-safe: the step's tensors, the tiers'
                     graphs, `step` (DRAFT, VERIFY, ACCEPT, COMMIT, EXTEND)
    here             FastEngine: the host loop: requests, the prefill's bookkeeping, a step
                     launched ahead of the last one's reading, RECORD after the step's one sync
                     (EOS and lengths, metrics, the step's trace frame)

The loop's optional parts are objects with a do-nothing default, so it reads as one loop: the
recorder (NoRecorder), the adaptive tiers (FixedSteps), the host drafter of n-gram (NoHostDrafts)
and tree_rejection's sibling ranks (fast/acceptance/tree_rejection.py: NoRanks). A step's state
is tensors over the batch bucket, (bs, ...), on the device; finished requests stay in their row,
frozen: the runner's `live` masks their commits.
"""
from __future__ import annotations

import time
from contextlib import nullcontext

import torch

from spectrace.core.acceptance import RULES
from spectrace.core.adaptive import AdaptiveSpeculativeParams
from spectrace.core.request import Request, append_tokens
from spectrace.core.metrics import SpecMetrics
from spectrace.core.probs import ProbsRecorder
from spectrace.core.sampling import request_generator
from spectrace.core.spec import SpecConfig
from spectrace.core.trace import TraceWriter
from spectrace.errors import SpectraceError
from spectrace.fast.acceptance.tree_rejection import NoRanks, SiblingRanks, ranked
from spectrace.fast.graphs import Launched, PhaseClock, Tier, to_host
from spectrace.fast.kv import StaticKV
from spectrace.fast.runner import StepRunner
from spectrace.fast.sampling import DeviceRandoms
from spectrace.fast.step_record import Kept, NoRecorder, StepRecorder


class FixedSteps:
    """The tiers of a run that does not adapt: one, never switched."""

    def step(self, accept_nums: list[int]) -> None:
        return None


class NoHostDrafts:
    """The host part of a drafter that drafts on the device (or of plain decoding): nothing."""

    drafts_on_host = False

    def host_prefill(self, reqs: list[Request]) -> None:
        pass

    def host_draft(self, reqs: list[Request]) -> None:
        pass

    def host_extend(self, reqs: list[Request], rows: list[list[int]]) -> None:
        pass

    def sizes_for(self, reqs: list[Request], tier: Tier) -> list[int]:
        """Nodes of each request's tree: the tier's, every one."""
        return [tier.num_draft_tokens] * len(reqs)


class FastEngine:
    def __init__(self, target, kv: StaticKV, spec: SpecConfig, drafter, prompt_ids: list[list[int]],
                 eos_token_ids, trace: TraceWriter | None = None, on_step=None,
                 probs: ProbsRecorder | None = None, graphs: bool | None = None, probe=None):
        """kv: the target's static KV over the batch bucket, sized for every request
        (engines.py: build_engine); drafter: a fast/drafters/ drafter or None (--algo none);
        graphs: capture CUDA graphs (default: on a GPU); probe: bench --profile's, each phase then
        a launch of its own."""
        self.spec, self.eos, self.drafter = spec, set(eos_token_ids), drafter
        device, bs = kv.seq_lens.device, kv.seq_lens.shape[0]
        self.adaptive = AdaptiveSpeculativeParams(spec.num_steps) if spec.adaptive else FixedSteps()
        self.host = drafter if drafter is not None and drafter.drafts_on_host else NoHostDrafts()
        randoms = DeviceRandoms(RULES[spec.acceptance], bs, spec.topk, target.config.vocab_size,
                                drafter is not None and drafter.samples_drafts, device)
        tiers = {steps: Tier(steps, n, randoms.for_shape(steps, n)) for steps, n in spec.tiers}
        longest = max(len(p) for p in prompt_ids)
        self.runner = StepRunner(target, kv, spec, drafter, tiers, longest, probe)
        recording, vocab = trace is not None or on_step is not None, target.config.vocab_size
        self.recorder = NoRecorder()
        if recording:
            roots = self.runner.roots
            self.recorder = StepRecorder(spec, drafter, kv, roots, probs, trace, on_step, vocab)
        self.tier = tiers[spec.num_steps]  # adaptive: the tier it starts from
        self.metrics = SpecMetrics(spec.max_steps, spec.num_draft_tokens)
        self.step_count, self.clock, self.ranks = 0, PhaseClock(device, probe), NoRanks()
        # a step is launched before the last one is read, but where the next one follows from it
        self.overlap = not (spec.adaptive or self.host.drafts_on_host or ranked(spec, drafter))
        if graphs if graphs is not None else device.type == "cuda":
            self.runner.capture(self.recorder)

    def generate(self, prompts: list[list[int]]) -> tuple[list[Request], dict]:
        """Prefill, then steps until every request is finished. The next step is launched before
        the last one is read (SGLang's overlap scheduler: a request that finished runs one step
        more, frozen) but where n-gram's drafts, an adaptive tier or tree_rejection's trees follow
        it, and where the step in flight may finish every request (`may_finish_all`)."""
        reqs = [Request(i, list(p), gen=request_generator(self.spec.seed, i))
                for i, p in enumerate(prompts)]
        self.ranks = SiblingRanks.of(reqs, self.spec, self.drafter)
        t0 = time.perf_counter()
        try:
            self.prefill(reqs)
            pending = self.launch(reqs) if any(not r.finish_reason for r in reqs) else None
            while pending is not None:
                ahead = None
                if self.overlap and not self.may_finish_all(reqs):
                    ahead = self.launch(reqs)
                self.finish_step(reqs, pending)
                done = all(r.finish_reason for r in reqs)
                pending = None if done else ahead or self.launch(reqs)
            if self.runner.device.type == "cuda":  # a step launched ahead finishes in the time
                torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        finally:  # also when interrupted: the trace of the steps kept so far (trace_s)
            built = self.recorder.finish()
        per_request = [self.metrics.per_request(r.req_pool_idx) for r in reqs]
        return reqs, {**self.metrics.summary(wall), "per_request": per_request, **built}

    def may_finish_all(self, reqs: list[Request]) -> bool:
        """Whether the step in flight (up to num_steps + 1 tokens a request) may reach
        max_new_tokens for every request still running: a step launched ahead would then run
        frozen, for nothing (a whole step at a real shape, where the host's wait for the last one
        costs microseconds)."""
        most, limit = self.tier.num_steps + 1, self.spec.max_new_tokens
        return all(r.finish_reason or limit - len(r.output_ids) <= most for r in reqs)

    @torch.no_grad()
    def prefill(self, reqs: list[Request]) -> None:
        """The prompts into the static buffers (a padding row: one token), the prefill, each
        first token."""
        runner = self.runner
        longest = max(len(r.prompt_ids) for r in reqs)
        if len(reqs) > runner.bs or longest > runner.prompts.ids.shape[1]:
            raise SpectraceError("FastEngine.generate takes the prompts the engine was built for")
        runner.reset()
        runner.prompts.fill(reqs)
        if not self.spec.sampling.greedy:  # the first token's draw, as plain decoding's
            runner.first_randoms.stage_first(reqs)
        t0 = time.perf_counter()
        first = runner.prefill()
        ms = round((time.perf_counter() - t0) * 1000, 3)
        for r, t in zip(reqs, first):
            append_tokens(r, [t], self.eos, self.spec.max_new_tokens)
            self.metrics.observe_prefill(r.req_pool_idx, ms)
        self.recorder.write_prefill(reqs, first, ms)
        runner.set_live([not r.finish_reason for r in reqs])
        self.host.host_prefill(reqs)

    def launch(self, reqs: list[Request]) -> Launched:
        """Enqueue one step: its host inputs staged (n-gram's trees, the random numbers), its
        launch groups (graph replays, or the step eagerly), then its host row's copy to the host."""
        tier, marks = self.tier, {}
        with self.clock.timed(marks, "draft") if self.host.drafts_on_host else nullcontext():
            self.host.host_draft(reqs)
        sizes, greedy = self.host.sizes_for(reqs, tier), self.spec.sampling.greedy
        randoms = tier.randoms.stage(reqs, sizes, greedy, self.ranks.worth(reqs))
        out = self.runner.launch(tier, self.clock, marks)
        copied = self.recorder.copy_step(tier, out)  # the host row comes with it
        row = to_host(out.host_row, copied.view("host_row") if copied else None)
        return Launched(marks, *row, copied, sizes, randoms)

    @torch.no_grad()
    def finish_step(self, reqs: list[Request], launched: Launched) -> None:
        """RECORD: the host's part of a launched step, once its tokens have arrived (the step's one
        sync): EOS and max_new_tokens, metrics, sibling worth, the step's frame for the trace."""
        if launched.done is not None:
            launched.done.synchronize()
        # (bs, num_steps + 2 [+ 2 topk]): accept_tokens, [counts,] accept_num
        rows = launched.row.tolist()
        running = sum(not r.finish_reason for r in reqs)
        timing = {**self.clock.read(launched.marks), "batch_size": running}
        # the explicit engine's adapt: the EMA over this step's requests
        adaptive = self.adaptive.step([row[-1] for row, r in zip(rows, reqs)
                                       if not r.finish_reason])
        ran = [self.finish_request(b, r, rows[b], launched, timing, adaptive)
               for b, r in enumerate(reqs) if not r.finish_reason]
        steps = self.tier.num_steps
        self.recorder.keep(self.step_count, launched.copied, ran, timing, adaptive, steps)
        self.host.host_extend(reqs, rows)  # the histories of the requests still running
        if any(kept.finish_reason for kept in ran):
            self.runner.set_live([not r.finish_reason for r in reqs])
        if adaptive and adaptive["switched_to"]:  # the next step runs the new tier's graphs
            self.tier = self.runner.tiers[adaptive["switched_to"]]
        self.step_count += 1

    def finish_request(self, b: int, r: Request, row: list[int], launched: Launched, timing: dict,
                       adaptive) -> Kept:
        """One unfinished request's tokens, metrics and sibling worth; what the recorder keeps
        of it."""
        num, tier = row[-1], self.tier
        committed = append_tokens(r, row[:num + 1], self.eos, self.spec.max_new_tokens)
        self.metrics.observe(b, self.step_count, timing, len(committed), num,
                             launched.sizes[b] - 1 or None, num + 1,
                             adaptive and adaptive["num_steps"])
        # the walk's tries and acceptances by sibling rank
        self.ranks.add(r, row[tier.num_steps + 1:-1])
        draws = launched.randoms[b] if launched.randoms else None
        return Kept(b, len(committed), r.finish_reason, draws)

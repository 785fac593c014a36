"""Speculative-decoding metrics, defined exactly as SGLang and vLLM define them.

SGLang (per request `meta_info`, summed over requests for the run):
    verify_ct            verify passes (one per speculative step)
    num_proposed_drafts  verify_ct * (num_draft_tokens - 1): summed per verify, so an adaptive run
                         counts each step's tier and an n-gram step without a match counts 0
    accept_rate  α     = num_correct_drafts / num_proposed_drafts        (bonus excluded)
    accept_length τ    = completion_tokens / verify_ct                    (bonus included; the
                         first token, sampled by prefill, counts in completion_tokens too)
vLLM (`SpecDecodingStats` and the "SpecDecoding metrics" log line, current form):
    num_drafts, num_draft_tokens, num_accepted_tokens, num_accepted_tokens_per_pos[i]
    Mean acceptance length = 1 + accepted / num_drafts
    Avg Draft acceptance rate = accepted / drafted * 100
    Per-position acceptance rate[i] = accepted_per_pos[i] / num_drafts
Metrics are computed from step records, so a trace on disk gives the same numbers as the run.

Phase costs (the textbook speed-up model, Leviathan et al. 2023): each decode step's phase times,
counted once per step
however many requests it carried; `predicted_speedup(τ, r)` = τ / (1 + r) with r = C_draft /
C_verify, the textbook approximation (C_extend dropped, one verify taken as one plain decode step).
"""
from __future__ import annotations

from collections import Counter, defaultdict


class SpecMetrics:
    def __init__(self, num_steps: int, num_draft_tokens: int):
        self.num_steps = num_steps  # drafts per verify (vLLM's num_spec_tokens)
        self.num_draft_tokens = num_draft_tokens  # tree size incl. root (SGLang)
        self.verify_ct: dict[int, int] = defaultdict(int)
        self.proposed: dict[int, int] = defaultdict(int)
        self.correct: dict[int, int] = defaultdict(int)
        self.completion: dict[int, int] = defaultdict(int)
        self.accept_len_hist: Counter = Counter()
        self.num_drafts = self.num_draft_tokens_vllm = self.num_accepted = 0
        self.accepted_per_pos = [0] * num_steps
        self.phase_ms: dict[str, float] = defaultdict(float)  # summed over decode steps
        self.timed_steps: set[int] = set()
        self.prefill_ms = 0.0

    def observe_prefill(self, request: int, ms: float = 0.0) -> None:
        """A request's prefill, `ms` long (a batch's requests share theirs; 0: not timed)."""
        self.completion[request] += 1  # the first token comes from prefill
        self.prefill_ms = ms

    def observe_step(self, rec: dict) -> None:
        drafted = rec["draft"] is not None
        self.observe(rec["request"], rec["step"], rec["timing"], len(rec["committed_tokens"]),
                     len(rec["correct_drafts"]), len(rec["draft"]["tokens"]) if drafted else None,
                     rec["accept_len"], rec["adaptive"]["num_steps"] if "adaptive" in rec else None)

    def observe(self, r: int, step: int, timing: dict, committed: int, n_correct: int,
                n_drafts: int | None, accept_len: int, adaptive_steps: int | None = None) -> None:
        """One request's step: tokens committed, correct drafts, drafts verified (None: a plain
        decode step), accept_len; what a step record says, for engines that write none."""
        if step not in self.timed_steps:  # a batch's requests share their step's timing
            self.timed_steps.add(step)
            for phase, ms in timing.items():
                if phase != "batch_size":
                    self.phase_ms[phase] += ms
        self.completion[r] += committed
        if n_drafts is None:  # a plain decode step: no drafts
            # in a speculative run (n-gram found no match) it is still a target forward
            if self.num_steps:
                self.verify_ct[r] += 1
                self.accept_len_hist[accept_len] += 1
            return
        self.verify_ct[r] += 1
        # adaptive runs change the chain length step by step; others propose num_draft_tokens - 1
        self.proposed[r] += (adaptive_steps if adaptive_steps is not None
                             else self.num_draft_tokens - 1)
        self.correct[r] += n_correct
        self.accept_len_hist[accept_len] += 1
        self.num_drafts += 1
        self.num_draft_tokens_vllm += n_drafts
        self.num_accepted += n_correct
        for i in range(n_correct):
            self.accepted_per_pos[i] += 1

    def per_request(self, r: int) -> dict:
        proposed = self.proposed[r]
        return {
            "completion_tokens": self.completion[r],
            "spec_verify_ct": self.verify_ct[r],
            "spec_num_correct_drafts": self.correct[r],
            "spec_num_proposed_drafts": proposed,
            "spec_accept_rate": self.correct[r] / proposed if proposed else None,
            "spec_accept_length": self.completion[r] / self.verify_ct[r] if self.verify_ct[r]
            else None,
        }

    def summary(self, wall_s: float) -> dict:
        verify_ct = sum(self.verify_ct.values())
        correct = sum(self.correct.values())
        completion = sum(self.completion.values())
        proposed = sum(self.proposed.values())
        nd = self.num_drafts
        vllm = {
            "num_drafts": nd,
            "num_draft_tokens": self.num_draft_tokens_vllm,
            "num_accepted_tokens": self.num_accepted,
            "num_accepted_tokens_per_pos": list(self.accepted_per_pos),
            "mean_acceptance_length": 1 + self.num_accepted / nd if nd else None,
            "draft_acceptance_rate": 100 * self.num_accepted / self.num_draft_tokens_vllm if nd
            else None,
            "per_position_acceptance_rate": [a / nd for a in self.accepted_per_pos] if nd else [],
            "accepted_throughput": self.num_accepted / wall_s if wall_s else None,
            "drafted_throughput": self.num_draft_tokens_vllm / wall_s if wall_s else None,
        }
        return {
            "completion_tokens": completion,
            "wall_s": wall_s,
            "tokens_per_s": completion / wall_s if wall_s else None,
            "verify_ct": verify_ct,
            "num_correct_drafts": correct,
            "num_proposed_drafts": proposed,
            "accept_rate": correct / proposed if proposed else None,
            "accept_length": completion / verify_ct if verify_ct else None,
            "accept_len_histogram": {str(k): v for k, v in sorted(self.accept_len_hist.items())},
            "decode_steps": len(self.timed_steps),
            "prefill_ms": round(self.prefill_ms, 3),  # of wall_s: the rest is the decode steps
            "phase_ms": {k: round(v, 3) for k, v in self.phase_ms.items()},
            "vllm": vllm,
        }


def predicted_speedup(tau: float, r: float) -> float:
    """The textbook speed-up over plain decoding, τ / (1 + r): τ tokens per step, at 1 + r
    verify-times a step (r = C_draft / C_verify, a verify taken to cost one decode)."""
    return tau / (1 + r)


def speedup_model(steps: list[dict], summary_metrics: dict) -> dict:
    """The textbook model read from a trace (`read_trace(path).steps`, `.summary["metrics"]`): mean
    ms per decode step of each phase (a batch's step counted once), τ, r = C_draft / C_verify and
    the predicted speed-up τ / (1 + r)."""
    timing = {rec["step"]: rec["timing"] for rec in steps}
    costs = defaultdict(float)
    for t in timing.values():
        for phase, ms in t.items():
            if phase != "batch_size":
                costs[phase] += ms / len(timing)
    tau = summary_metrics["accept_length"]
    r = costs["draft"] / costs["verify"] if costs["verify"] else None
    return {"phase_ms": dict(costs), "tau": tau, "r": r,
            "predicted_speedup": predicted_speedup(tau, r) if tau is not None and r is not None
            else None}


def vllm_log_line(m: dict) -> str:
    """vLLM's `SpecDecodingLogging.log` message for the whole run."""
    v = m["vllm"]
    rates = "[" + ", ".join(f"{r:.3f}" for r in v["per_position_acceptance_rate"]) + "]"
    return ("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f "
            "tokens/s, Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, "
            "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%" % (
                v["mean_acceptance_length"], v["accepted_throughput"], v["drafted_throughput"],
                v["num_accepted_tokens"], v["num_draft_tokens"], rates, v["draft_acceptance_rate"]))

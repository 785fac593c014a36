"""`spectrace rejudge`: what each recorded step would have accepted under another acceptance rule,
thresholds, temperature or random numbers.

A run made with --record-probs keeps, beside its trace, every verified step's target logits, the
draft's distribution at each node's parent and the random numbers its walk read
(core/probs.py). A re-judge walks every recorded tree again with the rule of your choice
(core/acceptance), from the same distributions:

    p        the recorded logits at the chosen temperature (the run's top-k and top-p kept);
             softmax at temperature 0, as the engine records it
    q        what the rule reads of the draft: rejection and tree_rejection the recorded q; vllm
             the recorded q if the drafts were sampled from it, else none (one-hot, as vLLM passes
             draft_probs=None for argmax drafts); the others nothing
    randoms  the recorded ones where the new rule draws the same kind (SGLang's coins for
             target_only, rejection and tree_rejection; vLLM's; Medusa's bonus coin) and the seed
             is the recorded one; else fresh, each request's own generator in step order

and writes a trace of the same steps with the new verdicts, which the walkthrough and renderer
open; its header says it was re-judged, from what and how. Under the recorded rule, thresholds,
temperature and seed it gives back the recorded verdicts exactly (tests/test_rejudge.py).

It is step-local: each step keeps the tree drafted in the recorded run, after the recorded
context. Where the new rule accepts another path, the real run would have continued from another
context and drafted other trees, which no trace holds. Read the result as "this rule on these
trees", not as a run of the rule. Steps without drafts (an n-gram miss) are kept as recorded.
"""
from __future__ import annotations

from pathlib import Path

import torch

from spectrace.core import acceptance
from spectrace.core.acceptance import RULES, RuleParams
from spectrace.core.metrics import SpecMetrics
from spectrace.core.probs import RecordedProbs, sha256
from spectrace.core.sampling import SamplingParams, probs_from_logits, request_generator, topk_pairs
from spectrace.core.step_record import fates, record_token_ids
from spectrace.core.trace import TraceWriter
from spectrace.traces import read_whole
from spectrace.errors import SpectraceError

TRACE_TOPK = {"full": 5, "steps": 0}  # run.py's TRACE_LEVELS, without importing the models
STEP_LOCAL = ("step-local: each step keeps the tree it drafted after the recorded context; where a verdict "
              "changed, the real run would have gone on from another context with other trees, which no trace holds")


class Rejudge:
    """One re-judge of a recorded trace: the options resolved and checked at construction (one
    line each, SpectraceError), the steps walked by `steps`, the new trace written by `write`."""

    def __init__(self, trace_path: str | Path, rule: str, threshold_single: float | None = None,
                 threshold_acc: float | None = None, temperature: float | None = None, seed: int | None = None):
        self.path = Path(trace_path)
        self.trace = read_whole(self.path)
        cfg = self.cfg = self.trace.header["config"]
        self.probs = RecordedProbs(self.path, self.trace.header)
        self.recorded = cfg["acceptance"]
        was_target_only = self.recorded == "target_only"
        self.rule = rule
        self.threshold_single = threshold_single if threshold_single is not None else (
            cfg["threshold_single"] if was_target_only else 1.0)
        self.threshold_acc = threshold_acc if threshold_acc is not None else (
            cfg["threshold_acc"] if was_target_only else 1.0)
        self.temperature = cfg["temperature"] if temperature is None else temperature
        acceptance.check(rule, cfg["algo"], cfg["topk"], self.temperature, self.threshold_single, self.threshold_acc)
        self.sampling = SamplingParams(self.temperature, cfg["top_k"], cfg["top_p"], cfg["seed"])
        self.seed = cfg["seed"] if seed is None else seed
        self.reuse_randoms = RULES[rule].draw is RULES[self.recorded].draw and self.seed == cfg["seed"]
        r, sampled = RULES[rule], RULES[self.recorded].samples_drafts
        self.reads_q = r.needs_q or (r.samples_drafts and sampled)
        self.caveat = None
        if r.needs_q and not sampled:
            self.caveat = (f"the recorded drafts are the draft's top-k, not samples of q: {rule}'s lossless guarantee "
                           "assumes sampled drafts, so read its verdicts as the rule's arithmetic on these trees")
        elif r.samples_drafts and not sampled:
            self.caveat = "the recorded drafts were not sampled: vllm takes them as one-hot (vLLM's argmax drafts)"
        self.params = RuleParams(self.threshold_single, self.threshold_acc, TRACE_TOPK[cfg["trace_level"]])

    # ---- the walks ---------------------------------------------------------------------------
    def steps(self) -> list[dict]:
        """Every step record of the trace, re-judged (drafted steps) or as recorded."""
        eos = set(self.trace.header.get("eos_token_ids", []))
        produced = {p["request"]: 1 for p in self.trace.prefills}  # the first token came from prefill
        gens: dict[int, torch.Generator] = {}
        out = []
        for rec in self.trace.steps:
            req = rec["request"]
            before = produced.get(req, 1)
            produced[req] = before + len(rec["committed_tokens"])
            if rec["draft"] is None:
                out.append(rec)
                continue
            if not self.reuse_randoms and req not in gens:
                gens[req] = request_generator(self.seed, req)
            out.append(self.step(rec, gens.get(req), self.cfg["max_new_tokens"] - before, eos))
        return out

    def step(self, rec: dict, gen: torch.Generator | None, room: int, eos: set[int]) -> dict:
        """One drafted step under the new rule: the recorded tree, p at the new temperature."""
        step, req, draft = rec["step"], rec["request"], rec["draft"]
        candidates = rec["verify"]["tokens"]
        n = len(candidates)
        logits = self.probs.logits(step, req)
        if logits.shape[0] != n:
            raise SpectraceError(f"{self.probs.path}: step {step} of request {req} has {logits.shape[0]} rows, "
                                 f"the trace's tree {n} nodes")
        target_predict = torch.argmax(logits, dim=-1).tolist()
        p = torch.softmax(logits, dim=-1) if self.sampling.greedy else probs_from_logits(logits, self.sampling)
        q = self.probs.q(step, req) if self.reads_q else None  # None from n-gram, DFLASH: vllm's one-hot
        if q is None and RULES[self.rule].needs_q:
            raise SpectraceError(f"--acceptance {self.rule} reads the draft's q, which the recorded drafter "
                                 f"({self.cfg['algo']}) did not keep")
        q = q.clone() if q is not None else None  # walks write into q
        randoms = (self.probs.randoms(step, req) if self.reuse_randoms else
                   RULES[self.rule].draw(n, logits.shape[-1], gen))
        max_depth = rec["adaptive"]["num_steps"] if "adaptive" in rec else self.cfg["num_steps"]
        res = RULES[self.rule].walk(candidates, draft["retrive_next_token"], draft["retrive_next_sibling"],
                                    target_predict, p, q, randoms, max_depth, self.params)
        committed, finish = cut(res.accept_tokens, room, eos)
        kv = rec["kv"]
        return {
            **rec, "correct_drafts": res.correct_drafts, "bonus_token": res.bonus_token,
            "accept_tokens": res.accept_tokens, "accept_len": res.accept_len, "committed_tokens": committed,
            "finish_reason": finish,
            "draft": {**draft, "fates": fates(n, res.decisions)},
            "verify": {**rec["verify"], "target_predict": target_predict,
                       "target_topk": topk_pairs(p, self.params.trace_topk),
                       "p_draft": [round(float(p[par, candidates[j + 1]]), 6)
                                   for j, par in enumerate(draft["parents"])]},
            "accept": {"rule": self.rule, "accept_nodes": res.accept_nodes, "decisions": res.decisions,
                       "bonus_from": res.bonus_from},
            # the KV after a counterfactual verdict was never computed: lengths only, no events
            "kv": {"style": kv["style"], "target_seq_len": [kv["target_seq_len"][0],
                                                            kv["target_seq_len"][0] + len(committed)],
                   "req_to_token_tail_before": kv.get("req_to_token_tail_before"), "req_to_token_tail": None,
                   "events": [], "free_slots": None},
        }

    # ---- the new trace -----------------------------------------------------------------------
    def header(self, out: Path) -> dict:
        header = {k: v for k, v in self.trace.header.items() if k not in ("probs", "tokens")}
        header["config"] = {**self.cfg, "acceptance": self.rule, "temperature": self.temperature,
                            "threshold_single": self.threshold_single, "threshold_acc": self.threshold_acc,
                            "seed": self.seed, "record_probs": False}
        header["rejudged"] = {
            "from": str(self.path), "sha256": sha256(self.path),
            "acceptance": [self.recorded, self.rule], "temperature": [self.cfg["temperature"], self.temperature],
            "thresholds": [[self.cfg["threshold_single"], self.cfg["threshold_acc"]],
                           [self.threshold_single, self.threshold_acc]],
            "randoms": self.randoms_used, "step_local": STEP_LOCAL}
        return header

    @property
    def randoms_used(self) -> str:
        return "the recorded ones" if self.reuse_randoms else f"fresh, seed {self.seed}"

    def write(self, out: Path) -> dict:
        """Write the re-judged trace; returns {"before": metrics, "after": metrics, "changed": n,
        "rejudged": n, "kept": n} (metrics as the trace's summary computes them)."""
        new_steps = self.steps()
        token_text = self.token_text()
        try:
            writer = TraceWriter(out, token_text)
        except OSError as e:
            raise SpectraceError(f"cannot write {out}: {e.strerror}") from None
        with_tokens = [int(t) for t in self.trace.header.get("tokens", {})]
        try:
            writer.write(self.header(out), with_tokens)
            for p in self.trace.prefills:
                writer.write(p, [int(t) for t in p.get("tokens", {})])
            for rec in new_steps:
                writer.write(rec, record_token_ids(rec))
            before, after = self.metrics(self.trace.steps), self.metrics(new_steps)
            if self.trace.summary is not None:
                outputs = self.outputs(new_steps)
                writer.write({"kind": "summary", "metrics": after, "requests": [
                    {**r, "output_ids": outputs[r["request"]], "output_text": "".join(
                        token_text(t) for t in outputs[r["request"]])} for r in self.trace.summary["requests"]]},
                    [t for ids in outputs.values() for t in ids])
        finally:
            writer.close()
        drafted = [(a, b) for a, b in zip(self.trace.steps, new_steps) if a["draft"] is not None]
        return {"before": before, "after": after, "rejudged": len(drafted),
                "changed": sum(x["accept"]["accept_nodes"] != y["accept"]["accept_nodes"] or
                               x["bonus_token"] != y["bonus_token"] for x, y in drafted),
                "kept": len(new_steps) - len(drafted), "out": out}

    def metrics(self, steps: list[dict]) -> dict:
        """The summary metrics of a list of step records (a step-local τ, α and per position)."""
        depth = max([s["adaptive"]["num_steps"] for s in steps if "adaptive" in s] + [self.cfg["num_steps"]])
        m = SpecMetrics(depth, self.cfg["num_draft_tokens"])
        for p in self.trace.prefills:
            m.observe_prefill(p["request"])
        for rec in steps:
            m.observe_step(rec)
        return m.summary(self.trace.summary["metrics"]["wall_s"] if self.trace.summary else 0.0)

    def outputs(self, steps: list[dict]) -> dict[int, list[int]]:
        """Each request's first token and every step's committed tokens, concatenated: what the
        verdicts committed step by step (not a text the model would have written: step-local)."""
        out = {p["request"]: [p["first_token"]] for p in self.trace.prefills}
        for rec in steps:
            out.setdefault(rec["request"], []).extend(rec["committed_tokens"])
        return out

    def token_text(self):
        """Token text from the trace; a token it never mentioned (a new bonus) from the target's
        tokenizer when its directory is still there, else <id>, as viewers show unknown ids."""
        known, tok = self.trace.tokens, self.tokenizer()
        return lambda i: known[i] if i in known else (tok.decode([i]) if tok is not None else f"<{i}>")

    def tokenizer(self):
        """The recorded target's tokenizer, or None when its directory is gone (a shared trace)."""
        from spectrace.run import load_tokenizer

        try:
            return load_tokenizer(str(self.cfg.get("target_model", "")))
        except (SpectraceError, OSError):
            return None


def cut(tokens: list[int], room: int, eos: set[int]) -> tuple[list[int], str | None]:
    """accept_tokens as the engine commits them: up to EOS or the request's remaining room."""
    kept = []
    for t in tokens[:max(room, 0)]:
        kept.append(t)
        if t in eos:
            return kept, "eos"
    return kept, "length" if len(tokens) >= room else None


def report(job: Rejudge, result: dict) -> str:
    """What `spectrace rejudge` prints: what changed, the step-local caveat, before -> after."""
    b, a = result["before"], result["after"]

    def num(x):
        return "-" if x is None else f"{x:.3f}"

    def per_pos(m):
        return " ".join(f"{x:.3f}" for x in m["vllm"]["per_position_acceptance_rate"]) or "-"

    cfg = job.cfg
    lines = [
        f"re-judged {job.path} -> {result['out']}: acceptance {job.recorded} -> {job.rule}, temperature "
        f"{cfg['temperature']} -> {job.temperature}, thresholds (single, acc) ({cfg['threshold_single']}, "
        f"{cfg['threshold_acc']}) -> ({job.threshold_single}, {job.threshold_acc}), random numbers: {job.randoms_used}",
        STEP_LOCAL,
    ]
    if job.caveat:
        lines.append(f"note: {job.caveat}")
    lines += [
        f"{'':26}{'before':>10}{'after':>10}",
        f"{'tau (accept_length)':26}{num(b['accept_length']):>10}{num(a['accept_length']):>10}",
        f"{'alpha (accept_rate)':26}{num(b['accept_rate']):>10}{num(a['accept_rate']):>10}",
        f"per-position acceptance   before {per_pos(b)}",
        f"{'':26}after  {per_pos(a)}",
        f"steps re-judged {result['rejudged']}, verdicts changed {result['changed']}, steps without drafts kept "
        f"{result['kept']}",
    ]
    return "\n".join(lines)

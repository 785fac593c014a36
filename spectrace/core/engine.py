"""The decode loop: prefill, then plain decoding or speculative steps, recorded into a trace.

One speculative step, as the seeds name its phases:
    DRAFT    the drafter proposes num_steps tokens after the last committed token (the root)
    VERIFY   one target forward over [root, d1..dK] (TARGET_VERIFY), K+1 rows
    ACCEPT   the acceptance rule walks the drafts: correct_drafts + 1 bonus_token
    COMMIT   the target keeps the KV of root + correct drafts, the rest is released
    EXTEND   the drafter catches up on accept_tokens (DRAFT_EXTEND)
Requests of a batch have their own prompt lengths and accept lengths; each phase runs as one
ragged forward over all unfinished requests.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from spectrace.core.acceptance.greedy import verify_chain_greedy
from spectrace.core.batch import ForwardBatch
from spectrace.core.config import SpectraceError
from spectrace.core.drafters import DraftProposal
from spectrace.core.metrics import SpecMetrics
from spectrace.core.model import CausalLM
from spectrace.core.trace import TraceWriter

ALGOS = ("none", "standalone")


@dataclass
class SpecConfig:
    algo: str = "standalone"
    num_steps: int = 3  # SGLang's STANDALONE default (steps 3, topk 1, 4 draft tokens)
    max_new_tokens: int = 64
    commit_style: str = "sglang"
    trace_topk: int = 5  # target and draft candidates recorded per row

    @property
    def num_draft_tokens(self) -> int:  # a chain: root + num_steps drafts
        return self.num_steps + 1 if self.algo != "none" else 1


@dataclass
class Request:
    req: int  # row in req_to_token
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "eos" or "length"

    @property
    def committed_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


class _Timer:
    """Wall time of each phase of a step, synchronising the GPU so times are real."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.ms: dict[str, float] = {}

    def __call__(self, phase: str):
        timer = self

        class _Phase:
            def __enter__(self):
                if timer.cuda:
                    torch.cuda.synchronize()
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                if timer.cuda:
                    torch.cuda.synchronize()
                timer.ms[phase] = round((time.perf_counter() - self.t0) * 1000, 3)

        return _Phase()


def _topk_pairs(probs: torch.Tensor, k: int) -> list[list]:
    p, i = torch.topk(probs, k)
    return [[int(a), round(float(b), 6)] for a, b in zip(i, p)]


class Engine:
    def __init__(self, target: CausalLM, spec: SpecConfig, eos_token_ids, drafter=None,
                 trace: TraceWriter | None = None, num_slots: int | None = None,
                 max_requests: int = 1, max_context: int | None = None):
        if spec.algo not in ALGOS:
            raise SpectraceError(f"unknown algorithm {spec.algo!r}")
        if spec.algo != "none" and drafter is None:
            raise SpectraceError(f"--algo {spec.algo} needs a drafter")
        self.target, self.spec, self.drafter, self.trace = target, spec, drafter, trace
        self.eos = set(eos_token_ids)
        self.device = target.lm_head.weight.device
        max_context = max_context or target.config.max_position_embeddings
        self.kv = target.new_kv_cache("target", spec.commit_style, num_slots, max_requests, max_context)
        self.metrics = SpecMetrics(spec.num_steps if spec.algo != "none" else 0, spec.num_draft_tokens)
        self.step_count = 0

    # ---- helpers -------------------------------------------------------------------------
    def _append(self, r: Request, tokens: list[int]) -> list[int]:
        """Commit tokens to the output until EOS or max_new_tokens; returns what entered."""
        entered = []
        for t in tokens:
            r.output_ids.append(t)
            entered.append(t)
            if t in self.eos:
                r.finish_reason = "eos"
            elif len(r.output_ids) >= self.spec.max_new_tokens:
                r.finish_reason = "length"
            if r.finish_reason:
                break
        return entered

    def _finish(self, r: Request) -> None:
        self.kv.release(r.req)
        if self.drafter is not None:
            self.drafter.release(r.req)

    def _req_to_token_tail(self, req: int, n: int = 16) -> dict:
        """The last n committed entries of `req_to_token` for one request: the pointers a viewer shows."""
        end = self.kv.seq_lens[req]
        start = max(0, end - n)
        return {"start": start, "slots": self.kv.req_to_token[req, start:end].tolist()}

    def _kv_record(self, r: Request, target_before: int, draft_before: int | None,
                   tail_before: dict | None = None) -> dict:
        """KV state of one request after a step; a finished request releases its slots here,
        so the trace shows them freed."""
        rec = {
            "style": self.spec.commit_style,
            "target_seq_len": [target_before, self.kv.seq_lens[r.req]],
            "req_to_token_tail_before": tail_before,
            "req_to_token_tail": self._req_to_token_tail(r.req),
        }
        if self.drafter is not None:
            rec["draft_seq_len"] = [draft_before, self.drafter.kv.seq_lens[r.req]]
        if r.finish_reason:
            self._finish(r)
        rec["events"] = self.kv.take_events(r.req)
        if self.drafter is not None:
            rec["events"] += self.drafter.kv.take_events(r.req)
        rec["free_slots"] = len(self.kv.allocator.free_slots)
        return rec

    # ---- phases --------------------------------------------------------------------------
    def prefill(self, reqs: list[Request]) -> None:
        """Target EXTEND over every prompt; its last row gives each request's first token."""
        timer = _Timer(self.device)
        with timer("prefill"):
            batch = ForwardBatch.build(self.kv, [(r.req, 0, r.prompt_ids) for r in reqs])
            logits = self.target(batch, self.kv).logits
        end = 0
        for r in reqs:
            n = len(r.prompt_ids)
            end += n
            self.kv.commit(r.req, 0, n, list(range(n)))
            self._append(r, [int(torch.argmax(logits[end - 1]))])
            self.metrics.observe_prefill(r.req)
        live = [r for r in reqs if not r.finish_reason]
        if self.drafter is not None and live:
            with timer("draft_extend"):
                self.drafter.draft_extend_for_prefill([(r.req, r.prompt_ids + r.output_ids) for r in live])
        for r in reqs:
            rec = {"kind": "prefill", "request": r.req, "prompt_len": len(r.prompt_ids),
                   "first_token": r.output_ids[0], "finish_reason": r.finish_reason,
                   "kv": self._kv_record(r, 0, 0 if self.drafter else None), "timing": timer.ms}
            if self.trace:
                self.trace.write(rec, r.prompt_ids + r.output_ids)

    def decode_one_token(self, reqs: list[Request]) -> None:
        """Plain autoregressive decoding: each step is a verify of the root alone."""
        self._step(reqs, drafts=None, timer=_Timer(self.device))

    def speculative_step(self, reqs: list[Request]) -> None:
        timer = _Timer(self.device)
        with timer("draft"):
            drafts = self.drafter.draft([r.req for r in reqs])
        self._step(reqs, drafts, timer)

    def _step(self, reqs: list[Request], drafts: dict[int, DraftProposal] | None, timer: _Timer) -> None:
        """VERIFY -> ACCEPT -> COMMIT -> EXTEND for one step of every request in `reqs`."""
        draft_before = {r.req: self.drafter.kv.seq_lens[r.req] for r in reqs} if self.drafter else {}
        target_before = {r.req: self.kv.seq_lens[r.req] for r in reqs}
        tail_before = {r.req: self._req_to_token_tail(r.req) for r in reqs}
        rows = {r.req: [r.output_ids[-1]] + (drafts[r.req].tokens if drafts else []) for r in reqs}
        with timer("verify"):  # rows start at position committed_len - 1: the root
            batch = ForwardBatch.build(self.kv, [(r.req, r.committed_len - 1, rows[r.req]) for r in reqs])
            logits = self.target(batch, self.kv).logits  # (sum of rows, vocab)
        with timer("accept"):
            results, verify, end = {}, {}, 0
            for r in reqs:
                n = len(rows[r.req])
                lg = logits[end:end + n]
                end += n
                target_predict = torch.argmax(lg, dim=-1).tolist()  # ties: lowest id, as in AR
                draft_tokens = rows[r.req][1:]
                results[r.req] = verify_chain_greedy(draft_tokens, target_predict)
                probs = torch.softmax(lg, dim=-1)
                verify[r.req] = {
                    "tokens": rows[r.req],
                    "positions": list(range(r.committed_len - 1, r.committed_len - 1 + n)),
                    "target_predict": target_predict,
                    "target_topk": [_topk_pairs(p, self.spec.trace_topk) for p in probs],
                    "p_draft": [round(float(probs[i, t]), 6) for i, t in enumerate(draft_tokens)],
                }
        with timer("commit"):
            committed = {}
            for r in reqs:
                res = results[r.req]
                self.kv.commit(r.req, r.committed_len - 1, len(rows[r.req]), list(range(res.accept_len)))
                committed[r.req] = self._append(r, res.accept_tokens)
        live = [r for r in reqs if not r.finish_reason]
        if self.drafter is not None and live:
            with timer("extend"):
                self.drafter.draft_extend([(r.req, results[r.req].accept_tokens) for r in live])

        for r in reqs:
            res = results[r.req]
            rec = {
                "kind": "step", "step": self.step_count, "request": r.req,
                "correct_drafts": res.correct_drafts, "bonus_token": res.bonus_token,
                "accept_tokens": res.accept_tokens, "accept_len": res.accept_len,
                "committed_tokens": committed[r.req], "finish_reason": r.finish_reason,
                "draft": drafts[r.req].to_record() if drafts else None,
                "verify": verify[r.req],
                "accept": {"rule": "greedy" if drafts else "none", "decisions": res.decisions},
                "kv": self._kv_record(r, target_before[r.req], draft_before.get(r.req), tail_before[r.req]),
                "timing": {**timer.ms, "batch_size": len(reqs)},
            }
            self.metrics.observe_step(rec)
            if self.trace:
                ids = set(rows[r.req]) | set(res.accept_tokens)
                ids |= {t for row in verify[r.req]["target_topk"] for t, _ in row}
                if drafts:
                    ids |= {t for row in drafts[r.req].draft_topk for t, _ in row}
                self.trace.write(rec, ids)
        self.step_count += 1

    # ---- the loop ------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]]) -> tuple[list[Request], dict]:
        reqs = [Request(i, list(p)) for i, p in enumerate(prompts)]
        t0 = time.perf_counter()
        self.prefill(reqs)
        while live := [r for r in reqs if not r.finish_reason]:
            if self.spec.algo == "none":
                self.decode_one_token(live)
            else:
                self.speculative_step(live)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        metrics = self.metrics.summary(time.perf_counter() - t0)
        metrics["per_request"] = [self.metrics.per_request(r.req) for r in reqs]
        return reqs, metrics

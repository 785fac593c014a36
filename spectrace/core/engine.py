"""The decode loop: prefill, then plain decoding or speculative steps, recorded into a trace.

One speculative step, as the seeds name its phases:
    DRAFT    the drafter proposes a tree of num_draft_tokens nodes rooted at the last committed
             token (a chain when topk is 1), and BUILD gives its mask, positions and lists
    VERIFY   one target forward over all nodes with the tree mask over prefix + tree (TARGET_VERIFY)
    ACCEPT   the acceptance rule walks the tree: correct_drafts + 1 bonus_token
    COMMIT   the target keeps the KV of the accepted path, the rest is released
    EXTEND   the drafter catches up on accept_tokens (DRAFT_EXTEND)
Requests of a batch have their own prompt lengths and accept lengths; each phase runs as one
ragged forward over all unfinished requests.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from spectrace.core import acceptance
from spectrace.core.acceptance.greedy import AcceptResult, greedy_walk
from spectrace.core.acceptance.rejection import rejection_walk
from spectrace.core.acceptance.target_only import target_only_walk
from spectrace.core.acceptance.tree_rejection import SiblingStats, tree_rejection_walk
from spectrace.core.acceptance.typical import typical_walk
from spectrace.core.acceptance.vllm import vllm_accept
from spectrace.core.adaptive import AdaptiveConfig, AdaptiveSpeculativeParams
from spectrace.core.batch import ForwardBatch
from spectrace.core.config import SpectraceError
from spectrace.core.metrics import SpecMetrics
from spectrace.core.ngram.trie import TrieConfig
from spectrace.core.model import CausalLM
from spectrace.core.sampling import SamplingParams, probs_from_logits, request_generator, sample, topk_pairs
from spectrace.core.trace import TraceWriter
from spectrace.core.tree import DraftTree, SampledDrafts, tree_capacity

ALGOS = ("none", "standalone", "eagle", "eagle3", "nextn", "mtp", "frozen_kv_mtp", "ngram", "medusa", "dflash")


@dataclass
class SpecConfig:
    algo: str = "standalone"
    num_steps: int = 3  # SGLang's STANDALONE default (steps 3, topk 1, 4 draft tokens)
    topk: int = 1
    num_draft_tokens: int | None = None  # tree size incl. the root; topk 1 forces num_steps + 1
    max_new_tokens: int = 64
    commit_style: str = "sglang"
    trace_topk: int = 5  # target and draft candidates recorded per row
    acceptance: str | None = None  # None: SGLang's default, greedy at temperature 0, else target_only
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    threshold_single: float = 1.0
    threshold_acc: float = 1.0
    prompt_lookup_min: int = 5  # n-gram: vLLM's defaults when neither is given
    prompt_lookup_max: int = 5
    ngram_match: str = "first"  # first: v0.8.5's proposer; longest: current vLLM's
    ngram_style: str = "vllm"  # or "sglang": the trie cache and its draft trees
    ngram_trie: TrieConfig = field(default_factory=TrieConfig)
    adaptive: bool = False  # SGLang's --speculative-adaptive: num_steps follows an EMA of accepted drafts
    medusa_choices: list[list[int]] | None = None  # Medusa's static tree, as paths of top-k ranks

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)

    def __post_init__(self):
        if self.acceptance is None:
            self.acceptance = acceptance.default_rule(self.temperature)
        acceptance.check(self.acceptance, self.algo, self.topk, self.temperature, self.threshold_single,
                         self.threshold_acc)
        if self.top_p <= 0 or self.top_p > 1:
            raise SpectraceError(f"--top-p must lie in (0, 1], got {self.top_p}")
        if self.algo == "none":
            self.num_draft_tokens = 1
            return
        if self.num_steps < 1:
            raise SpectraceError(f"--num-steps must be at least 1, got {self.num_steps}")
        if self.topk < 1:
            raise SpectraceError(f"--topk must be at least 1, got {self.topk}")
        if self.algo == "ngram":
            self._check_ngram()
        if self.adaptive:
            self._check_adaptive()
        if self.topk == 1:
            self.num_draft_tokens = self.num_steps + 1
        elif self.num_draft_tokens is None:  # SGLang's Llama default tree size, if the tree holds it
            self.num_draft_tokens = min(8, tree_capacity(self.topk, self.num_steps) + 1)
        cap = tree_capacity(self.topk, self.num_steps)
        if not 2 <= self.num_draft_tokens <= cap + 1:
            raise SpectraceError(
                f"--num-draft-tokens {self.num_draft_tokens} does not fit a tree of topk {self.topk} and "
                f"{self.num_steps} steps: it holds 2 to {cap + 1} nodes (root included)")


    def _check_ngram(self) -> None:
        """vLLM's rules: 1 <= min <= max; its proposer drafts a chain of num_steps tokens.
        SGLang's: the trie's own (ngram.cpp's Param checks)."""
        if self.ngram_style == "sglang":
            self.ngram_trie.check()
            return
        if self.ngram_style != "vllm":
            raise SpectraceError(f"unknown --ngram-style {self.ngram_style!r} (choose from vllm, sglang)")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo < 1 or hi < lo:
            raise SpectraceError(f"--prompt-lookup-min {lo} and --prompt-lookup-max {hi}: need 1 <= min <= max")
        if self.topk != 1:
            raise SpectraceError("vLLM's n-gram proposer drafts a chain: it needs --topk 1")
        if self.ngram_match not in ("first", "longest"):
            raise SpectraceError(f"unknown --ngram-match {self.ngram_match!r} (choose from first, longest)")


    def _check_adaptive(self) -> None:
        """SGLang: the EAGLE worker, topk 1, and a starting num_steps among the tiers."""
        if self.algo not in acceptance.EAGLE_WORKER_ALGOS:
            raise SpectraceError(f"--speculative-adaptive runs with EAGLE / EAGLE3 (and NEXTN, MTP), not --algo {self.algo}")
        if self.topk != 1:
            raise SpectraceError("--speculative-adaptive switches chain lengths: it needs --topk 1")
        tiers = AdaptiveConfig().candidate_steps
        if self.num_steps not in tiers:
            raise SpectraceError(f"--speculative-adaptive starts from a tier: --num-steps must be one of {tiers}")


@dataclass
class Request:
    req: int  # row in req_to_token
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "eos" or "length"
    gen: torch.Generator | None = None  # this request's random numbers (sampling only)

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


def _fates(n: int, res) -> list[str]:
    """Each draft node's fate in the walk: correct (on the accepted path), rejected (tried
    against the target and refused) or unreached (the walk never got to it)."""
    fate = ["unreached"] * n
    for d in res.decisions:
        fate[d["node"]] = "correct" if d["accepted"] else "rejected"
    return fate[1:]


def _tree_record(tree: DraftTree, b: int, res) -> dict:
    """One request's draft tree for the trace: nodes 1..n-1 (node 0 is the root)."""
    n = tree.size(b)
    parents = tree.parents(b)
    depths = []
    for p in parents:
        depths.append(1 if p == 0 else depths[p - 1] + 1)
    rec = {
        "tokens": tree.draft_tokens[b, 1:n].tolist(),
        "parents": parents,  # node index, 0 = the root
        "depths": depths,
        "q": [round(float(x), 6) for x in tree.q[b, :n - 1]],
        "scores": [round(float(x), 6) for x in tree.scores[b, :n - 1]],
        "draft_topk": tree.draft_topk[b][:n - 1],
        "tree_mask": ["".join("1" if x else "0" for x in row[:n]) for row in tree.tree_mask[b, :n].tolist()],
        "retrive_next_token": tree.retrive_next_token[b, :n].tolist(),
        "retrive_next_sibling": tree.retrive_next_sibling[b, :n].tolist(),
        "fates": _fates(n, res),
    }
    if tree.sibling_worth is not None:  # a sampled tree's scores are products of these, not of q
        rec["sibling_worth"] = [round(float(x), 6) for x in tree.sibling_worth[b]]
    if tree.proposers is not None and tree.proposers[b] is not None:  # n-gram: the match it copied
        rec["proposer"] = tree.proposers[b]
    return rec


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
        # what EAGLE-style drafters read: the last hidden state, or (EAGLE-3) the inputs of these layers
        self.drafter_kv = drafter.kv if drafter is not None else None  # FROZEN_KV_MTP keeps none
        self.capture_layers = drafter.capture_layers if drafter is not None else ()
        if spec.acceptance in acceptance.SAMPLED_RULES:  # drafts are sampled from q = softmax(logits / T)
            drafter.temperature = spec.temperature
        if hasattr(drafter, "bind_target_kv"):  # FROZEN_KV_MTP attends to the target's KV
            drafter.bind_target_kv(self.kv)
        self._events: dict[int, list[dict]] = {}  # req -> this step's KV events so far
        self.sibling_stats: dict[int, SiblingStats] = {}  # req -> tree_rejection's sibling worth
        self.adaptive = AdaptiveSpeculativeParams(spec.num_steps) if spec.adaptive else None
        max_steps = max(self.adaptive.candidate_steps) if self.adaptive else spec.num_steps
        self.metrics = SpecMetrics(max_steps if spec.algo != "none" else 0, spec.num_draft_tokens)
        self.step_count = 0

    # ---- helpers -------------------------------------------------------------------------
    def _target_forward(self, batch: ForwardBatch):
        """Target logits and the features drafters read, (N, F) per row."""
        out = self.target(batch, self.kv, self.capture_layers)
        feats = torch.cat(out.aux_hidden_states, dim=-1) if self.capture_layers else out.hidden_states
        return out.logits, feats

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
        self.sibling_stats.pop(r.req, None)
        if self.drafter is not None:
            self.drafter.release(r.req)

    def _first_token(self, r: Request, logits: torch.Tensor) -> int:
        """The prefill's token: the argmax, or a sample of p."""
        if self.spec.sampling.greedy:
            return int(torch.argmax(logits))
        return sample(probs_from_logits(logits, self.spec.sampling), r.gen)

    def _accept(self, r: Request, b: int, tree: DraftTree | None, rows: list[int], probs: torch.Tensor) -> AcceptResult:
        """The sampling rules, on one request's tree; probs (n, V) the target's after each node."""
        rule, gen, k = self.spec.acceptance, r.gen, self.spec.trace_topk
        if tree is None:  # plain sampling
            return AcceptResult([], sample(probs[0], gen), [0], [], {"dist": "target", "node": 0,
                                                                    "topk": topk_pairs(probs[0], k)})
        n = tree.size(b)
        nt, ns = tree.retrive_next_token[b, :n].tolist(), tree.retrive_next_sibling[b, :n].tolist()
        if rule == "target_only":
            coins = torch.rand(len(rows), generator=gen)  # SGLang: one float32 coin per node, then the final
            return target_only_walk(rows, nt, ns, probs, coins, float(torch.rand((), generator=gen)),
                                    self.spec.num_steps, self.spec.threshold_single, self.spec.threshold_acc,
                                    trace_topk=k)
        if rule == "rejection":
            coins = torch.rand(len(rows) - 1, generator=gen)
            return rejection_walk(rows, probs, tree.draft_probs[b].cpu(), coins, float(torch.rand((), generator=gen)), k)
        if rule == "vllm":  # n-gram drafts have no q: one-hot, as vLLM passes draft_probs=None
            return vllm_accept(rows, probs, tree.draft_probs[b].cpu() if tree.draft_probs is not None else None, gen, k)
        if rule == "typical":
            return typical_walk(rows, nt, ns, probs, float(torch.rand((), generator=gen, dtype=torch.float64)),
                                trace_topk=k)
        res = tree_rejection_walk(rows, nt, ns, probs, tree.draft_probs[b].cpu(), gen, self.spec.num_steps, k)
        self._siblings(r).observe(res.decisions, nt, ns)
        return res

    def _siblings(self, r: Request) -> SiblingStats:
        """What a tree_rejection request's j-th sibling draw has been worth so far."""
        return self.sibling_stats.setdefault(r.req, SiblingStats(self.spec.topk))

    def _req_to_token_tail(self, req: int, n: int = 16) -> dict:
        """The last n committed entries of `req_to_token` for one request: the pointers a viewer shows."""
        end = self.kv.seq_lens[req]
        start = max(0, end - n)
        return {"start": start, "slots": self.kv.req_to_token[req, start:end].tolist()}

    def _collect(self, reqs: list[Request], phase: str) -> None:
        """Move the KV events of both pools into this step's record, each tagged with the phase
        that caused it (prefill, draft, verify, commit, extend, finish)."""
        for r in reqs:
            for kv in (self.kv, self.drafter_kv):
                for e in kv.take_events(r.req) if kv is not None else []:
                    self._events.setdefault(r.req, []).append({**e, "phase": phase})

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
        if self.drafter_kv is not None:
            rec["draft_seq_len"] = [draft_before, self.drafter_kv.seq_lens[r.req]]
        if r.finish_reason:
            self._finish(r)
        self._collect([r], "finish")
        rec["events"] = self._events.pop(r.req, [])
        rec["free_slots"] = len(self.kv.allocator.free_slots)
        return rec

    # ---- phases --------------------------------------------------------------------------
    def prefill(self, reqs: list[Request]) -> None:
        """Target EXTEND over every prompt; its last row gives each request's first token."""
        timer = _Timer(self.device)
        with timer("prefill"):
            batch = ForwardBatch.build(self.kv, [(r.req, 0, r.prompt_ids) for r in reqs])
            logits, feats = self._target_forward(batch)
        features, end = {}, 0
        for r in reqs:
            n = len(r.prompt_ids)
            end += n
            self.kv.commit(r.req, 0, n, list(range(n)))
            features[r.req] = feats[end - n:end]
            self._append(r, [self._first_token(r, logits[end - 1])])
            self.metrics.observe_prefill(r.req)
        self._collect(reqs, "prefill")
        live = [r for r in reqs if not r.finish_reason]
        if self.drafter is not None and live:
            with timer("draft_extend"):
                self.drafter.draft_extend_for_prefill(
                    [(r.req, r.prompt_ids + r.output_ids, features[r.req]) for r in live])
            self._collect(live, "extend")
        for r in reqs:
            rec = {"kind": "prefill", "request": r.req, "prompt_len": len(r.prompt_ids),
                   "first_token": r.output_ids[0], "finish_reason": r.finish_reason,
                   "kv": self._kv_record(r, 0, 0 if self.drafter_kv is not None else None), "timing": timer.ms}
            if self.trace:
                self.trace.write(rec, r.prompt_ids + r.output_ids)

    def decode_one_token(self, reqs: list[Request]) -> None:
        """Plain autoregressive decoding: each step verifies a tree that is the root alone."""
        self._step(reqs, tree=None, timer=_Timer(self.device))

    def speculative_step(self, reqs: list[Request]) -> None:
        timer = _Timer(self.device)
        with timer("draft"):
            sampled = None
            if self.spec.acceptance in acceptance.SAMPLED_RULES:
                worth = torch.stack([self._siblings(r).worth() for r in reqs]) if self.spec.topk > 1 else None
                sampled = SampledDrafts([r.gen for r in reqs], worth)
            tree = self.drafter.draft([r.req for r in reqs], [r.output_ids[-1] for r in reqs],
                                      [self.kv.seq_lens[r.req] for r in reqs], sampled)
        self._collect(reqs, "draft")
        self._step(reqs, tree, timer)

    def _step(self, reqs: list[Request], tree: DraftTree | None, timer: _Timer) -> None:
        """VERIFY -> ACCEPT -> COMMIT -> EXTEND for one step of every request in `reqs`."""
        draft_before = {r.req: self.drafter_kv.seq_lens[r.req] for r in reqs} if self.drafter_kv is not None else {}
        L = {r.req: self.kv.seq_lens[r.req] for r in reqs}  # target KV: committed tokens but the root
        tail_before = {r.req: self._req_to_token_tail(r.req) for r in reqs}
        # a request whose drafter proposed nothing (n-gram without a match) decodes plainly
        drafted = {r.req: tree is not None and tree.size(b) > 1 for b, r in enumerate(reqs)}
        if tree is None:
            rows = {r.req: [r.output_ids[-1]] for r in reqs}
            positions = {r.req: [L[r.req]] for r in reqs}
            masks = None
        else:
            size = {r.req: tree.size(b) for b, r in enumerate(reqs)}
            rows = {r.req: tree.draft_tokens[b, :size[r.req]].tolist() for b, r in enumerate(reqs)}
            positions = {r.req: tree.positions[b, :size[r.req]].tolist() for b, r in enumerate(reqs)}
            # each node sees the whole committed prefix, then the root, its ancestors and itself
            masks = [torch.cat([torch.ones(size[r.req], L[r.req], dtype=torch.bool, device=self.device),
                                tree.tree_mask[b, :size[r.req], :size[r.req]]], dim=1) for b, r in enumerate(reqs)]
        with timer("verify"):  # node j of request r takes req_to_token[r, L + j]
            batch = ForwardBatch.build(self.kv, [(r.req, L[r.req], rows[r.req]) for r in reqs], masks,
                                       [positions[r.req] for r in reqs])
            logits, feats = self._target_forward(batch)  # (sum of nodes, vocab), (sum of nodes, F)
        self._collect(reqs, "verify")
        with timer("accept"):
            results, verify, first_row, end = {}, {}, {}, 0
            for b, r in enumerate(reqs):
                n = len(rows[r.req])
                first_row[r.req] = end
                lg = logits[end:end + n]
                end += n
                target_predict = torch.argmax(lg, dim=-1).tolist()  # ties: lowest id, as in AR
                own = tree if drafted[r.req] else None  # this request's tree, if it has drafts
                parents = own.parents(b) if own is not None else []
                if self.spec.sampling.greedy:
                    probs = torch.softmax(lg, dim=-1)
                    if own is None:
                        results[r.req] = greedy_walk(rows[r.req], [-1], [-1], target_predict, 0)
                    else:
                        n = len(rows[r.req])
                        results[r.req] = greedy_walk(rows[r.req], own.retrive_next_token[b, :n].tolist(),
                                                     own.retrive_next_sibling[b, :n].tolist(), target_predict,
                                                     self.spec.num_steps)
                else:  # what the rule compares against: p after temperature, top-k and top-p
                    probs = probs_from_logits(lg, self.spec.sampling).cpu()
                    results[r.req] = self._accept(r, b, own, rows[r.req], probs)
                verify[r.req] = {
                    "tokens": rows[r.req],
                    "positions": positions[r.req],
                    "target_predict": target_predict,
                    "target_topk": [topk_pairs(p, self.spec.trace_topk) for p in probs],
                    # target probability of node j's token after its parent
                    "p_draft": [round(float(probs[p, rows[r.req][j + 1]]), 6) for j, p in enumerate(parents)],
                }
        with timer("commit"):
            committed = {}
            for r in reqs:
                res = results[r.req]
                self.kv.commit(r.req, L[r.req], len(rows[r.req]), res.accept_nodes)
                committed[r.req] = self._append(r, res.accept_tokens)
        self._collect(reqs, "commit")
        live = [r for r in reqs if not r.finish_reason]
        if self.drafter is not None and live:
            with timer("extend"):
                # the features of the accepted path's rows (root .. last correct draft)
                self.drafter.draft_extend([
                    (r.req, results[r.req].accept_tokens,
                     feats[[first_row[r.req] + j for j in results[r.req].accept_nodes]])
                    for r in live])
            self._collect(live, "extend")

        adapt = self._adapt([len(results[r.req].correct_drafts) for r in reqs]) if self.adaptive and tree else None
        for b, r in enumerate(reqs):
            res = results[r.req]
            rec = {
                "kind": "step", "step": self.step_count, "request": r.req,
                "correct_drafts": res.correct_drafts, "bonus_token": res.bonus_token,
                "accept_tokens": res.accept_tokens, "accept_len": res.accept_len,
                "committed_tokens": committed[r.req], "finish_reason": r.finish_reason,
                "draft": _tree_record(tree, b, res) if drafted[r.req] else None,
                "verify": verify[r.req],
                "accept": {"rule": self.spec.acceptance if drafted[r.req] else "none",
                           "accept_nodes": res.accept_nodes, "decisions": res.decisions,
                           "bonus_from": res.bonus_from},
                "kv": self._kv_record(r, L[r.req], draft_before.get(r.req), tail_before[r.req]),
                "timing": {**timer.ms, "batch_size": len(reqs)},
            }
            if adapt is not None:
                rec["adaptive"] = adapt
            self.metrics.observe_step(rec)
            if self.trace:
                ids = set(rows[r.req]) | set(res.accept_tokens)
                ids |= {t for row in verify[r.req]["target_topk"] for t, _ in row}
                if drafted[r.req]:
                    ids |= {t for row in tree.draft_topk[b] for t, _ in row}
                if res.bonus_from is not None:
                    ids |= {t for t, _ in res.bonus_from["topk"]}
                self.trace.write(rec, ids)
        self.step_count += 1

    def _adapt(self, accepted_drafts: list[int]) -> dict:
        """Fold this batch into the adaptive EMA; a new tier takes effect from the next step,
        swapped in whole as SGLang swaps its SpecRuntimeState."""
        a = self.adaptive
        used = a.current_steps
        switched = a.update(accepted_drafts)
        if switched:
            self.spec = replace(self.spec, num_steps=a.current_steps, num_draft_tokens=a.current_steps + 1)
            self.drafter.num_steps, self.drafter.num_draft_tokens = a.current_steps, a.current_steps + 1
        return {"num_steps": used, "ema": round(a.ema, 6), "batch_count": a.batch_count,
                "tiers": a.candidate_steps, "switched_to": a.current_steps if switched else None}

    # ---- the loop ------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]]) -> tuple[list[Request], dict]:
        reqs = [Request(i, list(p), gen=request_generator(self.spec.seed, i)) for i, p in enumerate(prompts)]
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

"""The decode loop: prefill, then speculative steps or plain decoding, each recorded into a trace.

A speculative step reads as SGLang's `EAGLEWorker.forward_batch_generation` (draft, verify,
forward_draft_extend_after_decode), with acceptance and the KV bookkeeping as phases of their own:

    DRAFT    the drafter proposes a tree of num_draft_tokens nodes rooted at the last committed
             token (a chain when topk is 1), with its mask, positions and retrive_* lists
    VERIFY   one target forward over every node; each sees the prefix, its ancestors and itself
    ACCEPT   the acceptance rule walks the tree: correct_drafts + 1 bonus_token
    COMMIT   the target keeps the KV of the accepted path; the rest is released
    EXTEND   the drafter catches up on accept_tokens (DRAFT_EXTEND)
    RECORD   one trace record per request (step_record.py)

Requests of a batch have their own prompt and accept lengths: each phase is one ragged pass over
the unfinished requests, and what a request carries through a step lives in its `StepRow`
(core/request.py).
Plain decoding (--algo none) is its own short path, `decode_one_token`, as in gpt-fast.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace

import torch

from spectrace.core import acceptance
from spectrace.core.acceptance import AcceptResult, bonus_from
from spectrace.core.acceptance.tree_rejection import SiblingStats
from spectrace.core.adaptive import AdaptiveSpeculativeParams
from spectrace.core.batch import ForwardBatch
from spectrace.core.drafters import Drafter, SampledDrafts
from spectrace.core.kv import KVCache
from spectrace.core.metrics import SpecMetrics
from spectrace.core.model import CausalLM
from spectrace.core.probs import ProbsRecorder
from spectrace.core.request import Request, StepRow, append_tokens
from spectrace.core.sampling import probs_from_logits, request_generator, sample
from spectrace.core.step_record import prefill_record, record_token_ids, step_record
from spectrace.core.trace import TraceWriter
from spectrace.core.spec import SpecConfig
from spectrace.core.tree import DraftTree
from spectrace.errors import SpectraceError


class Engine:
    def __init__(self, target: CausalLM, kv: KVCache, spec: SpecConfig, eos_token_ids,
                 drafter: Drafter | None = None, trace: TraceWriter | None = None, on_step=None,
                 probs: ProbsRecorder | None = None):
        """kv: the target's paged KV, sized for every request (spectrace/engines.py: build_engine);
        on_step(record): called with every step record, after the metrics saw it; probs: keeps
        each walk's inputs for `spectrace rejudge` (--record-probs)."""
        if (spec.algo == "none") != (drafter is None):
            raise SpectraceError(f"--algo {spec.algo} "
                                 f"{'takes no' if spec.algo == 'none' else 'needs a'} drafter")
        self.target, self.kv, self.spec, self.drafter = target, kv, spec, drafter
        self.trace, self.on_step, self.probs = trace, on_step, probs
        self.eos = set(eos_token_ids)
        self.device = target.lm_head.weight.device
        self.rule = acceptance.RULES[spec.acceptance]
        self.sibling_stats: dict[int, SiblingStats] = {}  # req -> tree_rejection's sibling worth
        self.adaptive = AdaptiveSpeculativeParams(spec.num_steps) if spec.adaptive else None
        self.metrics = SpecMetrics(spec.max_steps, spec.num_draft_tokens)
        self.step_count = 0

    @property
    def drafter_kv(self) -> KVCache | None:
        return self.drafter.kv if self.drafter is not None else None

    # ---- the loop ------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]]) -> tuple[list[Request], dict]:
        reqs = [Request(i, list(p), gen=request_generator(self.spec.seed, i))
                for i, p in enumerate(prompts)]
        t0 = time.perf_counter()
        self.prefill(reqs)
        step = self.decode_one_token if self.spec.algo == "none" else self.speculative_step
        while live := [r for r in reqs if not r.finish_reason]:
            step(live)
        self._sync()
        metrics = self.metrics.summary(time.perf_counter() - t0)
        metrics["per_request"] = [self.metrics.per_request(r.req_pool_idx) for r in reqs]
        return reqs, metrics

    @torch.no_grad()
    def prefill(self, reqs: list[Request]) -> None:
        """Target EXTEND over every prompt; its last row gives each request's first token. Then
        the drafter aligns itself with the prompt (SGLang's forward_draft_extend)."""
        rows, timing = [StepRow(r, 0, 0 if self.drafter_kv is not None else None, None)
                        for r in reqs], {}
        for row in rows:
            row.candidates, row.positions = (list(row.req.prompt_ids),
                                             list(range(len(row.req.prompt_ids))))
        with self.phase("prefill", rows, timing):
            logits, features = self.forward_rows(rows, last_only=True)  # logits (bs, V)
            for b, row in enumerate(rows):
                n = len(row.candidates)
                self.kv.commit(row.req.req_pool_idx, 0, n, list(range(n)))
                self.append(row.req, [self.next_token(logits[b], row.req.gen)])
        live = [row for row in rows if not row.req.finish_reason]
        if self.drafter is not None and live:
            with self.phase("extend", live, timing):
                self.drafter.draft_extend_for_prefill([
                    (row.req.req_pool_idx, row.req.prompt_ids + row.req.output_ids,
                     features[row.first_row:row.first_row + len(row.candidates)]) for row in live])
        for row in rows:
            self.metrics.observe_prefill(row.req.req_pool_idx, sum(timing.values()))
            rec = prefill_record(row, row.req.output_ids[0], self.kv_record(row), timing)
            if self.trace:
                self.trace.write(rec, row.req.prompt_ids + row.req.output_ids)

    @torch.no_grad()
    def decode_one_token(self, reqs: list[Request]) -> None:
        """Plain autoregressive decoding, one token per request: the target reads the last
        token; the next is its argmax, or a sample of p."""
        rows, timing = self.new_rows(reqs), {}
        for row in rows:
            row.candidates, row.positions = [row.req.output_ids[-1]], [row.seq_len]
        with self.phase("verify", rows, timing):
            logits, _ = self.forward_rows(rows)
        with self.phase("accept", rows, timing):
            for row in rows:
                self.read_verify(row, logits)
                row.result = self.plain_result(row, logits[row.first_row])
        with self.phase("commit", rows, timing):
            self.commit(rows)
        self.record(rows, None, timing)

    @torch.no_grad()
    def speculative_step(self, reqs: list[Request]) -> None:
        """DRAFT -> VERIFY -> ACCEPT -> COMMIT -> EXTEND -> RECORD for every request in `reqs`."""
        rows, timing = self.new_rows(reqs), {}
        with self.phase("draft", rows, timing):
            tree = self.draft(rows)
        with self.phase("verify", rows, timing):
            logits, features = self.verify(rows, tree)
        with self.phase("accept", rows, timing):
            self.accept(rows, tree, logits)
        with self.phase("commit", rows, timing):
            self.commit(rows)
        live = [row for row in rows if not row.req.finish_reason]
        with self.phase("extend", live, timing):
            self.extend(live, features)
        self.record(rows, tree, timing)

    # ---- the phases ----------------------------------------------------------------------
    def draft(self, rows: list[StepRow]) -> DraftTree:
        """DRAFT: the drafter's tree for every request, rooted at its last committed token.
        Sampling rules get drafts sampled from q (trees ranked by each request's sibling worth)."""
        sampled = None
        if self.rule.samples_drafts:
            worth = (torch.stack([self.siblings(row.req).worth() for row in rows])
                     if self.spec.topk > 1 else None)
            sampled = SampledDrafts([row.req.gen for row in rows], worth)
        tree = self.drafter.draft([row.req.req_pool_idx for row in rows],
                                  [row.req.output_ids[-1] for row in rows],
                                  [row.seq_len for row in rows], sampled)
        for b, row in enumerate(rows):
            n = tree.size(b)
            row.b, row.drafted = b, n > 1  # n-gram without a match: the root alone, a plain decode
            row.candidates, row.positions = (tree.draft_tokens[b, :n].tolist(),
                                             tree.positions[b, :n].tolist())
        return tree

    def verify(self, rows: list[StepRow], tree: DraftTree):
        """VERIFY (TARGET_VERIFY): one target forward over every node of every tree. Node j of a
        request takes req_to_token[req, seq_len + j] and sees the committed prefix, then the
        root, its ancestors and itself."""
        masks = []
        for row in rows:
            n = len(row.candidates)
            prefix = torch.ones(n, row.seq_len, dtype=torch.bool, device=self.device)
            # (n, seq_len + n)
            masks.append(torch.cat([prefix, tree.tree_mask[row.b, :n, :n]], dim=1))
        return self.forward_rows(rows, masks)

    def accept(self, rows: list[StepRow], tree: DraftTree, logits: torch.Tensor) -> None:
        """ACCEPT: the rule walks each request's tree from the root, with random numbers drawn
        from the request's generator in the order the peers' kernels read them."""
        for row in rows:
            self.read_verify(row, logits)
            if not row.drafted:
                row.result = self.plain_result(row, logits[row.first_row])
                continue
            n, b = len(row.candidates), row.b
            next_token = tree.retrive_next_token[b, :n].tolist()
            next_sibling = tree.retrive_next_sibling[b, :n].tolist()
            draft_probs = tree.draft_probs[b].cpu() if tree.draft_probs is not None else None
            randoms = self.rule.draw(n, row.target_probs.shape[-1], row.req.gen)
            if self.probs is not None:  # before the walk, which may write into q
                self.probs.add(self.step_count, row.req.req_pool_idx,
                               logits[row.first_row:row.first_row + n],
                               tree.q_dists[b] if tree.q_dists is not None else None, randoms)
            args = (row.candidates, next_token, next_sibling, row.target_predict, row.target_probs,
                    draft_probs, randoms, self.spec.num_steps, self.spec.rule_params)
            twin = acceptance.TWIN_WALKS[self.kv.backend].get(self.rule.name)
            # first: walks may write q
            twin_result = twin(self.device, *args) if twin is not None else None
            row.result = self.rule.walk(*args)
            if twin_result is not None and twin_result != (row.result.accept_nodes,
                                                           row.result.bonus_token):
                raise SpectraceError(
                    f"--backend {self.kv.backend}: the {self.rule.name} kernel walked "
                    f"{twin_result[0]} with bonus {twin_result[1]} where the explicit walk "
                    f"walked {row.result.accept_nodes} with bonus {row.result.bonus_token} "
                    f"(request {row.req.req_pool_idx}, step {self.step_count})")
            # what each sibling rank was worth shapes the next trees
            if self.rule.name == "tree_rejection":
                self.siblings(row.req).observe(row.result.decisions, next_token, next_sibling)

    def commit(self, rows: list[StepRow]) -> None:
        """COMMIT: the target keeps the accepted path's KV (sglang: remap the kept slots, free the
        rest; vllm: roll num_computed_tokens back), and the request takes accept_tokens up to EOS
        or max_new_tokens."""
        for row in rows:
            self.kv.commit(row.req.req_pool_idx, row.seq_len, len(row.candidates),
                           row.result.accept_nodes)
            row.committed = self.append(row.req, row.result.accept_tokens)

    def extend(self, rows: list[StepRow], features: torch.Tensor) -> None:
        """EXTEND (DRAFT_EXTEND): the drafter reads each live request's accept_tokens with the
        target features of the accepted path's rows (root .. last correct draft)."""
        if rows:
            self.drafter.draft_extend([
                (row.req.req_pool_idx, row.result.accept_tokens,
                 features[[row.first_row + j for j in row.result.accept_nodes]]) for row in rows])

    def record(self, rows: list[StepRow], tree: DraftTree | None, timing: dict) -> None:
        """RECORD: adaptive steps fold the batch in; each request's step record goes to the
        metrics, the trace and on_step."""
        adaptive = self.adapt(rows) if self.adaptive is not None else None
        for row in rows:
            rec = step_record(self.step_count, row, tree, self.rule.name, self.kv_record(row),
                              {**timing, "batch_size": len(rows)}, self.spec.trace_topk, adaptive)
            self.metrics.observe_step(rec)
            if self.trace:
                self.trace.write(rec, record_token_ids(rec), flush=False)
            if self.on_step:
                self.on_step(rec)
        if self.trace:
            self.trace.flush()  # the step's records, whole, at once
        self.step_count += 1

    def adapt(self, rows: list[StepRow]) -> dict:
        """Fold this batch into the adaptive EMA; a new tier takes effect from the next step,
        swapped in whole as SGLang swaps its SpecRuntimeState."""
        adaptive = self.adaptive.step([len(row.result.correct_drafts) for row in rows])
        if S := adaptive["switched_to"]:
            self.spec = replace(self.spec, num_steps=S, num_draft_tokens=S + 1)
            self.drafter.set_num_steps(S)
        return adaptive

    # ---- helpers -------------------------------------------------------------------------
    @contextmanager
    def phase(self, name: str, rows: list[StepRow], timing: dict):
        """Time one phase (waiting for the GPU, so times are real) and file the KV events it
        caused into each row, tagged with the phase."""
        self._sync()
        t0 = time.perf_counter()
        yield
        self._sync()
        timing[name] = round((time.perf_counter() - t0) * 1000, 3)
        self.file_events(rows, name)

    def file_events(self, rows: list[StepRow], phase: str) -> None:
        for row in rows:
            for kv in (self.kv, self.drafter_kv):
                if kv is not None:
                    row.events += [{**e, "phase": phase}
                                   for e in kv.take_events(row.req.req_pool_idx)]

    def new_rows(self, reqs: list[Request]) -> list[StepRow]:
        return [StepRow(r, self.kv.seq_lens[r.req_pool_idx],
                        self.drafter_kv.seq_lens[r.req_pool_idx] if self.drafter_kv is not None
                        else None, self.req_to_token_tail(r.req_pool_idx)) for r in reqs]

    def forward_rows(self, rows: list[StepRow], masks=None, last_only: bool = False):
        """The target over each row's candidates at its positions, written after its seq_len
        committed tokens: logits (N, V), or (bs, V) of the last rows, and the features drafters
        read (N, F)."""
        batch = ForwardBatch.build(self.kv,
                                   [(row.req.req_pool_idx, row.seq_len, row.candidates)
                                    for row in rows],
                                   masks, [row.positions for row in rows])
        # --deterministic: verify and decode rows each computed alone; prefill (last_only) stays
        # batched, as it is in the plain decoding a deterministic run is compared with
        batch.batch_invariant = self.spec.deterministic and not last_only
        first = 0
        for row in rows:
            row.first_row, first = first, first + len(row.candidates)
        out = self.target(batch, self.kv,
                          self.drafter.capture_layers if self.drafter is not None else (),
                          last_only)
        features = (torch.cat(out.aux_hidden_states, dim=-1) if out.aux_hidden_states
                    else out.hidden_states)
        return out.logits, features

    def read_verify(self, row: StepRow, logits: torch.Tensor) -> None:
        """This request's verify rows: the target's argmax after each node (ties to the lowest
        id, as autoregressive decoding breaks them) and p (softmax at temperature 0, which the
        trace shows; else after temperature, top-k and top-p), on the CPU where the walks run."""
        lg = logits[row.first_row:row.first_row + len(row.candidates)]
        row.target_predict = torch.argmax(lg, dim=-1).tolist()
        p = (torch.softmax(lg, dim=-1) if self.spec.sampling.greedy
             else probs_from_logits(lg, self.spec.sampling))
        row.target_probs = p.cpu()

    def next_token(self, logits: torch.Tensor, gen: torch.Generator | None) -> int:
        """Plain decoding's next token after one row of logits: the argmax, or a sample of p."""
        if self.spec.sampling.greedy:
            return int(torch.argmax(logits))
        return sample(probs_from_logits(logits, self.spec.sampling), gen)

    def plain_result(self, row: StepRow, logits: torch.Tensor) -> AcceptResult:
        """A step without drafts: the root's next token is the bonus."""
        token = self.next_token(logits, row.req.gen)
        if self.spec.sampling.greedy:
            return AcceptResult([], token, [0], [])
        return AcceptResult([], token, [0], [],
                            bonus_from("target", 0, row.target_probs[0], self.spec.trace_topk))

    def append(self, r: Request, tokens: list[int]) -> list[int]:
        return append_tokens(r, tokens, self.eos, self.spec.max_new_tokens)

    def siblings(self, r: Request) -> SiblingStats:
        """What a tree_rejection request's j-th sibling draw has been worth so far."""
        return self.sibling_stats.setdefault(r.req_pool_idx, SiblingStats(self.spec.topk))

    def req_to_token_tail(self, req: int, n: int = 16) -> dict:
        """The last n committed entries of `req_to_token` for one request: the pointers a viewer
        shows."""
        end = self.kv.seq_lens[req]
        start = max(0, end - n)
        return {"start": start, "slots": self.kv.req_to_token[req, start:end].tolist()}

    def kv_record(self, row: StepRow) -> dict:
        """KV state of one request after its step; a finished request releases its slots here,
        so the trace shows them freed."""
        req = row.req.req_pool_idx
        rec = {"style": self.spec.commit_style,
               "target_seq_len": [row.seq_len, self.kv.seq_lens[req]],
               "req_to_token_tail_before": row.tail_before,
               "req_to_token_tail": self.req_to_token_tail(req)}
        if self.drafter_kv is not None:
            rec["draft_seq_len"] = [row.draft_seq_len, self.drafter_kv.seq_lens[req]]
        if row.req.finish_reason:
            self.kv.release(req)
            self.sibling_stats.pop(req, None)
            if self.drafter is not None:
                self.drafter.release(req)
        self.file_events([row], "finish")
        return {**rec, "events": row.events, "free_slots": len(self.kv.allocator.free_slots)}

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

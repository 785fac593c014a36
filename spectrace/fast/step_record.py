"""The explicit engine's step records (core/step_record.py) from a fast step's tensors.

A recording run (a trace, or on_step) copies the step's tensors to the host in one copy that
the host does not wait for (`copy_step`, a `PackedCopy` enqueued behind the step), so the next
step is launched before this one is recorded, as in an untraced run. Once the copy has landed,
`host_tensors` rebuilds each request's draft tree and StepRow from it, and the explicit rule's
walk runs over the same tree with the same p and random numbers: its per-node
decisions are what the trace records, and a step whose kernel path or bonus differs from the
explicit walk's is refused with one line. The KV part records lengths and the req_to_token
pointers; the static KV has no allocator, so it has no events.
"""
from __future__ import annotations

import torch

from spectrace.core.acceptance import RULES, AcceptResult, Randoms, bonus_from
from spectrace.core.drafters.eagle_worker import draft_candidates
from spectrace.core.engine import Request, StepRow
from spectrace.core.probs import ProbsRecorder
from spectrace.core.sampling import as_pairs, probs_from_logits
from spectrace.core.spec import SpecConfig
from spectrace.core.step_record import prefill_record, record_token_ids, step_record
from spectrace.core.trace import TraceWriter
from spectrace.core.tree import DraftTree
from spectrace.errors import SpectraceError

TREE_FIELDS = ("draft_tokens", "positions", "retrive_index", "retrive_next_token", "retrive_next_sibling")


class PackedCopy:
    """Device tensors to the host in one copy: each viewed as bytes and concatenated on the device
    (one kernel), then copied into pinned memory without waiting. `tensors()` reads them back once
    the copy has landed (after the step's event); None entries stay None."""
    ALIGN = 8  # every tensor starts at a multiple of the largest element size

    def __init__(self, tensors: dict):
        self.layout, chunks, at = {}, [], 0
        for name, t in tensors.items():
            if t is None:
                self.layout[name] = None
                continue
            size = t.numel() * t.element_size()
            self.layout[name] = (at, size, t.dtype, tuple(t.shape))
            pad = -size % self.ALIGN
            chunks += [t.contiguous().view(-1).view(torch.uint8)] + [t.new_zeros(pad, dtype=torch.uint8)] * (pad > 0)
            at += size + pad
        flat = torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.uint8)
        self.host = torch.empty(flat.shape, dtype=torch.uint8, pin_memory=flat.is_cuda)
        self.host.copy_(flat, non_blocking=flat.is_cuda)

    def tensors(self) -> dict:
        return {name: None if where is None else self.host[where[0]:where[0] + where[1]].view(where[2]).view(where[3])
                for name, where in self.layout.items()}


class StepRecorder:
    """A recording run's records: to the trace (a TraceWriter) and to on_step (the live view)."""

    def __init__(self, spec: SpecConfig, drafter, probs: ProbsRecorder | None, trace: TraceWriter | None, on_step):
        self.spec, self.drafter, self.probs, self.trace, self.on_step = spec, drafter, probs, trace, on_step
        self.walk = RULES[spec.acceptance].walk

    def write_prefill(self, r: Request, first_token: int, ms: float) -> None:
        if self.trace:
            self.trace.write(self.prefill_record(r, first_token, ms), r.prompt_ids + r.output_ids)

    def write_step(self, *args) -> None:
        """`record`'s record (its arguments), to the trace (flushed with the step's others: `flush`)
        and to on_step."""
        rec = self.record(*args)
        if self.trace:
            self.trace.write(rec, record_token_ids(rec), flush=False)
        if self.on_step:
            self.on_step(rec)

    def flush(self) -> None:
        """A step's records onto the disk, whole, at once."""
        if self.trace:
            self.trace.flush()

    def prefill_record(self, r: Request, first_token: int, ms: float) -> dict:
        kv = {"style": "sglang", "target_seq_len": [0, len(r.prompt_ids)], "events": [], "free_slots": None}
        return prefill_record(StepRow(r, 0, None, None), first_token, kv, {"prefill": ms})

    def copy_step(self, out, randoms, kv, seq_lens_before: torch.Tensor) -> PackedCopy:
        """The step's tensors (out: its StepOutputs; randoms: its DeviceRandoms), on their way to
        the host (the cost of --trace-level steps/full)."""
        tree, verdict, bs, n = out.tree, out.verdict, *out.tree.draft_tokens.shape
        sampling = self.spec.sampling  # p as the trace shows it: softmax at temperature 0, else after T, top-k, top-p
        p = torch.softmax(out.logits, dim=-1) if sampling.greedy else probs_from_logits(out.logits, sampling)
        p = p.view(bs, n, -1)
        step = {"target_predict": out.target_predict.view(bs, n), "accept_index": verdict.accept_index,
                "accept_num": verdict.accept_num, "req_to_token": kv.req_to_token, "seq_lens": kv.seq_lens,
                "seq_lens_before": seq_lens_before,
                "logits": out.logits.float().view(bs, n, -1) if self.probs is not None else None}
        if self.reduces_p:  # what the record keeps of p, not p: (bs, n, k) and (bs, n, n), not (bs, n, V)
            values, indices = torch.topk(p, min(self.spec.trace_topk, p.shape[-1]))
            step.update(target_topk_values=values, target_topk_indices=indices,
                        p_tokens=p.gather(-1, tree.draft_tokens[:, None, :].expand(bs, n, n)))
        else:
            step["target_probs"] = p
        if self.drafter is not None:
            step.update({name: getattr(tree, name) for name in TREE_FIELDS})
            step["draft_seq_lens"] = self.drafter.kv.seq_lens if self.drafter.kv is not None else None
        if self.drafter is not None and not self.drafter.drafts_on_host:  # n-gram's trees are on the host already
            step.update({name: getattr(tree, name) for name in ("tree_mask", "q", "scores", "draft_probs")})
            step["worth"] = randoms.worth if self.spec.acceptance == "tree_rejection" and self.spec.topk > 1 else None
            step["draft_top_values"], step["draft_top_indices"] = tree.draft_top
            for i, t in enumerate(tree.candidates or ()):
                step[f"candidates{i:02d}"] = t
        return PackedCopy(step)

    @property
    def reduces_p(self) -> bool:
        """The greedy walk reads no p: a record keeps only p's top-k after each node and p of each
        node's token, which the device picks out, so the step's copy to the host is (bs, n, k + n)
        floats, not (bs, n, V): with Llama 3's 128k-token vocabulary, at batch 64, 33 MB a step of
        plain decoding and 263 MB a step of trees of 8."""
        return self.spec.acceptance == "greedy" and self.spec.sampling.greedy

    def host_tensors(self, copied: PackedCopy) -> dict:
        """The step's tensors on the host, once `copied` has landed, as the records read them."""
        host = copied.tensors()
        if "target_topk_values" in host:
            host["target_topk"] = as_pairs(host.pop("target_topk_indices").tolist(),
                                           host.pop("target_topk_values").tolist())
            host["p_tokens"] = host["p_tokens"].tolist()
        if "draft_top_values" in host:
            host["draft_topk"] = [as_pairs(ib, vb) for ib, vb in zip(host.pop("draft_top_indices").tolist(),
                                                                    host.pop("draft_top_values").tolist())]
            candidates = [host.pop(k) for k in sorted(k for k in host if k.startswith("candidates"))]
            host["candidates"] = draft_candidates(*candidates, self.spec.topk) if candidates else None
        return host

    def draft_tree(self, host: dict, b: int) -> tuple[DraftTree | None, int, int]:
        """The step's trees as core's DraftTree, request b's index in them, and its size."""
        if self.drafter is None:
            return None, b, 1
        if self.drafter.drafts_on_host:  # the trees the host drafted (they keep the n-gram's match)
            tree, i = self.drafter.tree, self.drafter.index[b]
            return tree, i, tree.size(i)
        tree = DraftTree(
            draft_tokens=host["draft_tokens"], tree_mask=host["tree_mask"], positions=host["positions"],
            retrive_index=host["retrive_index"], retrive_next_token=host["retrive_next_token"],
            retrive_next_sibling=host["retrive_next_sibling"], q=host["q"], scores=host["scores"],
            draft_topk=host["draft_topk"], candidates=host["candidates"], sibling_worth=host["worth"])
        return tree, b, host["draft_tokens"].shape[1]

    def record(self, step: int, b: int, r: Request, host: dict, tokens: list[int], randoms, committed: list[int],
               timing: dict, adaptive: dict | None, max_depth: int) -> dict:
        """Request b's step record (tokens: the step's accept tokens, the bonus last)."""
        seq_before = int(host["seq_lens_before"][b])
        tree, i, size = self.draft_tree(host, b)
        row = StepRow(r, seq_before, None, None, b=i, drafted=size > 1, committed=committed)
        row.target_predict = host["target_predict"][b, :size].tolist()
        if self.reduces_p:
            row.target_topk = host["target_topk"][b][:size]
            row.p_tokens = [r[:size] for r in host["p_tokens"][b][:size]]
        else:
            row.target_probs = host["target_probs"][b, :size]
        if size == 1:  # plain decoding, or an n-gram request that drafted nothing: core's plain_result
            row.candidates, row.positions = [r.output_ids[-len(committed) - 1]], [seq_before]
            row.result = AcceptResult([], tokens[-1], [0], [], None if self.spec.sampling.greedy else
                                      bonus_from("target", 0, row.target_probs[0], self.spec.trace_topk))
        else:
            self.walk_explicitly(step, b, row, host, tokens, randoms, max_depth)
        return step_record(step, row, tree, self.spec.acceptance, self.kv_record(b, host, seq_before), timing,
                           self.spec.trace_topk, adaptive)

    def walk_explicitly(self, step: int, b: int, row: StepRow, host: dict, tokens: list[int], randoms,
                        max_depth: int) -> None:
        """The explicit rule's walk over request b's tree, which must reach the kernels' path and bonus."""
        size, n = len(row.target_predict), host["draft_tokens"].shape[1]
        draft_probs = host.get("draft_probs")
        if self.probs is not None:  # the walk's inputs, for spectrace rejudge
            self.probs.add(step, row.req.req_pool_idx, host["logits"][b, :size],
                           draft_probs[b] if draft_probs is not None else None, randoms or Randoms())
        row.candidates = host["draft_tokens"][b, :size].tolist()
        row.positions = host["positions"][b, :size].tolist()
        sampled = self.drafter.samples_drafts
        row.result = self.walk(row.candidates, host["retrive_next_token"][b, :size].tolist(),
                               host["retrive_next_sibling"][b, :size].tolist(), row.target_predict, row.target_probs,
                               draft_probs[b] if sampled else None, randoms, max_depth, self.spec.rule_params)
        num = int(host["accept_num"][b])
        kernel_path = (host["accept_index"][b, :num + 1] - b * n).tolist()
        if (kernel_path, tokens[-1]) != (row.result.accept_nodes, row.result.bonus_token):
            raise SpectraceError(
                f"--backend fast: the {self.spec.acceptance} kernel walked {kernel_path} with bonus {tokens[-1]} "
                f"where the explicit walk walked {row.result.accept_nodes} with bonus {row.result.bonus_token} "
                f"(request {b}, step {step})")

    def kv_record(self, b: int, host: dict, seq_before: int) -> dict:
        after = int(host["seq_lens"][b])
        kv = {"style": "sglang", "target_seq_len": [seq_before, after],
              "req_to_token_tail": {"start": max(0, after - 16),
                                    "slots": host["req_to_token"][b, max(0, after - 16):after].tolist()},
              "events": [], "free_slots": None}
        if host.get("draft_seq_lens") is not None:
            d_after, num = int(host["draft_seq_lens"][b]), int(host["accept_num"][b])
            kv["draft_seq_len"] = [d_after - num - 1, d_after]  # EXTEND ran over every accepted token
        return kv

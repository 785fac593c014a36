"""What a recording fast run keeps of each step (fast/records.py builds the records from it).

A recording run (a trace, or on_step) packs the step's tensors on the device (`pack`: in the
step's last CUDA graph, so its time counts in that launch group's) and copies them to the host
in one copy that the host does not wait for (`copy_step`), so the next step is launched before
this one is recorded, as in an untraced run. Once the copy has landed, `keep` makes the step's
frame (fast/frames.py): with only a trace to write, it goes to TRACE.frames, where readers build
the records (spectrace/traces.py); for a live view (on_step) they are built at once.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import NamedTuple

import torch

from spectrace.core.acceptance import Randoms
from spectrace.core.request import Request, StepRow
from spectrace.core.probs import ProbsRecorder
from spectrace.core.sampling import probs_from_logits
from spectrace.core.spec import SpecConfig
from spectrace.core.step_record import prefill_record, record_token_ids
from spectrace.core.trace import TraceWriter, frames_path
from spectrace.errors import SpectraceError
from spectrace.fast.frames import FrameWriter, Pack, split
from spectrace.fast.graphs import Phase, eager, with_record
from spectrace.fast.records import TAIL, RecordBuilder, RecordContext
from spectrace.kernels.top_k import top_k_softmax


class Kept(NamedTuple):
    """What the host knows of a request that ran a step and its tensors do not hold: the frame's
    head carries it (its root and accept tokens are in the tensors: `roots`, `host_row`)."""
    b: int  # its row in the bucket, which is its request id
    committed: int  # how many of its accept tokens it kept (all but where it finished)
    finish_reason: str | None
    draws: object  # its random numbers: None (greedy), a float (a plain sample) or Randoms


TREE_FIELDS = ("draft_tokens", "positions", "retrive_index", "retrive_next_token",
               "retrive_next_sibling")
# the step tensors that hold token ids a record mentions (the trace carries their text)
TOKEN_TENSORS = ("target_predict", "draft_tokens", "target_topk_indices",
                 "draft_top_indices", "candidates00")


def last_slots(req_to_token: torch.Tensor, seq_lens: torch.Tensor, n: int = TAIL) -> torch.Tensor:
    """(bs, n): each request's last n KV slots after the step (its first n while it holds fewer),
    what a record keeps of req_to_token, gathered on the device so a frame carries no more."""
    start = (seq_lens - n).clamp(min=0)
    cols = start[:, None] + torch.arange(n, device=seq_lens.device)
    return torch.gather(req_to_token, 1, cols.clamp(max=req_to_token.shape[1] - 1))


class StepRecorder:
    """A recording run's records: to the trace (a TraceWriter), through the frames sidecar, and
    to on_step (the live view)."""

    def __init__(self, spec: SpecConfig, drafter, kv, roots: torch.Tensor,
                 probs: ProbsRecorder | None, trace: TraceWriter | None, on_step, vocab_size: int):
        """roots: the runner's, each request's last token, which a step's records start from."""
        self.spec, self.drafter, self.kv = spec, drafter, kv
        self.trace, self.on_step = trace, on_step
        self.roots, self.roots_before = roots, torch.zeros_like(roots)  # the roots the step found
        # every token id the steps' records mention, marked on the device as each step is packed
        self.mentioned = torch.zeros(vocab_size, dtype=torch.bool, device=kv.seq_lens.device)
        self.keeps_logits = probs is not None
        self.before = torch.zeros_like(kv.seq_lens)  # the target's lengths as the step found them
        # a captured tier's num_steps -> the Pack its last graph rewrites
        self.packs: dict[int, Pack] = {}
        self.no_host, self.layouts_kept = Pack({}), {}  # key -> layout of those a frame holds
        self.builder = RecordBuilder(RecordContext.of(spec, drafter), probs)
        self.frames, self.loop_s = None, 0.0  # loop_s: the host's time writing frames
        # the steps as frames, built into records by readers; for a live view, or a trace that is
        # a device (--trace /dev/null), records as the run goes
        if trace is not None and on_step is None and trace.path.is_file():
            self.frames = FrameWriter(frames_path(trace.path))
            self.frames.write({"context": asdict(self.builder.context), "run": trace.run_id})

    def write_prefill(self, reqs: list[Request], first: list[int], ms: float) -> None:
        """The prefill records; the target's lengths, which the first step finds."""
        self.before.copy_(self.kv.seq_lens)
        self.roots_before.copy_(self.roots)
        for r, t in zip(reqs, first) if self.trace else ():
            self.trace.write(self.prefill_record(r, t, ms), r.prompt_ids + r.output_ids)

    def prefill_record(self, r: Request, first_token: int, ms: float) -> dict:
        kv = {"style": "sglang", "target_seq_len": [0, len(r.prompt_ids)], "events": [],
              "free_slots": None}
        return prefill_record(StepRow(r, 0, None, None), first_token, kv, {"prefill": ms})

    def packed(self, step, tier):
        """A captured tier's step (step(phases) -> StepOutputs) that also packs its tensors, in the
        last launch group's graph (fast/graphs.py: with_record): the Pack that graph rewrites."""
        def step_and_pack(phases):
            out = step(phases)
            self.packs[tier.num_steps] = self.pack(phases, out, tier.randoms)
            return out
        return step_and_pack

    def launch_groups(self, groups: tuple) -> tuple:
        """The launch groups a GPU captures for a recording run: the pack last in the last."""
        return with_record(groups)

    def copy_step(self, tier, out) -> Pack:
        """The step's tensors (out: its StepOutputs) packed on the device (a captured tier: by its
        last graph) and on their way to the host: the cost of --trace-level steps/full inside the
        loop."""
        if tier.graphs and tier.num_steps in self.packs:
            return self.packs[tier.num_steps].to_host()
        return self.pack(eager, out, tier.randoms).to_host()

    def pack(self, phase, out, randoms) -> Pack:
        """The tensors a step's records read (randoms: the tier's DeviceRandoms), as one Pack;
        then the target's lengths, which the next step finds."""
        with phase(Phase.RECORD):
            tensors = self.step_tensors(out, randoms)
            self.mention(tensors, out)
            pack = Pack(tensors)
            self.before.copy_(self.kv.seq_lens)
            self.roots_before.copy_(self.roots)
            return pack

    def mention(self, tensors: dict, out) -> None:
        """The token ids of a step's records marked in `mentioned`: its trees, argmaxes and top-k,
        its accept tokens (-1 pads them) and, where p is kept whole, its top trace_topk after each
        node (a sampled bonus's residual top-k is not marked: its text comes from the tokenizer
        where the trace is read)."""
        ids = [tensors[name].flatten() for name in TOKEN_TENSORS if tensors.get(name) is not None]
        ids.append(out.verdict.accept_tokens.flatten())
        if tensors.get("target_probs") is not None:
            p = tensors["target_probs"]
            k = min(self.spec.trace_topk, p.shape[-1])
            ids.append(torch.topk(p, k, dim=-1).indices.flatten())
        ids = torch.cat([t.to(torch.int64) for t in ids])
        self.mentioned.index_fill_(0, ids.clamp(min=0), True)  # a scalar fill: graph-safe

    def step_tensors(self, out, randoms) -> dict:
        kv, tree, verdict, bs, n = self.kv, out.tree, out.verdict, *out.tree.draft_tokens.shape
        step = {"host_row": out.host_row,  # FastEngine.launch reads its row from this copy
                "target_predict": out.target_predict.view(bs, n),
                "accept_index": verdict.accept_index, "accept_num": verdict.accept_num,
                "req_to_token_tail": last_slots(kv.req_to_token, kv.seq_lens),
                "seq_lens": kv.seq_lens, "seq_lens_before": self.before, "roots": self.roots_before,
                "logits": out.logits.float().view(bs, n, -1) if self.keeps_logits else None}
        step.update(self.target_p(out.logits, tree.draft_tokens))
        if self.drafter is not None:
            step.update({name: getattr(tree, name) for name in TREE_FIELDS})
            step["draft_seq_lens"] = (self.drafter.kv.seq_lens if self.drafter.kv is not None
                                      else None)
        # n-gram's trees are on the host already
        if self.drafter is not None and not self.drafter.drafts_on_host:
            step.update({name: getattr(tree, name)
                         for name in ("tree_mask", "q", "scores", "draft_probs")})
            step["worth"] = (randoms.worth if self.spec.acceptance == "tree_rejection"
                             and self.spec.topk > 1 else None)
            step["draft_top_values"], step["draft_top_indices"] = tree.draft_top
            for i, t in enumerate(tree.candidates or ()):
                step[f"candidates{i:02d}"] = t
        return step

    def target_p(self, logits: torch.Tensor, drafts: torch.Tensor) -> dict:
        """What the record keeps of the target's p over logits (bs * n, V), drafts (bs, n) each
        request's tree's tokens. A greedy walk at temperature 0 (RecordContext.reduces_p) reads no
        p: its top trace_topk and p at the drafts after each node, (bs, n, k) and (bs, n, n), from
        the row's max and sum in the same two kernels, no (bs * n, V) softmax (kernels/top_k.py).
        Otherwise the whole of p (bs, n, V): softmax at temperature 0, else after T, top-k,
        top-p."""
        (bs, n), sampling = drafts.shape, self.spec.sampling
        if not self.builder.context.reduces_p:
            p = (torch.softmax(logits, dim=-1) if sampling.greedy
                 else probs_from_logits(logits, sampling))
            return dict(target_probs=p.view(bs, n, -1))
        k = min(self.spec.trace_topk, logits.shape[-1])
        values, indices, _, _, at = top_k_softmax(logits, k, drafts)
        return dict(target_topk_values=values.view(bs, n, k),
                    target_topk_indices=indices.view(bs, n, k), p_tokens=at.view(bs, n, n))

    def keep(self, step: int, copied: Pack, requests: list[Kept], timing: dict,
             adaptive: dict | None, max_depth: int) -> None:
        """A step's frame, once `copied` has landed: to the sidecar, or into records at once (for
        on_step, or a trace that is a device)."""
        t0 = time.perf_counter()
        host, head = {}, {"step": step, "timing": timing, "adaptive": adaptive,
                          "max_depth": max_depth, "ran": [kept.b for kept in requests]}
        finished = [[kept.b, kept.committed, kept.finish_reason] for kept in requests
                    if kept.finish_reason]
        if finished:
            head["finished"] = finished
        if requests and requests[0].draws is not None:  # a sampling run's random numbers
            head["draws"] = {}
            for kept in requests:
                if isinstance(kept.draws, Randoms):
                    fields, tensors = split(kept.draws)
                    host.update({f"draw{kept.b}.{k}": t for k, t in tensors.items()})
                    head["draws"][str(kept.b)] = {"randoms": fields}
                else:
                    head["draws"][str(kept.b)] = kept.draws
        if self.drafter is not None and self.drafter.drafts_on_host:  # the trees the host drafted
            head["host_tree"], tensors = split(self.drafter.tree)
            head["index"] = [[b, i] for b, i in self.drafter.index.items()]
            host.update({f"tree.{k}": t for k, t in tensors.items()})
        host = Pack(host) if host else self.no_host  # on the host already
        head["packs"] = {"device": self.layout_key(copied, head),
                         "host": self.layout_key(host, head)}
        if self.frames:
            self.frames.write(head, copied.host, host.host)
            self.loop_s += time.perf_counter() - t0
            return
        for rec in self.builder.records(head, copied.host, host.host):
            if self.trace:
                self.trace.write(rec, record_token_ids(rec), flush=False)
            if self.on_step:
                self.on_step(rec)
        if self.trace:
            self.trace.flush()

    def layout_key(self, pack: Pack, head: dict) -> int:
        """The key a frame names `pack`'s layout by: a layout is written once, in the first frame
        that uses it (a captured pack's every step; an eager step's pack, made anew, has the
        layout of the steps of its shape before it)."""
        if pack.key in self.layouts_kept:
            return pack.key
        for key, layout in self.layouts_kept.items():
            if layout == pack.layout:
                return key
        self.layouts_kept[pack.key] = pack.layout
        head.setdefault("layouts", {})[str(pack.key)] = pack.layout
        return pack.key

    def finish(self) -> dict:
        """After the loop (or once it was interrupted): the frames closed, and the trace told the
        token ids they mention (their text goes into its next line, the summary); readers build
        the records (spectrace/traces.py). With --record-probs every frame's records are built
        now, into the trace, a step at a time, and the sidecar removed: building them fills the
        walks' inputs. Returns {"trace_s": the seconds it took, "trace_loop_s": the host's seconds
        in the loop making and writing frames}, or nothing when the records were made as the run
        went."""
        if self.frames is None:
            return {}
        t0, frames = time.perf_counter(), self.frames
        frames.close()
        self.frames = None
        if self.builder.probs is None:
            self.trace.mention(self.mentioned.nonzero().flatten().tolist())
            return {"trace_s": round(time.perf_counter() - t0, 4),
                    "trace_loop_s": round(self.loop_s, 4)}
        try:
            for records in self.builder.frame_records(frames.path):
                for rec in records:
                    self.trace.write(rec, record_token_ids(rec), flush=False)
                # a step's records whole: a run killed now still reads up to here
                self.trace.flush()
        # a step the explicit walk refuses: the trace ends before it, as it says
        except SpectraceError:
            frames.path.unlink()
            raise
        frames.path.unlink()
        return {"trace_s": round(time.perf_counter() - t0, 4),
                "trace_loop_s": round(self.loop_s, 4)}


class NoRecorder:
    """A run that records nothing (no trace, no on_step): every part of the recorder does
    nothing."""

    def write_prefill(self, reqs: list[Request], first: list[int], ms: float) -> None:
        pass

    def packed(self, step, tier):
        return step

    def launch_groups(self, groups: tuple) -> tuple:
        return groups

    def copy_step(self, tier, out) -> None:
        return None

    def keep(self, step: int, copied, requests: list[Kept], timing: dict, adaptive: dict | None,
             max_depth: int) -> None:
        pass

    def finish(self) -> dict:
        return {}

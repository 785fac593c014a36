"""A fast run's step records, built from its frames (fast/frames.py) as the explicit engine
writes them (core/step_record.py).

A frame holds a step's tensors as they came off the device (each request's root and accept
tokens among them) and what the host knew besides: the rows that ran, where one finished, the
draws (`frame_requests`). `RecordBuilder.records` rebuilds
each request's draft tree and StepRow from it, and the explicit rule's walk runs over the same
tree with the same p and random numbers: its per-node decisions are what the trace records, and
a step whose kernel path or bonus differs from the explicit walk's is refused with one line. The
KV part records lengths and the req_to_token pointers; the static KV has no allocator, so it has
no events.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from spectrace.core.acceptance import RULES, AcceptResult, Randoms, RuleParams, bonus_from
from spectrace.core.drafters.eagle_worker import draft_candidates
from spectrace.core.request import Request, StepRow
from spectrace.core.probs import ProbsRecorder
from spectrace.core.sampling import as_pairs
from spectrace.core.spec import SpecConfig
from spectrace.core.step_record import record_token_ids, step_record
from spectrace.core.trace import MALFORMED, RecordFormat, frames_path
from spectrace.core.tree import DraftTree
from spectrace.errors import SpectraceError
from spectrace.fast.frames import frame_heads, join, read_blob, read_frames, unpack

TAIL = 16  # the KV slots a record keeps of a request's row (core/engine.py: req_to_token_tail)


@dataclass(frozen=True)
class RecordContext:
    """What building a step's records reads besides its frame: the run's rule and sampling and
    the kind of drafter (none for --algo none). The frames' first head, so that a reader can
    build the records of any frame."""
    acceptance: str
    greedy: bool  # temperature 0
    topk: int
    trace_topk: int
    threshold_single: float
    threshold_acc: float
    drafted: bool  # a drafter ran
    drafts_on_host: bool  # n-gram: its trees are the host's, in the frame
    samples_drafts: bool

    @classmethod
    def of(cls, spec: SpecConfig, drafter) -> RecordContext:
        return cls(spec.acceptance, spec.sampling.greedy, spec.topk, spec.trace_topk,
                   spec.threshold_single, spec.threshold_acc, drafter is not None,
                   drafter is not None and drafter.drafts_on_host,
                   drafter is not None and drafter.samples_drafts)

    @property
    def rule_params(self) -> RuleParams:
        return RuleParams(self.threshold_single, self.threshold_acc, self.trace_topk)

    @property
    def reduces_p(self) -> bool:
        """The greedy walk reads no p: a record keeps only p's top-k after each node and p of each
        node's token, which the device picks out, so the step's copy to the host is (bs, n, k + n)
        floats, not (bs, n, V): with Llama 3's 128k-token vocabulary, at batch 64, 33 MB a step of
        plain decoding and 263 MB a step of trees of 8."""
        return self.acceptance == "greedy" and self.greedy


class RecordBuilder:
    """The step records of frames (fast/frames.py), as the explicit engine writes them."""

    def __init__(self, context: RecordContext, probs: ProbsRecorder | None = None):
        self.context, self.probs = context, probs
        self.walk = RULES[context.acceptance].walk
        # a Pack's key -> its layout, from the frame that first used it
        self.layouts: dict[str, dict] = {}

    def frame_records(self, path: Path, skip=frozenset()) -> Iterator[list[dict]]:
        """The records of each whole frame of a sidecar, in order; skip: (step, request) pairs to
        leave out (those a trace holds already)."""
        for head, blob in itertools.islice(read_frames(path), 1, None):
            size = blob_bytes(self.layout(head, "device"))
            # clone: its own aligned buffer
            yield self.records(head, blob[:size], blob[size:].clone(),
                               {r for s, r in skip if s == head["step"]})

    def records(self, head: dict, device_blob: torch.Tensor, host_blob: torch.Tensor,
                skip: set = frozenset()) -> list[dict]:
        """A frame's records, one per request that ran, but the requests in `skip`."""
        host = self.host_tensors(unpack(device_blob, self.layout(head, "device")))
        frame = unpack(host_blob, self.layout(head, "host"))
        # n-gram's trees as the host drafted them, and each row's index in them
        if "host_tree" in head:
            host["host_tree"] = join(DraftTree, head["host_tree"], prefixed(frame, "tree."))
            host["index"] = dict(map(tuple, head["index"]))
        out = []
        for b, rid, root, tokens, committed, finish_reason, draw in frame_requests(head, host):
            if rid in skip:
                continue
            if isinstance(draw, dict):
                draw = join(Randoms, draw["randoms"], prefixed(frame, f"draw{b}."))
            # the request as the step left it
            r = Request(rid, [], [root] + committed, finish_reason)
            out.append(self.record(head["step"], b, r, host, tokens, draw, committed,
                                   head["timing"], head["adaptive"], head["max_depth"]))
        return out

    def layout(self, head: dict, pack: str) -> dict:
        """The layout of a frame's pack (device or host), kept from the frame that first used it."""
        self.layouts.update(head.get("layouts", {}))
        return self.layouts[str(head["packs"][pack])]

    def host_tensors(self, host: dict) -> dict:
        """The step's tensors on the host as the records read them."""
        if "target_topk_values" in host:
            host["target_topk"] = as_pairs(host.pop("target_topk_indices").tolist(),
                                           host.pop("target_topk_values").tolist())
            host["p_tokens"] = host["p_tokens"].tolist()
        if "draft_top_values" in host:
            host["draft_topk"] = [as_pairs(ib, vb)
                                  for ib, vb in zip(host.pop("draft_top_indices").tolist(),
                                                    host.pop("draft_top_values").tolist())]
            candidates = [host.pop(k)
                          for k in sorted(k for k in host if k.startswith("candidates"))]
            host["candidates"] = (draft_candidates(*candidates, self.context.topk) if candidates
                                  else None)
        return host

    def draft_tree(self, host: dict, b: int) -> tuple[DraftTree | None, int, int]:
        """The step's trees as core's DraftTree, request b's index in them, and its size."""
        if not self.context.drafted:
            return None, b, 1
        if self.context.drafts_on_host:
            tree, i = host["host_tree"], host["index"][b]
            return tree, i, tree.size(i)
        tree = DraftTree(
            draft_tokens=host["draft_tokens"], tree_mask=host["tree_mask"],
            positions=host["positions"], retrive_index=host["retrive_index"],
            retrive_next_token=host["retrive_next_token"],
            retrive_next_sibling=host["retrive_next_sibling"], q=host["q"], scores=host["scores"],
            draft_topk=host["draft_topk"], candidates=host["candidates"],
            sibling_worth=host["worth"])
        return tree, b, host["draft_tokens"].shape[1]

    def record(self, step: int, b: int, r: Request, host: dict, tokens: list[int], randoms,
               committed: list[int], timing: dict, adaptive: dict | None, max_depth: int) -> dict:
        """Request b's step record (tokens: the step's accept tokens, the bonus last)."""
        context, seq_before = self.context, int(host["seq_lens_before"][b])
        tree, i, size = self.draft_tree(host, b)
        row = StepRow(r, seq_before, None, None, b=i, drafted=size > 1, committed=committed)
        row.target_predict = host["target_predict"][b, :size].tolist()
        if context.reduces_p:
            row.target_topk = host["target_topk"][b][:size]
            row.p_tokens = [r[:size] for r in host["p_tokens"][b][:size]]
        else:
            row.target_probs = host["target_probs"][b, :size]
        # plain decoding, or an n-gram request that drafted nothing: core's plain_result
        if size == 1:
            row.candidates, row.positions = [r.output_ids[-len(committed) - 1]], [seq_before]
            row.result = AcceptResult([], tokens[-1], [0], [], None if context.greedy else
                                      bonus_from("target", 0, row.target_probs[0],
                                                 context.trace_topk))
        else:
            self.walk_explicitly(step, b, row, host, tokens, randoms, max_depth)
        return step_record(step, row, tree, context.acceptance, self.kv_record(b, host, seq_before),
                           timing, context.trace_topk, adaptive)

    def walk_explicitly(self, step: int, b: int, row: StepRow, host: dict, tokens: list[int],
                        randoms, max_depth: int) -> None:
        """The explicit rule's walk over request b's tree, which must reach the kernels' path and
        bonus."""
        size, n = len(row.target_predict), host["draft_tokens"].shape[1]
        draft_probs = host.get("draft_probs")
        if self.probs is not None:  # the walk's inputs, for spectrace rejudge
            self.probs.add(step, row.req.req_pool_idx, host["logits"][b, :size],
                           draft_probs[b] if draft_probs is not None else None,
                           randoms or Randoms())
        row.candidates = host["draft_tokens"][b, :size].tolist()
        row.positions = host["positions"][b, :size].tolist()
        sampled = self.context.samples_drafts
        row.result = self.walk(row.candidates, host["retrive_next_token"][b, :size].tolist(),
                               host["retrive_next_sibling"][b, :size].tolist(), row.target_predict,
                               row.target_probs, draft_probs[b] if sampled else None, randoms,
                               max_depth, self.context.rule_params)
        num = int(host["accept_num"][b])
        kernel_path = (host["accept_index"][b, :num + 1] - b * n).tolist()
        if (kernel_path, tokens[-1]) != (row.result.accept_nodes, row.result.bonus_token):
            raise SpectraceError(
                f"--backend fast: the {self.context.acceptance} kernel walked {kernel_path} with "
                f"bonus {tokens[-1]} where the explicit walk walked {row.result.accept_nodes} "
                f"with bonus {row.result.bonus_token} (request {b}, step {step})")

    def kv_record(self, b: int, host: dict, seq_before: int) -> dict:
        after = int(host["seq_lens"][b])
        start = max(0, after - TAIL)
        if "req_to_token_tail" in host:  # (bs, TAIL): the row's last slots, from `start`
            slots = host["req_to_token_tail"][b, :after - start].tolist()
        else:  # a frame of an earlier version: the whole row
            slots = host["req_to_token"][b, start:after].tolist()
        kv = {"style": "sglang", "target_seq_len": [seq_before, after],
              "req_to_token_tail": {"start": start, "slots": slots}, "events": [],
              "free_slots": None}
        if host.get("draft_seq_lens") is not None:
            d_after, num = int(host["draft_seq_lens"][b]), int(host["accept_num"][b])
            # EXTEND ran over every accepted token
            kv["draft_seq_len"] = [d_after - num - 1, d_after]
        return kv


def frame_requests(head: dict, host: dict) -> list[tuple]:
    """(row, request, root, accept tokens, committed, finish_reason, draw) of each request that ran
    a step, from the frame's head (the rows that ran, those that finished, the draws) and its
    tensors (host: `host_row`, `roots`); a request's row is its id. A frame of an earlier version
    lists them in its head."""
    if "requests" in head:
        return [(b, rid, root, tokens, [int(t) for t in committed], why, draw)
                for b, rid, root, tokens, committed, why, draw in head["requests"]]
    rows, roots = host["host_row"].tolist(), host["roots"].tolist()
    finished, draws, out = ({b: (n, why) for b, n, why in head.get("finished", [])},
                            head.get("draws", {}), [])
    for b in head["ran"]:
        # accept_tokens, the bonus last; accept_num in the last column
        tokens = rows[b][:rows[b][-1] + 1]
        n, why = finished.get(b, (len(tokens), None))
        out.append((b, b, roots[b], tokens, tokens[:n], why, draws.get(str(b))))
    return out


def index_tensors(device: dict, offset: int, f) -> dict:
    """The tensors that name a step frame's requests (host_row, roots), read alone from its blob
    in the open frames file f."""
    out = {}
    for name in ("host_row", "roots"):
        if device.get(name):
            at, size, dtype, shape = device[name]
            f.seek(offset + at)
            data = bytearray(f.read(size))
            if len(data) < size:
                raise ValueError("a frame's blob ends early")
            out[name] = torch.frombuffer(data, dtype=getattr(torch, dtype)).view(shape)
    return out


def prefixed(tensors: dict, prefix: str) -> dict:
    return {k.removeprefix(prefix): t for k, t in tensors.items() if k.startswith(prefix)}


def blob_bytes(layout: dict) -> int:
    """The bytes of a Pack by its layout: where its last tensor ends."""
    return max((at + size for at, size, *_ in filter(None, layout.values())), default=0)


class FrameSteps:
    """A fast run's steps as its frames hold them (TRACE.frames): indexed from the frames' heads
    when the trace opens, each frame's records built when a reader first asks for one of them.
    core/trace_reader.py's StepSource (spectrace/traces.py makes it); skip: the (step, request)
    pairs the trace's own lines hold (a run killed while it built them into the trace)."""

    def __init__(self, trace: Path, skip: set, token_text: Callable[[int], str],
                 run: str | None = None):
        """run: the trace header's run id, which its frames' first head repeats."""
        self.path, self.token_text = frames_path(trace), token_text
        self.steps, self.notice = [], None
        self.skips: list[set] = []  # each frame's requests whose records the trace's lines hold
        self.frames: list[tuple[dict, int, int]] = []  # each step frame: head, blob offset, bytes
        heads = frame_heads(self.path)
        first = next(heads, None)
        if first is None or "context" not in first[0]:
            self.notice = f"{self.path.name} is not a spectrace frames file: its steps are not read"
            return
        if run is not None and first[0].get("run", run) != run:
            self.notice = (f"{self.path.name} holds another run's steps (not this trace's): "
                           "they are not read")
            return
        try:
            self.builder = RecordBuilder(RecordContext(**first[0]["context"]))
            with open(self.path, "rb") as f:
                self.index(heads, skip, f)
        except (*MALFORMED, RuntimeError) as e:  # an edited or foreign sidecar: the steps before it
            self.notice = (f"{self.path.name} stops being readable after {len(self.steps)} "
                           f"steps ({str(e)[:80]})")

    def index(self, heads, skip: set, f) -> None:
        """Each step frame's requests, from its head and the two tensors that name them."""
        sizes = {}  # a layout's key -> its blob's bytes
        for head, offset, size in heads:
            keys = [str(head["packs"][pack]) for pack in ("device", "host")]
            for key, pack in zip(keys, ("device", "host")):
                if key not in sizes:
                    sizes[key] = blob_bytes(self.builder.layout(head, pack))
            if size != sizes[keys[0]] + sizes[keys[1]]:
                raise ValueError("a blob of another size than its layouts")
            step, skipped = int(head["step"]), {r for s, r in skip if s == head["step"]}
            self.skips.append(skipped)
            timing = dict(head["timing"])
            tensors = index_tensors(self.builder.layouts[keys[0]], offset, f)
            for b, rid, root, tokens, committed, why, draw in frame_requests(head, tensors):
                if rid not in skipped:
                    frame = len(self.frames)
                    self.steps.append((step, int(rid), len(tokens), committed, timing, frame))
            self.frames.append((head, offset, size))

    def records(self, frame: int) -> dict[int, dict]:
        """Frame `frame`'s records, by request. A step whose kernel walk differs from the explicit
        walk raises SpectraceError, naming it."""
        head, offset, size = self.frames[frame]
        blob = read_blob(self.path, offset, size)
        device = blob_bytes(self.builder.layout(head, "device"))
        # aligned
        records = self.builder.records(head, blob[:device], blob[device:].clone(),
                                       self.skips[frame])
        return {rec["request"]: rec for rec in records}

    def lines(self, frame: int, tokens: dict[int, str]) -> dict[int, str]:
        """Frame `frame`'s records as trace lines, each with the text of the ids `tokens` lacks."""
        fmt = RecordFormat(lambda t: tokens.get(t) or self.token_text(t), tokens.keys())
        return {r: fmt.line(rec, record_token_ids(rec)).decode("utf-8").rstrip("\n")
                for r, rec in self.records(frame).items()}

    def texts(self, ids: set[int]) -> dict[int, str]:
        return {t: self.token_text(t) for t in ids}

"""Paged KV cache with page size 1, as SGLang lays it out, and both engines' commit styles.

Three pieces, named as in SGLang:
- `token_to_kv` pool: one K and one V tensor per layer, indexed by *slot*;
- `req_to_token[req, pos] -> slot`: which slot holds the KV of position `pos` of request `req`;
- a free-slot allocator.

A forward that adds `n` tokens to a request at positions `[start, start + n)` first calls
`prepare(req, start, n)` (slots for those positions, the forward's `out_cache_loc`), and after
the forward `commit(req, start, n, keep)` says which of the `n` rows stay. The two styles differ
only in what happens to the rows that do not stay:
- "sglang": every prepare takes fresh slots; commit remaps the kept slots into
  `req_to_token[start : start + len(keep)]` (no KV data moves) and frees the rest.
- "vllm": positions own their slots for the life of the request; commit only rolls the computed
  length back (`num_computed_tokens -= num_rejected`); stale KV stays and is overwritten later.
Every operation appends an event (alloc, reuse, write, commit, move, free, rollback) that the
trace records. A tree commit keeps a path, not a prefix: sglang remaps it, vllm copies its KV
down onto the next positions (`move`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spectrace.errors import SpectraceError

COMMIT_STYLES = ("sglang", "vllm")


class OutOfSlots(SpectraceError):
    pass


class TokenToKVPool:
    """K and V for every slot of every layer: (num_layers, num_slots, num_kv_heads, head_dim)."""

    def __init__(self, num_layers, num_slots, num_kv_heads, head_dim, dtype, device):
        shape = (num_layers, num_slots, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer, slots] = k
        self.v[layer, slots] = v

    def move(self, src: list[int], dst: list[int]) -> None:
        """Every layer's K and V of slot src[i] into slot dst[i] (SGLang's move_kv_cache); all
        sources are read before any destination is written."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]


class TokenAllocator:
    """Free list of slots; hands out the lowest free slots first so traces read naturally."""

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.free_slots: list[int] = list(range(num_slots))

    def alloc(self, n: int) -> list[int]:
        if n > len(self.free_slots):
            raise OutOfSlots(f"KV pool exhausted: {n} slots asked, {len(self.free_slots)} free")
        out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return out

    def free(self, slots: list[int]) -> None:
        self.free_slots = sorted(self.free_slots + list(slots))


@dataclass
class KVCache:
    """One model's paged KV: pool, `req_to_token`, allocator, per-request lengths and events."""

    name: str  # "target" or "draft": which pool an event belongs to
    style: str
    pool: TokenToKVPool
    allocator: TokenAllocator
    req_to_token: torch.Tensor  # (max_requests, max_context) int64, -1 where unmapped
    # committed KV length (vLLM: num_computed_tokens)
    seq_lens: list[int] = field(default_factory=list)
    mapped_lens: list[int] = field(default_factory=list)  # vllm style: positions that own a slot
    events: list[dict] = field(default_factory=list)
    pool_class = TokenToKVPool  # not a field: the class whose K/V tensors it keeps
    # whose hot operations read and write this cache: kernels/kv.py's TritonKVCache says "triton"
    backend = "explicit"

    @classmethod
    def create(cls, name, style, num_layers, num_slots, num_kv_heads, head_dim, max_requests,
               max_context, dtype, device):
        if style not in COMMIT_STYLES:
            raise SpectraceError(f"unknown commit style {style!r} (choose from "
                                 f"{', '.join(COMMIT_STYLES)})")
        pool = cls.pool_class(num_layers, num_slots, num_kv_heads, head_dim, dtype, device)
        req_to_token = torch.full((max_requests, max_context), -1, dtype=torch.int64, device=device)
        return cls(name, style, pool, TokenAllocator(num_slots), req_to_token,
                   [0] * max_requests, [0] * max_requests)

    def _event(self, op: str, req: int, **fields) -> None:
        self.events.append({"pool": self.name, "op": op, "req": req, **fields})

    def take_events(self, req: int) -> list[dict]:
        """Remove and return the events of one request (the engine files them per step)."""
        mine = [e for e in self.events if e["req"] == req]
        self.events = [e for e in self.events if e["req"] != req]
        return mine

    def prepare(self, req: int, start: int, n: int) -> torch.Tensor:
        """Slots for positions [start, start+n) of `req`, mapped in `req_to_token`: the forward's
        `out_cache_loc` (n,)."""
        positions = list(range(start, start + n))
        if self.style == "sglang":
            slots = self.allocator.alloc(n)
            self.assign(req, start, slots)
            self._event("alloc", req, positions=positions, slots=slots)
        else:
            # vLLM: a position keeps its slot; only positions never mapped before take new ones
            fresh = max(0, start + n - self.mapped_lens[req])
            if fresh:
                new = self.allocator.alloc(fresh)
                self.assign(req, start + n - fresh, new)
                self.mapped_lens[req] = start + n
                self._event("alloc", req, positions=positions[n - fresh:], slots=new)
            if n - fresh:
                reused = self.req_to_token[req, start:start + n - fresh].tolist()
                self._event("reuse", req, positions=positions[:n - fresh], slots=reused)
        return self.req_to_token[req, start:start + n].clone()

    # The two req_to_token operations; kernels/kv.py replaces them with its Triton twins.
    def assign(self, req: int, start: int, slots: list[int]) -> None:
        """req_to_token[req, start:start+len(slots)] = slots (SGLang's assign_req_to_token_pool)."""
        row = torch.tensor(slots, device=self.req_to_token.device)
        self.req_to_token[req, start:start + len(slots)] = row

    def accepted_slots(self, slots: list[int], keep: list[int]) -> list[int]:
        """The slots of the kept rows, in order (SGLang's fill_accept_out_cache_loc)."""
        return [slots[i] for i in keep]

    def record_write(self, req: int, positions: list[int], slots: torch.Tensor,
                     token_ids: list[int]) -> None:
        """A forward wrote the KV of `token_ids` (at RoPE `positions`) into `slots`."""
        self._event("write", req, positions=list(positions), slots=slots.tolist(),
                    tokens=list(token_ids))

    def commit(self, req: int, start: int, n: int, keep: list[int]) -> None:
        """Keep rows `keep` (indices into the n prepared rows, in order) as positions
        [start, start+len(keep)); the committed length becomes start + len(keep)."""
        slots = self.req_to_token[req, start:start + n].tolist()
        before = self.seq_lens[req]
        after = start + len(keep)
        if self.style == "sglang":
            kept = self.accepted_slots(slots, keep)
            dropped = [s for i, s in enumerate(slots) if i not in set(keep)]
            self.assign(req, start, kept + [-1] * (n - len(keep)))
            if kept:
                self._event("commit", req, positions=list(range(start, after)), slots=kept,
                            seq_len_before=before, seq_len_after=after)
            if dropped:
                self.allocator.free(dropped)
                self._event("free", req, slots=dropped)
        else:
            if keep != list(range(len(keep))):
                # a tree path: move the kept rows' KV down onto positions start.. (SGLang's
                # move_kv_cache, EAGLE's copy); keep is increasing, so no source is overwritten
                src, dst = self.accepted_slots(slots, keep), slots[:len(keep)]
                self.pool.move(src, dst)
                self._event("move", req, from_slots=src, to_slots=dst,
                            positions=list(range(start, after)))
            self._event("rollback", req, num_computed_tokens_before=start + n,
                        num_rejected=n - len(keep), num_computed_tokens_after=after,
                        stale_slots=slots[len(keep):])
        self.seq_lens[req] = after

    def release(self, req: int) -> None:
        """A finished request returns every slot it holds."""
        held = self.mapped_lens[req] if self.style == "vllm" else self.seq_lens[req]
        slots = self.req_to_token[req, :held].tolist()
        self.allocator.free(slots)
        self.req_to_token[req] = -1
        self.seq_lens[req] = self.mapped_lens[req] = 0
        self._event("free", req, slots=slots, finished=True)

    def committed_slots(self, req: int) -> torch.Tensor:
        return self.req_to_token[req, :self.seq_lens[req]]

    def held_slots(self, req: int) -> list[int]:
        held = self.mapped_lens[req] if self.style == "vllm" else self.seq_lens[req]
        return self.req_to_token[req, :held].tolist()

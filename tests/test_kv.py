"""Paged KV bookkeeping under random prepare/commit sequences, for both commit styles."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spectrace.core.kv import KVCache

ops = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 6), st.lists(st.booleans(), min_size=6, max_size=6)),
               max_size=25)


@settings(max_examples=200, deadline=None)
@given(ops=ops, style=st.sampled_from(["sglang", "vllm"]))
def test_slots_are_never_leaked_or_shared(ops, style):
    kv = KVCache.create("target", style, num_layers=1, num_slots=200, num_kv_heads=1, head_dim=2,
                        max_requests=3, max_context=200, dtype=torch.float32, device="cpu")
    for step, (req, n, flags) in enumerate(ops):
        start = kv.seq_lens[req]
        slots = kv.prepare(req, start, n).tolist()
        marks = torch.arange(n, dtype=torch.float32) + 100 * step  # what the forward would write
        kv.pool.k[0, slots, 0, 0] = marks
        keep = [i for i in range(n) if flags[i]]  # a tree path: any rows, in order
        kv.commit(req, start, n, keep)
        assert kv.seq_lens[req] == start + len(keep)
        # the committed positions hold the kept rows' KV, in path order
        committed = kv.req_to_token[req, start:start + len(keep)]
        assert kv.pool.k[0, committed, 0, 0].tolist() == [marks[i].item() for i in keep]
        if style == "sglang":  # by remapping pointers: the KV never moved
            assert committed.tolist() == [slots[i] for i in keep]
        held = [s for r in range(3) for s in kv.held_slots(r)]
        assert len(held) == len(set(held)) and min(held, default=0) >= 0
        assert not set(held) & set(kv.allocator.free_slots)
        assert len(held) + len(kv.allocator.free_slots) == 200
    for r in range(3):
        kv.release(r)
    assert sorted(kv.allocator.free_slots) == list(range(200))


def test_vllm_style_overwrites_stale_slots_in_place():
    kv = KVCache.create("target", "vllm", 1, 16, 1, 2, 1, 16, torch.float32, "cpu")
    first = kv.prepare(0, 0, 5).tolist()
    kv.commit(0, 0, 5, [0, 1])  # 3 rejected: num_computed_tokens 5 -> 2
    assert kv.events[-1]["op"] == "rollback" and kv.events[-1]["num_rejected"] == 3
    again = kv.prepare(0, 2, 4).tolist()  # positions 2..4 reuse their stale slots, 5 is new
    assert again[:3] == first[2:] and again[3] not in first

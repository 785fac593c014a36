"""The KV bookkeeping twins equal the explicit KVCache exactly: the batched SGLang kernels against
loops over the explicit operations, and a TritonKVCache driven side by side with a KVCache
through random prepare/commit/release sequences (req_to_token, free list, events, K/V bits)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kv import ops

from spectrace.core.kv import KVCache
from spectrace.errors import SpectraceError

pytest.importorskip("triton")
kv_kernels = pytest.importorskip("spectrace.kernels.kv")


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_assign_twin_maps_each_request_run(data):
    bs = data.draw(st.integers(1, 8))
    reqs = data.draw(st.lists(st.integers(0, 7), min_size=bs, max_size=bs, unique=True))
    starts = data.draw(st.lists(st.integers(0, 40), min_size=bs, max_size=bs))
    lens = data.draw(st.lists(st.integers(0, 70), min_size=bs, max_size=bs))
    out_cache_loc = torch.randperm(1000)[:sum(lens)]
    want = torch.full((8, 120), -1)
    row = 0
    for req, start, n in zip(reqs, starts, lens):  # KVCache.assign, request by request
        want[req, start:start + n] = out_cache_loc[row:row + n]
        row += n
    got = torch.full((8, 120), -1)
    starts_t = torch.tensor(starts)
    kv_kernels.assign_req_to_token_pool(torch.tensor(reqs), got, starts_t, starts_t + torch.tensor(lens),
                                        out_cache_loc)
    assert torch.equal(got, want)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_fill_accept_out_cache_loc_twin_compacts_the_accepted_rows(data):
    bs, n = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 8))
    out_cache_loc = torch.randperm(500)[:bs * n]
    accept_index = torch.full((bs, n), -1)
    for b in range(bs):  # a path: root first, increasing rows, -1 padded
        rows = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=n - 1))) if n > 1 else []
        accept_index[b, :len(rows) + 1] = torch.tensor([0] + rows) + b * n
    flat = accept_index[accept_index != -1]
    got = torch.full((bs * n,), -7)
    kv_kernels.fill_accept_out_cache_loc(accept_index, out_cache_loc, got)
    assert torch.equal(got[:len(flat)], out_cache_loc[flat]) and (got[len(flat):] == -7).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_move_twin_equals_the_pool_move_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        explicit = KVCache.create("t", "vllm", 3, 40, 2, 5, 1, 40, dtype, "cpu").pool
        twin = kv_kernels.TritonKVCache.create("t", "vllm", 3, 40, 2, 5, 1, 40, dtype, "cpu").pool
        explicit.k.copy_(torch.randn(explicit.k.shape, generator=g))
        explicit.v.copy_(torch.randn(explicit.v.shape, generator=g))
        twin.k.copy_(explicit.k)
        twin.v.copy_(explicit.v)
        slots = torch.randperm(40, generator=g)[:8].tolist()
        keep = sorted(torch.randperm(8, generator=g)[:int(torch.randint(1, 8, (), generator=g))].tolist())
        src, dst = [slots[i] for i in keep], slots[:len(keep)]  # as KVCache.commit moves a tree path
        explicit.move(src, dst)
        twin.move(src, dst)
        assert torch.equal(explicit.k, twin.k) and torch.equal(explicit.v, twin.v)


@settings(max_examples=40, deadline=None)
@given(ops=ops, style=st.sampled_from(["sglang", "vllm"]))
def test_triton_kv_cache_replays_the_explicit_cache_exactly(ops, style):
    caches = [cls.create("target", style, num_layers=2, num_slots=120, num_kv_heads=1, head_dim=2, max_requests=3,
                         max_context=120, dtype=torch.float32, device="cpu")
              for cls in (KVCache, kv_kernels.TritonKVCache)]
    for step, (req, n, flags) in enumerate(ops):
        keep = [i for i in range(n) if flags[i]]
        for kv in caches:
            start = kv.seq_lens[req]
            slots = kv.prepare(req, start, n)
            kv.pool.k[:, slots, 0, 0] = torch.arange(n, dtype=torch.float32) + 100 * step
            kv.commit(req, start, n, keep)
            if step % 7 == 6:
                kv.release(req)
        explicit, twin = caches
        assert torch.equal(explicit.req_to_token, twin.req_to_token)
        assert explicit.allocator.free_slots == twin.allocator.free_slots and explicit.events == twin.events
        assert torch.equal(explicit.pool.k, twin.pool.k)


def test_kv_twins_refuse_bad_tensors_in_one_line():
    with pytest.raises(SpectraceError, match="out_cache_loc must be torch.int32 or torch.int64, not torch.float32"):
        kv_kernels.assign_req_to_token_pool(torch.zeros(1, dtype=torch.int64), torch.zeros(2, 4, dtype=torch.int64),
                                            torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64),
                                            torch.zeros(1))

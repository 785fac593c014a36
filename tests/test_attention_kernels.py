"""The Triton verify attention equals the explicit one (`compat.sglang.extend_attention_fwd`, which
is `core.model.attend` per request) over the paged KV: random pools with permuted slots, GQA,
head dims that are not powers of two, empty prefixes, causal and tree masks. Two structural
checks need no explicit side: a causal mask written out as a custom mask equals the causal path
(SGLang's test), and every node of a tree sees exactly the causal chain of its ancestors (vLLM's
tree-attention test). Interpreted on CPU at small shapes; tests/test_gpu.py compiles them."""
from contextlib import contextmanager

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spectrace.compat import sglang as explicit
from spectrace.errors import SpectraceError

pytest.importorskip("triton")
attention = pytest.importorskip("spectrace.kernels.attention")
kbatch = pytest.importorskip("spectrace.kernels.batch")


def random_tree_mask(n: int, gen: torch.Generator) -> torch.Tensor:
    """(n, n) bool: node j sees itself and its ancestors; node 0 is the root, parents come first."""
    mask = torch.eye(n, dtype=torch.bool)
    for j in range(1, n):
        parent = int(torch.randint(0, j, (), generator=gen))
        mask[j] |= mask[parent]
    return mask


def attention_case(seed, prefix_lens, extend_lens, heads, kv_heads, head_dim, tree=True, dtype=torch.float32,
                   device="cpu"):
    """The extend_attention_fwd arguments for a batch whose prefixes sit in random pool slots and
    whose new tokens carry a tree mask (tree=False: causal, custom_mask None)."""
    gen = torch.Generator().manual_seed(seed)
    N = sum(extend_lens)
    num_slots = sum(prefix_lens) + 7
    slots = torch.randperm(num_slots, generator=gen)[:sum(prefix_lens)]

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)

    masks = []
    for prefix, n in zip(prefix_lens, extend_lens):
        new = random_tree_mask(n, gen) if tree else torch.ones(n, n, dtype=torch.bool).tril()
        masks.append(torch.cat((torch.ones(n, prefix, dtype=torch.bool), new), dim=1).to(device))
    custom_mask, mask_indptr = kbatch.pack_custom_mask(masks)
    cum = torch.tensor([0] + list(extend_lens)).cumsum(0)
    return dict(
        q_extend=randn(N, heads, head_dim), k_extend=randn(N, kv_heads, head_dim),
        v_extend=randn(N, kv_heads, head_dim),
        o_extend=torch.zeros(N, heads, head_dim, dtype=dtype, device=device),
        k_buffer=randn(num_slots, kv_heads, head_dim), v_buffer=randn(num_slots, kv_heads, head_dim),
        qo_indptr=cum.to(device), kv_indptr=torch.tensor([0] + list(prefix_lens)).cumsum(0).to(device),
        kv_indices=slots.to(device), custom_mask=custom_mask if tree else None,
        mask_indptr=mask_indptr if tree else None, max_len_extend=max(extend_lens)), masks


def run(module, case, **overrides):
    args = {**case, **overrides, "o_extend": torch.zeros_like(case["o_extend"])}
    module.extend_attention_fwd(**args)
    return args["o_extend"]


@contextmanager
def programs_take(every_kv_head: bool):
    """The attention kernel's programs take every KV head of a request, or one each."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(attention, "kv_heads_per_program", lambda device, heads: heads if every_kv_head else 1)
        yield


head_shapes = st.sampled_from([(2, 2, 16), (4, 2, 13), (6, 2, 32), (3, 1, 80), (4, 4, 64)])  # heads, kv heads, d


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), shape=head_shapes, tree=st.booleans(),
       lens=st.lists(st.tuples(st.integers(0, 70), st.integers(1, 9)), min_size=1, max_size=3),
       splits=st.sampled_from([1, 3]), together=st.booleans())
def test_extend_attention_twin_equals_the_explicit_attention(seed, shape, tree, lens, splits, together):
    """splits 3: each prefix shared by three programs (some with no key of it) and merged.
    together: a program takes every KV head (the interpreter's form), else one (a GPU's)."""
    case, _ = attention_case(seed, [p for p, _ in lens], [n for _, n in lens], *shape, tree=tree)
    with programs_take(together):
        got = run(attention, case, num_kv_splits=splits)
    torch.testing.assert_close(got, run(explicit, case), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("skip_prefix", [True, False])
def test_causal_written_as_a_custom_mask_equals_the_causal_path(skip_prefix):
    case, masks = attention_case(3, [0, 40, 65], [1, 9, 17], 4, 2, 16, tree=False)
    custom_mask, mask_indptr = kbatch.pack_custom_mask(
        [torch.ones(n, p + n, dtype=torch.bool).tril(p) for p, n in [(0, 1), (40, 9), (65, 17)]])
    as_custom = run(attention, case, custom_mask=custom_mask, mask_indptr=mask_indptr,
                    skip_prefix_custom_mask=skip_prefix)
    torch.testing.assert_close(as_custom, run(attention, case), atol=1e-6, rtol=1e-6)


def test_a_prefix_column_the_mask_hides_is_read_only_without_skip():
    """skip_prefix_custom_mask=False reads the prefix columns: hiding one changes the output."""
    case, masks = attention_case(5, [12], [4], 2, 2, 16)
    masks[0][:, 3] = False
    custom_mask, mask_indptr = kbatch.pack_custom_mask(masks)
    hidden = dict(custom_mask=custom_mask, mask_indptr=mask_indptr, skip_prefix_custom_mask=False)
    torch.testing.assert_close(run(attention, case, **hidden), run(explicit, case, **hidden), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(run(attention, case, **hidden), run(attention, case), atol=1e-3)


def test_each_tree_node_sees_the_causal_chain_of_its_ancestors():
    """vLLM's tree-attention test: node j of a tree gives what the chain root..j gives causally."""
    prefix, n = 33, 11
    case, masks = attention_case(11, [prefix], [n], 6, 2, 32)
    tree_out = run(attention, case)
    for j in range(n):
        chain = masks[0][j, prefix:].nonzero().flatten()  # j's ancestors and j, in order
        chain_case = {**case, "q_extend": case["q_extend"][chain], "k_extend": case["k_extend"][chain],
                      "v_extend": case["v_extend"][chain], "o_extend": case["o_extend"][chain],
                      "qo_indptr": torch.tensor([0, len(chain)]), "custom_mask": None, "mask_indptr": None,
                      "max_len_extend": len(chain)}
        torch.testing.assert_close(tree_out[j], run(attention, chain_case)[-1], atol=1e-5, rtol=1e-5)


def test_logit_cap_and_scale_match_the_explicit_attention():
    case, _ = attention_case(2, [20, 0], [5, 3], 4, 2, 16)
    torch.testing.assert_close(run(attention, case, sm_scale=0.3, logit_cap=2.0),
                               run(explicit, case, sm_scale=0.3, logit_cap=2.0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads,head_dim,splits", [(4, 2, 13, 1), (8, 8, 64, 1), (4, 2, 13, 4),
                                                          (4, 2, 13, None)])
def test_decode_twin_equals_the_explicit_decode_and_one_token_extends(heads, kv_heads, head_dim, splits, monkeypatch):
    """Decode reads the new token's K/V from the pool: the same as extending by one token. splits
    None: the pick a GPU makes at a small batch, 16-key tiles (decode_tile) in 4 splits."""
    if splits is None:
        monkeypatch.setattr(attention, "decode_tile", lambda *a: 16)
        monkeypatch.setattr(attention, "auto_kv_splits", lambda *a: 4)
    case, _ = attention_case(4, [9, 1, 70], [1, 1, 1], heads, kv_heads, head_dim, tree=False)
    k_buffer, v_buffer = case["k_buffer"].clone(), case["v_buffer"].clone()
    new_slots = torch.arange(3) + k_buffer.shape[0]  # the pool grows by the three new tokens' slots
    k_buffer, v_buffer = torch.cat((k_buffer, case["k_extend"])), torch.cat((v_buffer, case["v_extend"]))
    kv_indices = torch.cat([torch.cat((case["kv_indices"][int(a):int(b)], new_slots[i:i + 1]))
                            for i, (a, b) in enumerate(zip(case["kv_indptr"][:-1], case["kv_indptr"][1:]))])
    kv_indptr = case["kv_indptr"] + torch.arange(4)
    outs = []
    for module in (attention, explicit):
        o = torch.zeros_like(case["q_extend"])
        module.decode_attention_fwd(case["q_extend"], k_buffer, v_buffer, o, kv_indptr, kv_indices,
                                    **({"num_kv_splits": splits} if module is attention else {}))
        outs.append(o)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[0], run(attention, case), atol=1e-5, rtol=1e-5)


@settings(max_examples=200, deadline=None)
@example(sms=132, programs=8, keys=1025, bs=1)  # an H100, Llama-3.1-8B's 8 KV heads, bs 1
@given(sms=st.integers(1, 200), programs=st.integers(1, 2048), keys=st.integers(0, 9000), bs=st.integers(1, 64))
def test_a_one_token_forward_takes_shorter_tiles_only_where_splits_of_64_keys_leave_sms_idle(sms, programs, keys,
                                                                                             bs):
    """decode_tile: 64 keys unless the prefix is split and its splits of 64 keys make fewer programs
    than SMs; then 16 or 32 where that makes more splits, each still with at least one whole tile."""
    device = torch.device("cuda")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(attention, "_sms", lambda d: sms)
        tile = attention.decode_tile(device, programs, keys * bs, bs)
        splits = {t: attention.auto_kv_splits(device, programs, keys * bs, bs, t) for t in (16, 32, 64)}
    assert tile in splits
    if splits[64] == 1 or programs * splits[64] >= sms:
        assert tile == 64
    elif tile == 64:  # no shorter tile makes more splits (64 of them already, say)
        assert max(splits.values()) == splits[64]
    else:
        assert splits[tile] > splits[64] and splits[tile] * tile <= keys
    if (sms, programs, keys, bs) == (132, 8, 1025, 1):
        assert (tile, splits[tile]) == (16, 64)


@settings(max_examples=12, deadline=None)
@given(data=st.data(), splits=st.sampled_from([1, 2]), together=st.booleans())
def test_decode_over_req_to_token_rows_and_paths_equals_its_kv_indices(data, splits, together):
    """The fast engine's decode form (row r of request r // R reads its request's committed
    columns, then its path's columns after them, all L of them or its own path_lens) equals, bit
    for bit, the kv_indptr/kv_indices form given the slots those columns hold as one list: the
    keys are cut into tiles and splits the same way, which --deterministic's verify relies on
    (a tree node over prefix + ancestors reads its keys as a one-token decode over them does)."""
    bs, R, L = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4)), data.draw(st.integers(0, 4))
    lens = data.draw(st.lists(st.integers(0, 70), min_size=bs, max_size=bs))
    columns = max(lens) + R * 4
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    req_to_token = torch.randperm(bs * columns, generator=gen).view(bs, columns)
    paths = torch.randint(0, R * 4, (bs, R, L), generator=gen)
    path_lens = torch.randint(0, L + 1, (bs, R), generator=gen) if L and data.draw(st.booleans()) else None
    k_buffer, v_buffer = torch.randn(2, bs * columns, 2, 13, generator=gen)
    q = torch.randn(bs * R, 4, 13, generator=gen)
    prefix_lens = torch.tensor(lens)
    used = torch.full((bs, R), L) if path_lens is None else path_lens
    rows = [torch.cat((req_to_token[b, :lens[b]], req_to_token[b, lens[b] + paths[b, k, :used[b, k]]]))
            for b in range(bs) for k in range(R)]
    kv_indptr = torch.tensor([0] + [len(r) for r in rows]).cumsum(0)
    outs = []
    for form in (dict(kv_indptr=kv_indptr, kv_indices=torch.cat(rows)),
                 dict(req_to_token=req_to_token, prefix_lens=prefix_lens, paths=paths if L else None,
                      path_lens=path_lens)):
        o = torch.zeros_like(q)
        with programs_take(together):
            attention.decode_attention_fwd(q, k_buffer, v_buffer, o, num_kv_splits=splits, **form)
        outs.append(o)
    torch.testing.assert_close(outs[1], outs[0], atol=0, rtol=0, equal_nan=True)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), with_start=st.booleans())
def test_kv_indices_twin_gathers_req_to_token_rows(data, with_start):
    bs = data.draw(st.integers(1, 5))
    req_to_token = torch.randint(0, 1000, (6, 700))
    req_pool_indices = torch.tensor(data.draw(st.lists(st.integers(0, 5), min_size=bs, max_size=bs, unique=True)))
    starts = torch.tensor(data.draw(st.lists(st.integers(0, 50), min_size=bs, max_size=bs)))
    lens = torch.tensor(data.draw(st.lists(st.integers(0, 600), min_size=bs, max_size=bs)))
    kv_indptr = torch.cat((torch.zeros(1, dtype=torch.int64), lens.cumsum(0)))
    kv_indices = torch.full((int(lens.sum()),), -1)
    kbatch.create_kv_indices(req_to_token, req_pool_indices, lens, kv_indptr, starts if with_start else None,
                                kv_indices)
    s = starts if with_start else torch.zeros(bs, dtype=torch.int64)
    want = [req_to_token[r, a:a + n] for r, a, n in zip(req_pool_indices.tolist(), s.tolist(), lens.tolist())]
    assert torch.equal(kv_indices, torch.cat(want))


def test_attention_twins_refuse_bad_tensors_in_one_line():
    case, _ = attention_case(0, [4], [2], 2, 2, 16)
    for name, bad, said in [("k_buffer", case["k_buffer"].double(), "k_buffer must be torch.float32"),
                            ("v_extend", case["v_extend"][:1], "v_extend must have shape (2, 2, 16)"),
                            ("custom_mask", case["custom_mask"].float(), "custom_mask must be torch.bool or")]:
        with pytest.raises(SpectraceError, match=said.replace("(", r"\(").replace(")", r"\)")):
            run(attention, case, **{name: bad})

"""The Triton twins equal the explicit path: integer outputs bit for bit (torch.equal) on the
peers' vectors and on hypothesis-generated trees; sampling twins the same tokens from the same
coins; and the lossless rules keep the target's law through the twins. On CPU the kernels run
under Triton's interpreter (conftest sets TRITON_INTERPRET=1), so shapes stay small here;
tests/test_gpu.py runs the same comparisons compiled, at real sizes."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_compat import outputs, sglang_target_logits, sglang_tree
from test_tree import run_draft_loop

from spectrace.compat import sglang as explicit
from spectrace.core.tree import TreeMaskMode, tree_capacity
from spectrace.errors import SpectraceError

triton = pytest.importorskip("triton")
kernels = pytest.importorskip("spectrace.compat.triton")  # the twins under SGLang's and vLLM's names


@st.composite
def trees(draw, max_n=12):
    """SGLang draft trees as the draft loop makes them: bs <= 3, topk <= 4, depth <= 4, n <= 12."""
    bs, K, S = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    n = draw(st.integers(2, min(tree_capacity(K, S) + 1, max_n)))
    seq_lens = torch.tensor(draw(st.lists(st.integers(0, 9), min_size=bs, max_size=bs)))
    parent_list, top_scores_index, draft_tokens = run_draft_loop(bs, K, S, n, draw(st.integers(0, 2**31)))
    return bs, K, S, n, seq_lens, parent_list, top_scores_index, draft_tokens


def built(module, tree, mode=TreeMaskMode.QLEN_ONLY):
    bs, K, S, n, seq_lens, parent_list, top_scores_index, draft_tokens = tree
    return module.build_tree_kernel_efficient(torch.arange(bs) + 100, parent_list, top_scores_index, draft_tokens,
                                              seq_lens, int(seq_lens.sum()), K, S, n, mode)


@settings(max_examples=25, deadline=None)
@given(tree=trees(), mode=st.sampled_from(list(TreeMaskMode)))
def test_build_tree_twin_equals_the_explicit_build(tree, mode):
    want, got = built(explicit, tree, mode), built(kernels, tree, mode)
    for name, w, g in zip(("tree_mask", "positions", "retrive_index", "retrive_next_token", "retrive_next_sibling",
                           "draft_tokens"), want, got):
        assert w.dtype == g.dtype and torch.equal(w, g), name


def test_build_tree_twin_on_a_deep_wide_tree():
    """topk 8, depth 8, 64 nodes: a large tree (FULL_MASK and QLEN_ONLY)."""
    bs, K, S, n = 1, 8, 8, 64
    parent_list, top_scores_index, draft_tokens = run_draft_loop(bs, K, S, n, 7)
    tree = (bs, K, S, n, torch.tensor([5]), parent_list, top_scores_index, draft_tokens)
    for mode in (TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY):
        assert all(torch.equal(w, g) for w, g in zip(built(explicit, tree, mode), built(kernels, tree, mode)))


def test_greedy_twin_on_the_sgl_kernel_vectors():
    predicts, accept_index, accept_token_num = outputs()
    kernels.verify_tree_greedy(predicts, accept_index, accept_token_num, *sglang_tree(),
                               sglang_target_logits().argmax(-1))
    assert predicts.tolist() == [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18]
    assert accept_index.tolist() == [[0, 3, 4, 5], [6, 10, 11, -1]] and accept_token_num.tolist() == [3, 2]


def walk_inputs(tree, seed: int, vocab: int = 12):
    """The built tree's candidates and lists, and target argmaxes that often agree with a child."""
    bs, K, S, n = tree[:4]
    _, _, retrive_index, next_token, next_sibling, tokens = built(explicit, tree)
    g = torch.Generator().manual_seed(seed)
    candidates = torch.randint(0, vocab, (bs, n), generator=g)
    candidates[:, 0] = tokens.view(bs, n)[:, 0]
    return candidates, retrive_index, next_token, next_sibling, g


@settings(max_examples=25, deadline=None)
@given(tree=trees(), seed=st.integers(0, 2**31))
def test_greedy_twin_equals_the_explicit_walk(tree, seed):
    bs, K, S, n = tree[:4]
    candidates, retrive_index, next_token, next_sibling, g = walk_inputs(tree, seed)
    # targets that often agree with some child, so paths get long
    target = torch.where(torch.rand(bs, n, generator=g) < 0.7, candidates.roll(-1, 1),
                         torch.randint(0, 12, (bs, n), generator=g))
    want, got = [], []
    for module, into in ((explicit, want), (kernels, got)):
        predicts, accept_index, accept_token_num = outputs(bs, S + 1, bs * n)
        module.verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index, next_token,
                                  next_sibling, target)
        into += [predicts, accept_index, accept_token_num]
    assert all(torch.equal(w, g) for w, g in zip(want, got))


# one vocabulary tile, and three (4096-token tiles): the bonus draw's tile sums and its one scanned tile
VOCABS = st.sampled_from([10, 16, 10_000])


def boundary_draw(weights: torch.Tensor, coin: float, token: int) -> bool:
    """Whether `token` is a draw flashinfer's rule could make from weights with coin * total
    within float32 rounding of one of its CDF boundaries: where tiled float32 sums and the explicit
    float64 sum may pick neighbouring tokens."""
    cdf = torch.cumsum(weights.double(), 0)
    edge, total = coin * float(cdf[-1]), float(cdf[-1])
    lo = float(cdf[token - 1]) if token else 0.0
    return abs(edge - lo) < 1e-5 * total or abs(edge - float(cdf[token])) < 1e-5 * total


def assert_same_walk(explicit_out, twin_out, bonus_weights, coins_final) -> int:
    """accept_index and accept_token_num equal; predicts equal but for a bonus (the slot after the
    last accepted row) drawn at a CDF boundary. bonus_weights(b, node) -> the weights it came from.
    Returns how many bonuses differed (each at a boundary)."""
    (p1, a1, k1), (p2, a2, k2) = explicit_out, twin_out
    assert torch.equal(a1, a2) and torch.equal(k1, k2)
    n = p1.shape[0] // a1.shape[0]
    differed = 0
    for b in range(a1.shape[0]):
        last = int(a1[b, k1[b]])
        others = [r for r in range(b * n, (b + 1) * n) if r != last]
        assert torch.equal(p1[others], p2[others])
        if p1[last] != p2[last]:
            assert boundary_draw(bonus_weights(b, last - b * n), float(coins_final[b]), int(p1[last]))
            differed += 1
    return differed


@settings(max_examples=20, deadline=None)
@given(tree=trees(), seed=st.integers(0, 2**31), thresholds=st.sampled_from([(1.0, 1.0), (0.9, 0.5), (0.0, 0.0)]),
       vocab=VOCABS)
def test_target_only_twin_equals_the_explicit_walk(tree, seed, thresholds, vocab):
    """Same coins, same walk: accept_index and accept_token_num exactly, the kernel-written
    draft_probs exactly, and predicts exactly but for a bonus drawn at a CDF boundary."""
    bs, K, S, n = tree[:4]
    candidates, retrive_index, next_token, next_sibling, g = walk_inputs(tree, seed, vocab=min(vocab, 16))
    target_probs = torch.softmax(torch.randn(bs, n, vocab, generator=g) * 2, -1)
    coins, coins_final = torch.rand(bs, n, generator=g), torch.rand(bs, generator=g)
    results = []
    for module in (explicit, kernels):
        predicts, accept_index, accept_token_num = outputs(bs, S + 1, bs * n)
        draft_probs = torch.zeros_like(target_probs)
        module.tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates,
                                                     retrive_index, next_token, next_sibling, coins, coins_final,
                                                     target_probs, draft_probs, *thresholds)
        results.append(((predicts, accept_index, accept_token_num), draft_probs))
    (out1, d1), (out2, d2) = results
    assert torch.equal(d1, d2)  # the rejected siblings' mass, written as the kernel writes it
    full_depth = out1[2] == S
    assert_same_walk(out1, out2, lambda b, node: target_probs[b, node] if full_depth[b] else
                     (target_probs[b, node] - d1[b, node]).clamp(min=0), coins_final)


@settings(max_examples=20, deadline=None)
@given(bs=st.integers(1, 8), n=st.integers(2, 7), seed=st.integers(0, 2**31), nan=st.booleans(), V=VOCABS)
def test_chain_twin_equals_the_explicit_walk(bs, n, seed, nan, V):
    """Chains sampled from q: the same decisions and tokens; a NaN in q counts as 0 in the residual."""
    g = torch.Generator().manual_seed(seed)
    draft_probs = torch.softmax(torch.randn(bs, n - 1, V, generator=g), -1)
    candidates = torch.cat([torch.zeros(bs, 1, dtype=torch.int64),
                            torch.multinomial(draft_probs.view(-1, V), 1, generator=g).view(bs, n - 1)], 1)
    target_probs = torch.softmax(torch.randn(bs, n, V, generator=g), -1)
    if nan:
        draft_probs[0, 0, 3] = float("nan")
    retrive_index = torch.arange(bs * n).view(bs, n)
    coins, coins_final = torch.rand(bs, n, generator=g), torch.rand(bs, generator=g)
    results = []
    for module in (explicit, kernels):
        out = outputs(bs, n, bs * n)
        module.chain_speculative_sampling(*out, candidates, retrive_index, coins, coins_final, target_probs,
                                          draft_probs)
        results.append(out)
    all_accepted = results[0][2] == n - 1
    assert_same_walk(*results, lambda b, row: target_probs[b, row] if all_accepted[b] else
                     (target_probs[b, row] - torch.nan_to_num(draft_probs[b, row])).clamp(min=0), coins_final)


def test_twins_refuse_bad_tensors_in_one_line():
    candidates, retrive_index, next_token, next_sibling = sglang_tree()
    predicts, accept_index, accept_token_num = outputs()
    with pytest.raises(SpectraceError, match="candidates must be torch.int64"):
        kernels.verify_tree_greedy(predicts, accept_index, accept_token_num, candidates.int(), retrive_index,
                                   next_token, next_sibling, sglang_target_logits().argmax(-1))
    with pytest.raises(SpectraceError, match=r"target_probs must have shape \(2, 6, \*\)"):
        kernels.tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates,
                                                      retrive_index, next_token, next_sibling, torch.rand(2, 6),
                                                      torch.rand(2), torch.rand(2, 5, 20), torch.zeros(2, 5, 20))


# ---- vLLM's rejection sampler --------------------------------------------------------------

vllm_kernels = kernels


def test_vllm_twin_on_vllm_greedy_table():
    from test_compat import vllm_logits

    from spectrace.compat.vllm import SamplingMetadata, SpecDecodeMetadata

    for spec_tokens, output_tokens, expected in [
            ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, -1, -1]]),
            ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, -1]]),
            ([[]], [[5]], [[5]]),
            ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]], [[1, 2, 7, -1], [4, 8, -1, -1]])]:
        bonus = torch.tensor([[t[-1]] for t in output_tokens])
        out = vllm_kernels.RejectionSampler()(SpecDecodeMetadata.make_dummy(spec_tokens, "cpu"), None,
                                              vllm_logits(output_tokens), bonus,
                                              SamplingMetadata(None, all_greedy=True, all_random=False))
        assert torch.equal(out, torch.tensor(expected, dtype=torch.int32))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), with_probs=st.booleans(), vocab=st.sampled_from([7, 100]))
def test_vllm_twin_equals_the_explicit_sampler(data, with_probs, vocab):
    """Mixed greedy and random requests, 0 to 5 drafts each, seeded generators, top-k and top-p:
    the same output rows, token for token."""
    from spectrace.compat.vllm import GREEDY_TEMPERATURE, RejectionSampler, SamplingMetadata, SpecDecodeMetadata

    seed = data.draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    num = data.draw(st.lists(st.integers(0, 6), min_size=1, max_size=8))
    B, N = len(num), sum(num)
    # a draft close to the target, its drafts sampled from it: p / q lands near the coins
    draft_logits = torch.randn(N, vocab, generator=g) * 2
    logits = draft_logits + torch.randn(N, vocab, generator=g) * 0.3
    sampled = torch.multinomial(torch.softmax(draft_logits, -1), 1, generator=g).view(-1).tolist() if N else []
    drafts = [sampled[sum(num[:r]):sum(num[:r + 1])] for r in range(B)]
    draft_probs = torch.softmax(draft_logits, -1) if with_probs else None
    temperature = torch.tensor([float(GREEDY_TEMPERATURE) if data.draw(st.booleans()) else data.draw(
        st.sampled_from([0.5, 1.0, 1.5])) for _ in num])
    top_k = torch.tensor([data.draw(st.sampled_from([0, 3])) for _ in num])
    top_p = torch.tensor([data.draw(st.sampled_from([1.0, 0.8])) for _ in num])
    bonus = torch.randint(0, vocab, (B, 1), generator=g)
    outs = []
    for sampler in (RejectionSampler(), vllm_kernels.RejectionSampler()):
        sm = SamplingMetadata(temperature, all_greedy=False, all_random=False, top_k=top_k, top_p=top_p,
                              generators={r: torch.Generator().manual_seed(seed + r) for r in range(B)})
        outs.append(sampler(SpecDecodeMetadata.make_dummy(drafts, "cpu"), draft_probs, logits, bonus, sm))
    assert torch.equal(*outs)


@pytest.mark.parametrize("vocab", [100, 10_000])  # one tile, and two (BLOCK_V 8192)
def test_recovered_tokens_twin_equals_the_explicit_argmax(vocab):
    from spectrace.core.acceptance.vllm import recovered_tokens

    g = torch.Generator().manual_seed(vocab)
    num = [2, 0, 3]
    cu = torch.tensor(num).cumsum(0).to(torch.int32)
    drafts = torch.randint(0, vocab, (sum(num),), generator=g)
    target_probs = torch.softmax(torch.randn(sum(num), vocab, generator=g), -1)
    draft_probs = torch.softmax(torch.randn(sum(num), vocab, generator=g), -1)
    inv_q = 1 / torch.empty(len(num), vocab).exponential_(generator=g)
    for dp in (draft_probs, None):
        got = vllm_kernels.sample_recovered_tokens(max(num), num, cu, drafts, dp, target_probs, inv_q).tolist()
        want, start = [], 0
        for r, n in enumerate(num):
            want += recovered_tokens(target_probs[start:start + n], None if dp is None else dp[start:start + n],
                                     drafts[start:start + n].tolist(), inv_q[r])
            start += n
        assert got == want


def test_expand_twin_equals_the_explicit_expand():
    from spectrace.core.acceptance.vllm import expand_batch_to_tokens

    x, cu = torch.tensor([0.5, -1.0, 2.0, -1.0]), torch.tensor([2, 2, 5, 6], dtype=torch.int32)
    want = expand_batch_to_tokens(x, cu, 6, -1.0, 1.0)
    assert torch.equal(vllm_kernels.expand_batch_to_tokens(x, cu, 6, -1.0, 1.0), want)
    assert want.tolist() == [0.5, 0.5, 2.0, 2.0, 2.0, 1.0]


def test_bench_kernels_prints_a_row_per_twin(capsys):
    """The benchmark's table at toy shapes, interpreted: every twin runs beside its explicit twin."""
    from spectrace.measure.kernels import bench_kernels

    bench_kernels("cpu", batch_sizes=(2,), vocabs=(64,), prefix=16, heads=2, kv_heads=1, head_dim=16, layers=2,
                  hidden=64, intermediate=96)
    out = capsys.readouterr().out
    for name in ("build_tree_kernel_efficient", "verify_tree_greedy", "tree_spec_sampling_target_only",
                 "chain_speculative_sampling", "vllm RejectionSampler greedy", "vllm sample_recovered_tokens",
                 "extend_attention_fwd", "assign_req_to_token_pool", "move_kv_cache", "gemv linear (one row)",
                 "rows_linear (4 rows)", "rows_linear (8 rows)", "eagle3 qkv 192x128", "eagle3 lm_head 64x64"):
        assert name in out


def test_the_bonus_draw_is_the_explicit_one_with_coins_on_the_cdf_boundaries():
    """The twin of sample_from_prob sums in float64, as the explicit function does: coins placed on
    the CDF's boundaries, and a float32 step either side, draw the explicit token, in both tiles of
    a 5,000-token row (summed in float32, a coin within float32 rounding of a boundary drew the next
    token, and a fast run stopped on it)."""
    from spectrace.core.sampling import sample_from_prob as explicit_draw
    from spectrace.kernels.sampling import sample_from_prob

    g = torch.Generator().manual_seed(0)
    V = 5000
    p = torch.softmax(torch.randn(V, generator=g) * 3, -1)
    cdf = torch.cumsum(p.double(), 0) / p.double().sum()
    on = cdf[torch.randint(0, V - 1, (60,), generator=g)].float()
    coins = torch.cat([on, torch.nextafter(on, torch.ones_like(on)), torch.nextafter(on, torch.zeros_like(on))])
    bs = len(coins)
    rows = torch.arange(bs)
    bonus_draw = torch.stack([rows, rows * V, torch.zeros_like(rows), torch.zeros_like(rows)], 1)  # p alone
    predicts = torch.full((bs,), -1)
    sample_from_prob(bonus_draw, p.expand(bs, V).contiguous(), p[None], coins, predicts)
    assert predicts.tolist() == [explicit_draw(p, float(c)) for c in coins]

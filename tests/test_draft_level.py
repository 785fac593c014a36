"""The fused draft loop (kernels/draft_level.py, kernels/tree.py: organize_draft_results) equals
core's: softmax, the top-K children of each kept path (propose_children), select_top_k_tokens at
every level, the candidates organize_draft_results reads, the fast worker's path bookkeeping (each
kept path's scratch columns: its beam's, then its own), and the n-1 nodes a tree keeps.
Interpreted on the CPU; tests/test_gpu.py compiles it."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spectrace.core.drafters.eagle_worker import propose_children
from spectrace.core.tree import organize_draft_results, select_top_k_tokens

pytest.importorskip("triton")
draft_level = pytest.importorskip("spectrace.kernels.draft_level")
tree_kernels = pytest.importorskip("spectrace.kernels.tree")


@settings(max_examples=40, deadline=None)
@given(bs=st.integers(1, 3), K=st.integers(1, 5), level=st.integers(0, 4),
       V=st.one_of(st.integers(16, 700), st.integers(4097, 5000)),  # one chunk a row interpreted, or two
       seed=st.integers(0, 2**16), vocab=st.sampled_from(["target", "masked", "mapped"]), given_probs=st.booleans(),
       traced=st.sampled_from([None, 0, 2]))
def test_a_fused_level_selects_what_core_selects(bs, K, level, V, seed, vocab, given_probs, traced):
    """vocab: the draft's logits over the target's vocabulary; EAGLE-3's over it, -inf outside its
    own (what core's Eagle3Head.compute_logits gives); or over its own only, with the map.
    traced: a recording run's top K + traced of q beside the children (None: not recording)."""
    gen = torch.Generator().manual_seed(seed)
    num_steps, R = level + 2, 1 if level == 0 else K  # R rows of logits a request: the root's, or K paths'
    logits = torch.randn(bs * R, V, generator=gen) * 3
    token_map = None
    if vocab != "target":  # EAGLE-3: a third of the target's tokens are not in the draft's vocabulary
        token_map = torch.randperm(V, generator=gen)[V // 3:].sort().values  # hot_token_id, ascending
        own = logits[:, token_map]
        logits = torch.full_like(logits, float("-inf"))
        logits[:, token_map] = own
    probs = torch.softmax(logits, dim=-1)
    scores = torch.rand(bs, K, generator=gen) if level else None
    paths = torch.randint(0, K * (num_steps - 1), (bs, K, level), generator=gen) if level else None
    hidden = torch.randn(bs * R, 3, generator=gen)
    buffers = draft_level.DraftBuffers.empty(bs, K, num_steps, "cpu")

    src = probs if given_probs else logits
    if vocab == "mapped":  # the columns of the draft's own vocabulary only
        src = src[:, token_map].contiguous()
    trace_top = None if traced is None else (torch.empty(bs * R, K + traced),
                                             torch.empty(bs * R, K + traced, dtype=torch.int64))
    kept, input_ids, new_hidden, new_paths = draft_level.select_level(
        src, scores, paths, hidden, level, num_steps, buffers, probs=given_probs,
        token_map=token_map if vocab == "mapped" else None, trace_top=trace_top)
    if traced is not None:  # the recording's top of q: torch.topk's, as target token ids
        want = torch.topk(probs, K + traced)
        assert torch.equal(trace_top[1], want.indices)
        torch.testing.assert_close(trace_top[0], want.values, rtol=1e-6, atol=1e-7)

    topk_p, topk_index, _ = propose_children(probs, K, None)
    want_ids, want_hidden, want_scores, want_info = select_top_k_tokens(level, topk_p, topk_index, hidden, scores, K)
    start = 0 if level == 0 else K + (level - 1) * K * K  # the level's candidates in the packed rows
    assert torch.equal(buffers.tokens[:, start:start + R * K], want_info[1])
    torch.testing.assert_close(buffers.scores[:, start:start + R * K], want_info[0].flatten(1), rtol=1e-6, atol=1e-7)
    want_parents = want_info[2] if level == 0 else want_info[2][:, -K:]  # level 0: -1, then 0 .. K-1
    assert torch.equal(buffers.parents[:, 1 + level * K - (level == 0):1 + (level + 1) * K], want_parents)
    assert torch.equal(input_ids, want_ids) and torch.equal(new_hidden, want_hidden)
    torch.testing.assert_close(kept, want_scores, rtol=1e-6, atol=1e-7)
    own = (torch.arange(K) * (num_steps - 1) + level).view(1, K, 1).expand(bs, K, 1)
    if level == 0:
        assert torch.equal(new_paths, own)
    else:  # the worker's bookkeeping, explicitly
        beam = want_info[2] // K - (1 + K * (level - 1))
        assert torch.equal(new_paths, torch.cat([torch.gather(paths, 1, beam[..., None].expand(-1, -1, level)), own],
                                                dim=2))


@settings(max_examples=30, deadline=None)
@given(bs=st.integers(1, 3), C=st.integers(1, 80), seed=st.integers(0, 2**16), levels=st.integers(2, 9),
       data=st.data())
def test_fused_organize_keeps_the_nodes_core_keeps_ties_included(bs, C, seed, levels, data):
    n = data.draw(st.integers(2, C + 1))
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, levels, (bs, C), generator=gen).float() / levels  # few values: many ties
    tokens = torch.randint(0, 1000, (bs, C), generator=gen)
    roots = torch.randint(0, 1000, (bs,), generator=gen)
    _, want_index, want_tokens = organize_draft_results([scores], [tokens], [None], n)
    top_scores_index, draft_tokens = tree_kernels.organize_draft_results(scores, tokens, roots, n)
    assert torch.equal(top_scores_index, want_index)
    assert torch.equal(draft_tokens, torch.cat([roots[:, None], want_tokens], dim=1))

"""The fused draft level (kernels/draft_level.py) equals core's: softmax, the top-K children of each
kept path (propose_children), select_top_k_tokens at level i >= 1, and the fast worker's path
bookkeeping (each kept path's scratch columns: its beam's, then its own). Interpreted on the CPU;
tests/test_gpu.py compiles it."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spectrace.core.drafters.eagle_worker import propose_children
from spectrace.core.tree import select_top_k_tokens

pytest.importorskip("triton")
draft_level = pytest.importorskip("spectrace.kernels.draft_level")


@settings(max_examples=25, deadline=None)
@given(bs=st.integers(1, 3), K=st.integers(1, 5), level=st.integers(1, 4), V=st.integers(16, 700),
       seed=st.integers(0, 2**16), masked=st.booleans())
def test_a_fused_level_selects_what_core_selects(bs, K, level, V, seed, masked):
    gen = torch.Generator().manual_seed(seed)
    num_steps = level + 2
    logits = torch.randn(bs * K, V, generator=gen) * 3
    if masked:  # EAGLE-3's logits: -inf outside its draft vocabulary
        logits[:, torch.randperm(V, generator=gen)[:V // 3]] = float("-inf")
    scores = torch.rand(bs, K, generator=gen)
    paths = torch.randint(0, K * (num_steps - 1), (bs, K, level), generator=gen)
    hidden = torch.randn(bs * K, 3, generator=gen)

    (expand, tokens, parents), kept, input_ids, rows, new_paths = draft_level.select_level(
        logits, scores, paths, level, num_steps)

    topk_p, topk_index, _ = propose_children(torch.softmax(logits, dim=-1), K, None)
    want_ids, want_hidden, want_scores, want_info = select_top_k_tokens(level, topk_p, topk_index, hidden, scores, K)
    assert torch.equal(tokens, want_info[1]) and torch.equal(parents, want_info[2])
    assert torch.equal(input_ids, want_ids) and torch.equal(hidden[rows], want_hidden)
    torch.testing.assert_close(expand, want_info[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(kept, want_scores, rtol=1e-6, atol=1e-7)
    beam = want_info[2] // K - (1 + K * (level - 1))  # the worker's bookkeeping, explicitly
    own = (torch.arange(K) * (num_steps - 1) + level).view(1, K, 1).expand(bs, K, 1)
    want_paths = torch.cat([torch.gather(paths, 1, beam[..., None].expand(-1, -1, level)), own], dim=2)
    assert torch.equal(new_paths, want_paths)

"""kernels/top_k.py: the top k of softmax(logits) by one int64 key a candidate, against torch's
softmax and a stable sort (ties to the lower index), interpreted on the CPU; tests/test_gpu.py
runs the recording that uses it compiled."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")
top_k = pytest.importorskip("spectrace.kernels.top_k")


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(0, 5), V=st.integers(1, 5000), k=st.integers(0, 9), levels=st.sampled_from([None, 3]),
       dtype=st.sampled_from([torch.float32, torch.float16]), seed=st.integers(0, 2**16))
def test_the_top_of_softmax_is_torchs_ties_to_the_lower_index(rows, V, k, levels, dtype, seed):
    """levels: logits drawn from that many values, so most picks tie (a stable sort's order)."""
    k = min(k, V)
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randint(0, levels, (rows, V), generator=g).float() if levels
              else torch.randn(rows, V, generator=g) * 4).to(dtype)
    groups = max(rows, 1) if rows % 2 else max(rows // 2, 1)  # two rows a group where they pair up
    at = torch.randint(0, V, (groups, 3), generator=g)
    values, indices, m, s, p_at = top_k.top_k_softmax(logits, k, at if rows else None)
    p = torch.softmax(logits.float(), dim=-1)
    want = torch.sort(p, dim=-1, descending=True, stable=True).indices[:, :k]
    assert torch.equal(indices, want)
    torch.testing.assert_close(values, p.gather(-1, want), rtol=1e-6, atol=1e-7)
    # p at any token from the row's max and sum
    torch.testing.assert_close(torch.exp(logits.float() - m[:, None]) / s[:, None], p, rtol=1e-6, atol=1e-7)
    # and p at each row's group's tokens, in the same kernels
    want_at = p.gather(-1, at.repeat_interleave(rows // groups, 0)) if rows else p[:, :0]
    torch.testing.assert_close(p_at, want_at, rtol=1e-6, atol=1e-7)


def test_a_k_past_the_row_or_rows_that_do_not_group_are_refused():
    with pytest.raises(ValueError, match="top 7 of 6"):
        top_k.top_k_softmax(torch.zeros(2, 6), 7)
    with pytest.raises(ValueError, match="3 rows do not group over 2"):
        top_k.top_k_softmax(torch.zeros(3, 6), 1, torch.zeros(2, 1, dtype=torch.int64))

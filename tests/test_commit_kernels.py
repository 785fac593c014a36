"""kernels/commit.py against plain Python loops over each request: the accept tokens the host
reads, and SGLang's KV remap on a static req_to_token row (every path, every frozen row)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

from spectrace.kernels.commit import accept_tokens, commit_rows  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@st.composite
def verdicts(draw):
    """bs requests of n nodes: each an accepted path (distinct nodes, root first) of accept_num + 1."""
    bs, n = draw(st.integers(1, 4)), draw(st.integers(1, 9))
    W = draw(st.integers(1, n))
    paths, nums = [], []
    for b in range(bs):
        num = draw(st.integers(0, W - 1))
        nodes = [0] + draw(st.permutations(range(1, n)))[:num]
        paths.append([b * n + j for j in nodes] + [-1] * (W - num - 1))
        nums.append(num)
    live = draw(st.lists(st.booleans(), min_size=bs, max_size=bs))
    return bs, n, W, paths, nums, live


@settings(max_examples=25, deadline=None)
@given(verdicts(), st.integers(0, 6), st.integers(0, 2**16))
def test_accept_tokens_are_the_path_drafts_then_the_bonus(v, extra, seed):
    bs, n, W, paths, nums, _ = v
    g = torch.Generator().manual_seed(seed)
    candidates = torch.randint(0, 100, (bs, n), generator=g)
    bonus = torch.randint(100, 200, (bs,), generator=g)
    out = torch.full((bs, W + 1 + extra), 7, dtype=torch.int64)
    dev = {k: t.to(DEVICE) for k, t in dict(out=out, candidates=candidates, bonus=bonus).items()}
    accept_tokens(dev["out"], torch.tensor(paths, device=DEVICE), torch.tensor(nums, device=DEVICE), dev["bonus"],
                  dev["candidates"])
    for b in range(bs):
        want = [int(candidates.flatten()[paths[b][i + 1]]) for i in range(nums[b])] + [int(bonus[b])]
        want += [-1] * (W - len(want)) + [7] * extra + [nums[b]]
        assert dev["out"][b].tolist() == want


@settings(max_examples=25, deadline=None)
@given(verdicts(), st.integers(0, 5), st.integers(0, 2**16))
def test_commit_rows_put_the_accepted_slots_first(v, prefix, seed):
    bs, n, W, paths, nums, live = v
    cols = prefix + n + 2
    req_to_token = torch.randperm(bs * cols, generator=torch.Generator().manual_seed(seed)).view(bs, cols)
    seq_lens = torch.full((bs,), prefix, dtype=torch.int64)
    r2t, lens = req_to_token.to(DEVICE, copy=True), seq_lens.to(DEVICE, copy=True)
    commit_rows(r2t, lens, torch.tensor(paths, device=DEVICE), torch.tensor(nums, device=DEVICE),
                torch.tensor(live, device=DEVICE), n)
    for b in range(bs):
        row = req_to_token[b].tolist()
        if live[b]:
            nodes = [p - b * n for p in paths[b][:nums[b] + 1]]
            order = nodes + [j for j in range(n) if j not in nodes]
            row[prefix:prefix + n] = [row[prefix + j] for j in order]
        assert r2t[b].tolist() == row
        assert int(lens[b]) == prefix + (nums[b] + 1 if live[b] else 0)

"""kernels/commit.py against plain Python loops over each request: the accept tokens the host
reads, SGLang's KV remap on a static req_to_token row (every path, every frozen row), and the
drafter's state after its DRAFT_EXTEND."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

from spectrace.kernels.commit import accept_tokens, commit_draft_state, commit_rows  # noqa: E402

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


@settings(max_examples=25, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=4), st.integers(1, 2100), st.integers(0, 1100),
       st.integers(0, 2**16))
def test_commit_draft_state_moves_only_live_requests(live, V, H, seed):
    bs, g = len(live), torch.Generator().manual_seed(seed)
    old = dict(next_probs=torch.rand(bs, V, generator=g), last_hidden=torch.randn(bs, H, generator=g).bfloat16(),
               seq_lens=torch.randint(0, 50, (bs,), generator=g))
    probs, h_last = torch.rand(bs, V, generator=g), torch.randn(bs, H, generator=g).bfloat16()
    accept_num = torch.randint(0, 6, (bs,), generator=g)
    state = {k: t.to(DEVICE, copy=True) for k, t in old.items()}
    commit_draft_state(state["next_probs"], state["last_hidden"] if H else None, state["seq_lens"], probs.to(DEVICE),
                       h_last.to(DEVICE), accept_num.to(DEVICE), torch.tensor(live, device=DEVICE))
    m = torch.tensor(live)
    assert torch.equal(state["next_probs"].cpu(), torch.where(m[:, None], probs, old["next_probs"]))
    assert torch.equal(state["last_hidden"].cpu(), torch.where(m[:, None], h_last, old["last_hidden"]) if H
                       else old["last_hidden"])
    assert torch.equal(state["seq_lens"].cpu(), old["seq_lens"] + torch.where(m, accept_num + 1, 0))

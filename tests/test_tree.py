"""Draft trees: SGLang's build semantics, checked against an independent reading of the tree."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spectrace.compat.sglang import (TreeMaskMode, build_tree_kernel_efficient, reconstruct_indices_from_tree_mask,
                                     verify_tree_greedy)
from spectrace.core.drafters.eagle_worker import build_draft_tree, draft_forward
from spectrace.core.tree import tree_capacity, tree_mask_rows
from spectrace.measure.kernels import draft_tree_inputs

V = 40


@st.composite
def draft_inputs(draw):
    bs, K, S = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 5))
    n = draw(st.integers(2, tree_capacity(K, S) + 1))
    seed = draw(st.integers(0, 2**31))
    seq_lens = draw(st.lists(st.integers(1, 9), min_size=bs, max_size=bs))
    return bs, K, S, n, seed, seq_lens


def run_draft_loop(bs, K, S, n, seed):
    """SGLang's loop over random draft distributions; returns organize_draft_results' outputs."""
    return draft_tree_inputs(bs, K, S, n, V, torch.Generator().manual_seed(seed))


def expected_parents(parent_list, top_scores_index, K):
    """Independent reading: candidate c of level 0 hangs on the root; a candidate of level i >= 1
    sits in block K + (i-1)K^2 and hangs on the candidate recorded for its beam."""
    out = []
    for b in range(top_scores_index.shape[0]):
        sel = top_scores_index[b].tolist()
        node_of = {c: j + 1 for j, c in enumerate(sel)}
        parents = []
        for c in sel:
            if c < K:
                parents.append(0)
            else:
                beam_row = (c - K) // K + 1  # position of its beam in parent_list's rows
                parents.append(node_of[int(parent_list[b, beam_row])])
        out.append(parents)
    return out


@settings(max_examples=150, deadline=None)
@given(draft_inputs())
def test_built_tree_matches_its_definition(args):
    bs, K, S, n, seed, seq_lens = args
    parent_list, sel, draft_tokens = run_draft_loop(bs, K, S, n, seed)
    seq_lens_t = torch.tensor(seq_lens)
    verified = torch.arange(bs) + 100
    out = {}
    modes = [m for m in TreeMaskMode if m != TreeMaskMode.QLEN_ONLY_BITPACKING or n <= 32]
    for mode in modes:
        out[mode] = build_tree_kernel_efficient(verified, parent_list, sel, draft_tokens, seq_lens_t,
                                                sum(seq_lens), K, S, n, mode)
    mask, positions, ri, rnt, rns, tokens = out[TreeMaskMode.FULL_MASK]
    assert tokens.view(bs, n)[:, 0].tolist() == verified.tolist()
    rows = {m: tree_mask_rows(out[m][0], seq_lens, n, m) for m in modes}
    for b, parents in enumerate(expected_parents(parent_list, sel, K)):
        parent = [-1] + parents
        for j in range(n):
            anc, a = {0, j}, parent[j]
            while a > 0:
                anc.add(a)
                a = parent[a]
            depth = len(anc) - 1
            assert positions[b * n + j] == seq_lens[b] + depth  # position = prefix length + depth
            for m in modes:  # mask row = root, ancestors and self, in every layout
                assert set(torch.nonzero(rows[m][b][j]).flatten().tolist()) == anc
        # the prefix columns of the full mask are all visible
        L, start = seq_lens[b], sum(seq_lens[:b]) * n + b * n * n
        assert mask[start:start + n * (L + n)].view(n, L + n)[:, :L].all()
        # linked lists: every node once; children in increasing index order
        seen, stack = [], [0]
        while stack:
            node = stack.pop()
            seen.append(node)
            child, kids = int(rnt[b, node]), []
            while child != -1:
                kids.append(child)
                child = int(rns[b, child])
            assert kids == sorted(j for j in range(1, n) if parent[j] == node)
            stack.extend(kids)
        assert sorted(seen) == list(range(n))
        assert ri[b].tolist() == [b * n + j for j in range(n)]
    # reconstructing from the QLEN_ONLY mask gives the built indices
    q_mask = out[TreeMaskMode.QLEN_ONLY][0]
    rec = [torch.empty(bs * n, dtype=torch.int64)] + [torch.empty(bs, n, dtype=torch.int64) for _ in range(3)]
    reconstruct_indices_from_tree_mask(q_mask, seq_lens_t, *rec, bs, n)
    for got, want in zip(rec, (positions, ri, rnt, rns)):
        assert torch.equal(got, want)


@settings(max_examples=150, deadline=None)
@given(draft_inputs(), st.integers(0, 2**31))
def test_verify_tree_greedy_follows_the_target_argmax(args, seed):
    bs, K, S, n, tree_seed, seq_lens = args
    parent_list, sel, draft_tokens = run_draft_loop(bs, K, S, n, tree_seed)
    verified = torch.zeros(bs, dtype=torch.int64)
    _, _, ri, rnt, rns, tokens = build_tree_kernel_efficient(
        verified, parent_list, sel, draft_tokens, torch.tensor(seq_lens), sum(seq_lens), K, S, n)
    candidates = tokens.view(bs, n)
    g = torch.Generator().manual_seed(seed)
    # targets that often agree with some child, so paths get long
    target = torch.where(torch.rand(bs, n, generator=g) < 0.7, candidates.roll(-1, 1),
                         torch.randint(0, V, (bs, n), generator=g))
    predicts = torch.full((bs * n,), -1, dtype=torch.int64)
    accept_index = torch.full((bs, S + 1), -1, dtype=torch.int64)
    accept_num = torch.zeros(bs, dtype=torch.int64)
    verify_tree_greedy(predicts, accept_index, accept_num, candidates, ri, rnt, rns, target)
    for b, parents in enumerate(expected_parents(parent_list, sel, K)):
        parent = [-1] + parents
        path, node = [0], 0  # reference walk: lowest-index child whose token is the argmax
        while len(path) <= S:
            kids = [j for j in range(1, n) if parent[j] == node and candidates[b, j] == target[b, node]]
            if not kids:
                break
            node = kids[0]
            path.append(node)
        k = int(accept_num[b])
        assert k == len(path) - 1
        assert accept_index[b, :k + 1].tolist() == [b * n + j for j in path]
        assert (accept_index[b, k + 1:] == -1).all()
        out = predicts[accept_index[b, :k + 1]].tolist()  # accepted drafts, then the bonus
        assert out == [int(candidates[b, j]) for j in path[1:]] + [int(target[b, path[-1]])]


def test_draft_tree_of_topk_1_is_a_chain():
    g = torch.Generator().manual_seed(0)

    def forward(i, input_ids, hidden_states, parents):
        return torch.softmax(torch.randn(len(input_ids), V, generator=g), -1), None

    levels = draft_forward(forward, torch.softmax(torch.randn(2, V, generator=g), -1), None, num_steps=4, topk=1)
    tree = build_draft_tree(levels, torch.tensor([1, 2]), [5, 7], 5, topk=1, trace_topk=5, sampled=None)
    for b in range(2):
        assert tree.parents(b) == [0, 1, 2, 3]
        assert tree.positions[b].tolist() == [[5, 7][b] + d for d in range(5)]
        assert torch.equal(tree.tree_mask[b], torch.ones(5, 5, dtype=torch.bool).tril())


@settings(max_examples=60, deadline=None)
@given(bs=st.integers(1, 3), K=st.integers(2, 5), level=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_a_level_keeps_the_paths_with_the_K_best_path_scores(bs, K, level, seed):
    """EAGLE-2's beam: of the K*K children of the K kept paths, the K whose path score (the
    parent's score times the child's q) is highest, by brute force over every child. Ranking by
    the child's own q instead (a one-line slip in select_top_k_tokens) keeps other paths."""
    from spectrace.core.tree import select_top_k_tokens

    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(bs, K, generator=gen)
    topk_p = torch.rand(bs * K, K, generator=gen).sort(dim=1, descending=True).values  # as a top-K returns them
    topk_index = torch.randperm(V, generator=gen)[:K].repeat(bs * K, 1)
    hidden = torch.randn(bs * K, 3, generator=gen)
    input_ids, new_hidden, kept, (_, _, parents) = select_top_k_tokens(level, topk_p, topk_index, hidden, scores, K)
    for b in range(bs):
        children = sorted(((scores[b, k] * topk_p[b * K + k, c]).item(), k, c) for k in range(K) for c in range(K))
        best = children[::-1][:K]
        torch.testing.assert_close(kept[b], torch.tensor([s for s, _, _ in best]))
        assert input_ids[b * K:(b + 1) * K].tolist() == [topk_index[b * K + k, c].item() for _, k, c in best]
        assert torch.equal(new_hidden[b * K:(b + 1) * K], hidden[[b * K + k for _, k, _ in best]])
        block = K + (level - 1) * K * K  # the level's candidates in SGLang's flat order
        assert parents[b].tolist() == [block + k * K + c for _, k, c in best]

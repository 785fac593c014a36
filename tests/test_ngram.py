"""vLLM's n-gram proposers against brute-force references and the vLLM chapter's worked example
(《第12章 投机解码：以小博大》§12.4.4: context [1,2,3,4,2,3], min_n 2, max_n 3, k 4); n-gram
runs through the engine equal autoregressive decoding."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from conftest import generate

from spectrace.compat.vllm import NgramProposer, _find_subarray_kmp, _kmp_lps_array
from spectrace.core.drafters.ngram import NgramConfig
from spectrace.core.ngram.lookup import propose_first_match, propose_longest_match


def brute_first(ctx, min_n, max_n, k, max_len):
    """v0.8.5: the longest n first; the first occurrence ending before the suffix starts."""
    k = min(k, max_len - len(ctx))
    if k <= 0:
        return None
    L = len(ctx)
    for n in range(max_n, min_n - 1, -1):
        ends = [e for e in range(n, L - n + 1) if ctx[e - n:e] == ctx[L - n:]]
        if ends:
            return n, ends[0], ctx[ends[0]:ends[0] + k]
    return None


def brute_longest(ctx, min_n, max_n, k, max_len):
    """Current vLLM: the longest n (<= max_n) occurring anywhere before the suffix itself (it
    may overlap it); the earliest occurrence."""
    L = len(ctx)
    k = min(k, max_len - L)
    if L < min_n or k <= 0:
        return None
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        ends = [e for e in range(n, L) if ctx[e - n:e] == ctx[L - n:]]
        if ends:
            return n, ends[0], ctx[ends[0]:ends[0] + k]
    return None


def test_the_vllm_chapters_worked_example():
    """[1, 2, 3, 4, 2, 3], min 2, max 3, k 4: [4, 2, 3] never occurred, [2, 3] did; what followed
    it is the proposal, 3 tokens because the context ends."""
    ctx = np.array([1, 2, 3, 4, 2, 3])
    assert NgramProposer(2, 3, 4, 100).propose(ctx).tolist() == [4, 2, 3]
    assert propose_longest_match(ctx.tolist(), 2, 3, 4, 100).tokens == [4, 2, 3]
    assert _find_subarray_kmp(ctx, 3, 4) is None
    assert _find_subarray_kmp(ctx, 2, 4).tolist() == [4, 2, 3]
    assert NgramProposer(2, 3, 4, 6).propose(ctx) is None  # no room left in the model's context
    assert _kmp_lps_array(np.array([1, 2, 1, 2, 1, 3])).tolist() == [0, 0, 1, 2, 3, 0]


contexts = st.lists(st.integers(0, 2), max_size=40)  # three token ids: repeats are common


@settings(max_examples=400, deadline=None)
@given(ctx=contexts, lo=st.integers(1, 4), span=st.integers(0, 3), k=st.integers(1, 6), room=st.integers(-1, 8))
def test_proposers_match_brute_force(ctx, lo, span, k, room):
    hi, max_len = lo + span, len(ctx) + room
    for propose, brute in ((propose_first_match, brute_first), (propose_longest_match, brute_longest)):
        m, want = propose(ctx, lo, hi, k, max_len), brute(ctx, lo, hi, k, max_len)
        assert (m.n, m.start, m.tokens) == want if m else want is None, propose.__name__
        if m:  # the proposal continues an earlier occurrence of the context's last n tokens
            assert ctx[m.start - m.n:m.start] == ctx[len(ctx) - m.n:] and m.start < len(ctx)
            assert m.tokens == ctx[m.start:m.start + len(m.tokens)] and 1 <= len(m.tokens) <= k


@settings(max_examples=200, deadline=None)
@given(ctx=contexts, lo=st.integers(1, 4), span=st.integers(0, 3))
def test_lps_is_the_longest_border(ctx, lo, span):
    lps = _kmp_lps_array(np.array(ctx, dtype=np.int64)).tolist()
    for i in range(len(ctx)):
        s = ctx[:i + 1]
        assert lps[i] == max(b for b in range(i + 1) if s[:b] == s[len(s) - b:])


REPEATING = "    def get_a(self):\n        return self.a\n\n    def get_b(self):\n        return self.b\n\n    def get_"


@pytest.mark.parametrize("match, lo, hi", [("first", 1, 3), ("longest", 2, 4), ("first", 5, 5)])
def test_ngram_runs_equal_autoregressive(target, tokenizer, match, lo, hi):
    from spectrace.zoo.prompts import HELD_OUT_PROMPTS

    ids = [tokenizer.encode(REPEATING), tokenizer.encode(HELD_OUT_PROMPTS[1]), tokenizer.encode("x")]
    ar, _ = generate(target, None, "none", ids, max_new=24)
    ngram, steps = NgramConfig(prompt_lookup_min=lo, prompt_lookup_max=hi, match=match), []
    spec, _ = generate(target, None, "ngram", ids, 4, 24, "sglang", (0,), ngram=ngram, steps=steps)
    assert spec == ar
    # each step drafted what the proposer makes of the context the step had, or nothing
    propose = {"first": propose_first_match, "longest": propose_longest_match}[match]
    context = {i: list(p) + [ar[i][0]] for i, p in enumerate(ids)}
    for s in steps:
        m = propose(context[s["request"]], lo, hi, 4, target.config.max_position_embeddings)
        assert (s["draft"]["tokens"] if s["draft"] else None) == (m.tokens if m else None)
        context[s["request"]] += s["committed_tokens"]
    assert any(s["draft"] for s in steps), "no step drafted: the test no longer exercises n-gram verify"


def test_a_step_without_a_match_is_a_plain_decode(target, tokenizer):
    ids = [tokenizer.encode(REPEATING), tokenizer.encode("x")]
    steps = []
    generate(target, None, "ngram", ids, 4, 8, ngram=NgramConfig(prompt_lookup_min=3, prompt_lookup_max=3),
             steps=steps)
    plain = [s for s in steps if s["draft"] is None]
    drafted = [s for s in steps if s["draft"] is not None]
    assert plain and drafted
    assert all(s["accept"]["rule"] == "none" and s["accept_len"] == 1 for s in plain)
    for s in drafted:  # the trace says which n-gram was copied, and from where
        p = s["draft"]["proposer"]
        assert p["kind"] == "ngram" and len(p["matched"]) == p["n"] == 3
        assert len(s["draft"]["tokens"]) == len(s["verify"]["tokens"]) - 1 <= 4


# ---- SGLang's trie ------------------------------------------------------------------------

def test_trie_insert_counts_and_recency():
    from spectrace.core.ngram.trie import NgramTrie, TrieConfig

    t = NgramTrie(TrieConfig(max_match_window_size=3, branch_length=4))
    t.insert([1, 2, 3, 1, 2, 4])  # suffixes from 0..4, each capped at 4 tokens
    one = t.root.children[1]
    assert one.freq == 2 and one.children[2].freq == 2  # [1,2,3,1] and [1,2,4]
    assert [c.token for c in one.children[2].lru] == [4, 3]  # 4 was touched last
    assert [c.token for c in one.children[2].sorted_children()] == [3, 4]  # equal freq: lower token first
    assert [w for _, w in t.match([9, 1, 2])] == [2, 1]  # [1, 2] and [2]; [9, 1, 2] is not in the trie


def test_trie_bfs_and_prob_trees():
    """Windows of [5, 6, 7, 5, 6, 8, 5, 6, 7] (4 tokens each); context ends in [5, 6]: anchors w 2, 1.
    After [5, 6] the trie holds 7 (twice, most recently) and 8; after [5, 6, 7]: 5; after [5, 6, 8]: 5."""
    from spectrace.core.ngram.trie import NgramTrie, TrieConfig

    def proposal(kind):
        t = NgramTrie(TrieConfig(max_match_window_size=2, branch_length=4, max_bfs_breadth=2, match_type=kind))
        t.insert([5, 6, 7, 5, 6, 8, 5, 6, 7])
        return t.propose([1, 5, 6], 5)

    # BFS: scale 0.5; the 2-token match starts at breadth 1 (the most recent child, 7), then 0.5
    # (still 1): a chain 7, 5, 6; the 1-token match [6] leads to 7, 5, 6 again, merged
    bfs = proposal("BFS")
    assert (bfs.tokens, bfs.parents, bfs.real, bfs.anchors) == ([6, 7, 5, 6, 0], [-1, 0, 1, 2, 0], 4, [2, 1])
    # PROB: 7 (2/3), then 5 under it (2/3), then 8 (1/3), then 5 under 8 (1/3): the budget is spent
    prob = proposal("PROB")
    assert (prob.tokens, prob.parents, prob.real) == ([6, 7, 8, 5, 5], [-1, 0, 0, 1, 2], 5)
    empty = NgramTrie().propose([42], 4)
    assert empty.tokens == [42, 0, 0, 0] and empty.real == 1 and empty.parents == [-1, 0, 0, 0]


@settings(max_examples=200, deadline=None)
@given(windows=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=6),
       ctx=st.lists(st.integers(0, 3), min_size=1, max_size=8), n=st.integers(2, 12),
       kind=st.sampled_from(["BFS", "PROB"]), capacity=st.sampled_from([12, 10_000]))
def test_trie_trees_continue_a_matched_suffix(windows, ctx, n, kind, capacity):
    from spectrace.core.ngram.trie import NgramTrie, TrieConfig

    t = NgramTrie(TrieConfig(max_match_window_size=4, branch_length=6, max_bfs_breadth=3, match_type=kind,
                             capacity=capacity))
    for w in windows:
        t.insert(w)
        assert t.size <= capacity
    p = t.propose(ctx, n)
    assert len(p.tokens) == n and p.tokens[0] == ctx[-1] and p.anchors == sorted(p.anchors, reverse=True)
    assert all(tok == 0 and par == 0 for tok, par in zip(p.tokens[p.real:], p.parents[p.real:]))

    def in_trie(seq):
        node = t.root
        for tok in seq:
            node = node.children.get(tok)
            if node is None:
                return False
        return True

    for row in range(1, p.real):  # every drafted path continues one matched suffix inside the trie
        path, r = [], row
        while r > 0:
            path.insert(0, p.tokens[r])
            r = p.parents[r]
        assert any(in_trie(ctx[len(ctx) - w:] + path) for w in p.anchors)


@pytest.mark.parametrize("kind", ["BFS", "PROB"])
def test_sglang_ngram_runs_equal_autoregressive(target, tokenizer, kind):
    from spectrace.core.ngram.trie import TrieConfig
    from spectrace.zoo.prompts import HELD_OUT_PROMPTS

    ids = [tokenizer.encode(REPEATING), tokenizer.encode(HELD_OUT_PROMPTS[3]), tokenizer.encode("x")]
    ar, _ = generate(target, None, "none", ids, max_new=24)
    spec, metrics = generate(target, None, "ngram", ids, 7, 24, "sglang", (0,), 10, 8,
                             ngram=NgramConfig(style="sglang", trie=TrieConfig(match_type=kind)))
    assert spec == ar
    assert metrics["num_correct_drafts"] > 0, "no draft accepted: the test no longer exercises a tree walk"

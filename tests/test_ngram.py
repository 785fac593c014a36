"""vLLM's n-gram proposers against brute-force references and the seed's worked example; n-gram
runs through the engine equal autoregressive decoding."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import generate

from spectrace.compat.vllm import NgramProposer, _find_subarray_kmp, _kmp_lps_array
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


def test_the_seed_example():
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
    kw = dict(prompt_lookup_min=lo, prompt_lookup_max=hi, ngram_match=match)
    spec, metrics = generate(target, None, "ngram", ids, 4, 24, "sglang", (0,), **kw)
    assert spec == ar
    assert metrics["vllm"]["num_drafts"] > 0  # the repeating prompt gets proposals


def test_a_step_without_a_match_is_a_plain_decode(target, tokenizer):
    from spectrace.core.engine import SpecConfig
    from spectrace.core.runner import build_engine

    ids = [tokenizer.encode(REPEATING), tokenizer.encode("x")]
    spec = SpecConfig(algo="ngram", num_steps=4, max_new_tokens=8, prompt_lookup_min=3, prompt_lookup_max=3)
    engine = build_engine(target, None, spec, ids, (0,))
    steps = []
    observe = engine.metrics.observe_step
    engine.metrics.observe_step = lambda rec: (steps.append(rec), observe(rec))
    engine.generate(ids)
    plain = [s for s in steps if s["draft"] is None]
    drafted = [s for s in steps if s["draft"] is not None]
    assert plain and drafted
    assert all(s["accept"]["rule"] == "none" and s["accept_len"] == 1 for s in plain)
    for s in drafted:  # the trace says which n-gram was copied, and from where
        p = s["draft"]["proposer"]
        assert p["kind"] == "ngram" and len(p["matched"]) == p["n"] == 3
        assert len(s["draft"]["tokens"]) == len(s["verify"]["tokens"]) - 1 <= 4

"""Which acceptance rules keep the target's distribution: chi-square tests against the exact
target distribution on small vocabularies, for one step and for whole two-token continuations.

The synthetic model is a Markov chain over V tokens: the target's distribution after token x is
P[x] (the root's is p0) and the draft's is Q[x]. target_only's tree takes the draft's top 2 at
each node, two levels deep; tree_rejection's is sampled by the engine's draft loop (topk 2, two
levels, 4 of the 6 candidates kept); chains sample two drafts. A two-token continuation is the
first two tokens a run emits: one step when it emits two or more, else a second step rooted at
the first token.
Exact: P(t1, t2) = p0[t1] * P[t1][t2]. Samples: 40,000 per test, enough that a rule biased by
1% in total variation fails (the chi-square's noncentrality is then about 30 for these V).
"""
import math

import pytest
import torch

from spectrace.core.acceptance.rejection import rejection_walk
from spectrace.core.acceptance.target_only import target_only_walk
from spectrace.core.acceptance.tree_rejection import tree_rejection_walk
from spectrace.core.acceptance.typical import typical_walk
from spectrace.core.acceptance.vllm import vllm_accept
from spectrace.core.sampling import sample
from spectrace.core.tree import SampledDrafts, draft_tree

V, N = 4, 40_000


def chi_square(counts: torch.Tensor, probs: torch.Tensor, z: float = 3.09) -> tuple[float, float]:
    """Pearson's statistic (bins with expected count < 5 merged) and its critical value at
    alpha = 0.001 (Wilson-Hilferty)."""
    n = counts.sum()
    exp = probs.double().flatten() * n
    obs = counts.double().flatten()
    small = exp < 5
    if small.any():
        exp = torch.cat([exp[~small], exp[small].sum().view(1)])
        obs = torch.cat([obs[~small], obs[small].sum().view(1)])
        if exp[-1] == 0:  # outcomes the target never produces: any count there is a failure
            assert obs[-1] == 0, f"{int(obs[-1])} samples where the target has no mass"
            exp, obs = exp[:-1], obs[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(exp) - 1
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat, crit


def markov(seed: int):
    g = torch.Generator().manual_seed(seed)
    p0 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    P = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)
    q0 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    Q = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)
    return p0, P, q0, Q


def tree_step(rule, root_p, root_q, P, Q, gen, **kw):
    """One step on a top-2, depth-2 tree: nodes 0 root; 1, 2; 3, 4 under 1; 5, 6 under 2."""
    a = torch.topk(root_q, 2).indices.tolist()
    kids = [torch.topk(Q[x], 2).indices.tolist() for x in a]
    cand = [-1, a[0], a[1], kids[0][0], kids[0][1], kids[1][0], kids[1][1]]
    nt, ns = [1, 3, 5, -1, -1, -1, -1], [-1, 2, -1, 4, -1, 6, -1]
    tp = torch.stack([root_p] + [P[t] for t in cand[1:]])
    if rule == "typical":
        return typical_walk(cand, nt, ns, tp, float(torch.rand((), generator=gen, dtype=torch.float64))).accept_tokens
    coins = torch.rand(7, generator=gen)
    return target_only_walk(cand, nt, ns, tp, coins, float(torch.rand((), generator=gen)), 2, **kw).accept_tokens


def sampled_tree_step(rule, root_p, root_q, P, Q, gen):
    """One step on a tree the draft loop samples: topk 2, two levels, the 4 best of 6 candidates."""
    sampled = SampledDrafts([gen], torch.tensor([[0.5, 0.25]]))  # 4 of 6: root, 1st child and theirs first
    tree = draft_tree(root_q.view(1, V), lambda i, ids, parent_beam: Q[ids], torch.tensor([0]), [5],
                      topk=2, num_steps=2, num_draft_tokens=5, sampled=sampled)
    cand = tree.draft_tokens[0].tolist()
    tp = torch.stack([root_p] + [P[t] for t in cand[1:]])
    return tree_rejection_walk(cand, tree.retrive_next_token[0].tolist(), tree.retrive_next_sibling[0].tolist(),
                               tp, tree.draft_probs[0], gen, 2).accept_tokens


def chain_step(rule, root_p, root_q, P, Q, gen, one_hot=False):
    """One step on a chain of two drafts sampled from the draft (argmax drafts when one_hot)."""
    d1 = int(root_q.argmax()) if one_hot else sample(root_q, gen)
    d2 = int(Q[d1].argmax()) if one_hot else sample(Q[d1], gen)
    cand = [-1, d1, d2]
    tp = torch.stack([root_p, P[d1], P[d2]])
    dp = None if one_hot else torch.stack([root_q, Q[d1]])
    if rule == "rejection":
        coins = torch.rand(2, generator=gen)
        return rejection_walk(cand, tp, dp, coins, float(torch.rand((), generator=gen))).accept_tokens
    return vllm_accept(cand, tp, dp, gen).accept_tokens


STEPS = {"target_only": tree_step, "typical": tree_step, "tree_rejection": sampled_tree_step, "rejection": chain_step, "vllm": chain_step}


def continuations(rule, seed, **kw):
    p0, P, q0, Q = markov(seed)
    step = STEPS[rule]
    gen = torch.Generator().manual_seed(seed + 1)
    first, pairs = torch.zeros(V), torch.zeros(V, V)
    for _ in range(N):
        out = step(rule, p0, q0, P, Q, gen, **kw)
        if len(out) < 2:
            out = out + step(rule, P[out[0]], Q[out[0]], P, Q, gen, **kw)[:1]
        first[out[0]] += 1
        pairs[out[0], out[1]] += 1
    return (p0, P), first, pairs


LOSSLESS = [("target_only", {}), ("tree_rejection", {}), ("rejection", {}), ("vllm", {}),
            ("vllm", {"one_hot": True})]


@pytest.mark.parametrize("rule, kw", LOSSLESS, ids=[f"{r}{'-one_hot' if k else ''}" for r, k in LOSSLESS])
def test_lossless_rules_keep_the_target_distribution(rule, kw):
    (p0, P), first, pairs = continuations(rule, seed=3, **kw)
    stat, crit = chi_square(first, p0)
    assert stat < crit, f"first token: chi2 {stat:.1f} >= {crit:.1f}"
    stat, crit = chi_square(pairs, p0[:, None] * P)
    assert stat < crit, f"two-token continuation: chi2 {stat:.1f} >= {crit:.1f}"


def test_the_test_catches_a_one_percent_bias():
    """The same statistic rejects a sampler whose output is off by 1% in total variation."""
    p0, P, _, _ = markov(3)
    biased = p0.clone()
    biased[p0.argmax()] += 0.01
    biased[p0.argmin()] -= 0.01
    gen = torch.Generator().manual_seed(5)
    counts = torch.bincount(torch.multinomial(biased, N, replacement=True, generator=gen), minlength=V)
    stat, crit = chi_square(counts, p0)
    assert stat > crit


BIASED = [("target_only", {"threshold_single": 0.5, "threshold_acc": 1.0}),
          ("target_only", {"threshold_single": 1.0, "threshold_acc": 0.5}),
          ("typical", {})]  # Medusa's rule keeps plausible drafts without any rejection test


@pytest.mark.parametrize("rule, kw", BIASED, ids=["threshold_single", "threshold_acc", "typical"])
def test_lossy_rules_are_biased(rule, kw, capsys):
    """The same chi-square rejects them, and the test prints how far they are from the target."""
    (p0, P), first, pairs = continuations(rule, seed=3, **kw)
    exact = p0[:, None] * P
    stat, crit = chi_square(pairs, exact)
    tv = 0.5 * float((pairs / pairs.sum() - exact).abs().sum())
    with capsys.disabled():
        print(f"\n{rule} {kw or '(posterior_threshold 0.09, posterior_alpha 0.3)'}: total variation from the target "
              f"over two-token continuations {tv:.3f} (chi2 {stat:.0f}, critical {crit:.0f})")
    assert stat > crit and tv > 0.01


# ---- the peers' entry points ---------------------------------------------------------------

def test_vllm_rejection_sampler_matches_its_documented_cases():
    from spectrace.compat.vllm import GREEDY_TEMPERATURE, RejectionSampler, SamplingMetadata, SpecDecodeMetadata

    # greedy: the output at a mismatch is the target argmax; then placeholders; no drafts -> bonus first
    drafts = [[1, 2, 3], [], [3, 0]]
    meta = SpecDecodeMetadata.make_dummy(drafts, "cpu")
    assert meta.cu_num_draft_tokens.tolist() == [3, 3, 5] and meta.max_spec_len == 3
    logits = torch.full((5, V), -10.0)
    for row, tok in enumerate([1, 0, 3, 3, 0]):  # argmax per draft position
        logits[row, tok] = 10.0
    sm = SamplingMetadata(torch.full((3,), float(GREEDY_TEMPERATURE)), all_greedy=True, all_random=False)
    out = RejectionSampler()(meta, None, logits, torch.tensor([[7], [8], [9]]), sm)
    assert out.tolist() == [[1, 0, -1, -1], [8, -1, -1, -1], [3, 0, 9, -1]]


@pytest.mark.parametrize("with_probs", [True, False])
def test_vllm_rejection_sampler_is_lossless_at_the_first_position(with_probs):
    """vLLM's own statistical setup (two drafts per request, bonus column dropped), judged by chi-square:
    every emitted draft-position token is a sample of the target."""
    from spectrace.compat.vllm import RejectionSampler, SamplingMetadata, SpecDecodeMetadata

    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(V, generator=g), -1)
    target_logits = torch.randn(V, generator=g)
    p = torch.softmax(target_logits, -1)
    B = 20_000
    if with_probs:
        drafts = torch.multinomial(q, 2 * B, replacement=True, generator=g).view(B, 2)
    else:
        drafts = torch.full((B, 2), int(q.argmax()))
    meta = SpecDecodeMetadata.make_dummy(drafts.tolist(), "cpu")
    sm = SamplingMetadata(torch.ones(B), all_greedy=False, all_random=True,
                          generators={i: torch.Generator().manual_seed(i) for i in range(B)})
    out = RejectionSampler()(meta, q.repeat(2 * B, 1) if with_probs else None, target_logits.repeat(2 * B, 1),
                             torch.zeros(B, 1, dtype=torch.long), sm)
    first = torch.bincount(out[:, 0].long(), minlength=V)
    stat, crit = chi_square(first, p)
    assert stat < crit


def test_sglang_target_only_kernel_form_matches_the_walk():
    from spectrace.compat.sglang import tree_speculative_sampling_target_only

    p0, P, q0, Q = markov(1)
    a = torch.topk(q0, 2).indices.tolist()
    cand = torch.tensor([[0, a[0], a[1]]])
    tp = torch.stack([p0, P[a[0]], P[a[1]]]).unsqueeze(0)
    coins = torch.tensor([[0.99, 0.5, 0.5]])  # a high root coin: both children rejected -> residual bonus
    predicts = torch.full((3,), -1, dtype=torch.int32)
    accept_index = torch.full((1, 2), -1, dtype=torch.int32)
    accept_num = torch.zeros(1, dtype=torch.int32)
    draft_probs = torch.zeros_like(tp)
    tree_speculative_sampling_target_only(predicts, accept_index, accept_num, cand, torch.tensor([[0, 1, 2]]),
                                          torch.tensor([[1, -1, -1]]), torch.tensor([[-1, 2, -1]]), coins,
                                          torch.tensor([0.3]), tp, draft_probs)
    tried = p0[a[0]] + p0[a[1]]
    assert tried < 0.99
    assert accept_num.item() == 0 and accept_index.tolist() == [[0, -1]]
    # the rejected siblings' mass was written into draft_probs, so the bonus avoids them
    assert draft_probs[0, 0, a[0]] == p0[a[0]] and int(predicts[0]) not in a


# ---- the embedded model: whole two-token continuations through the engine ------------------

@pytest.mark.parametrize("rule, algo, topk", [("target_only", "eagle", 4), ("tree_rejection", "eagle3", 4),
                                              ("rejection", "mtp", 1), ("vllm", "eagle", 1)])
def test_engine_two_token_continuations_follow_the_target(target, drafters, tokenizer, rule, algo, topk):
    """B requests of one prompt, each with its own generator, 2 new tokens: the first comes from
    prefill, the second from the rule's first verify; their joint law must be the target's,
    p(t1 | prompt) p(t2 | prompt, t1), with temperature 1 and top-k 6 (36 outcomes)."""
    from spectrace.core.batch import ForwardBatch
    from spectrace.core.engine import SpecConfig
    from spectrace.core.runner import build_engine
    from spectrace.core.sampling import SamplingParams, probs_from_logits

    prompt = tokenizer.encode("def parse(self, text):\n    for line in text.split")
    params = SamplingParams(1.0, 6, 1.0)

    def p_next(ids):
        kv = target.new_kv_cache("t", "sglang", len(ids), 1, len(ids))
        return probs_from_logits(target(ForwardBatch.build(kv, [(0, 0, ids)]), kv).logits[-1], params)

    p1 = p_next(prompt)
    exact = torch.zeros(len(p1), len(p1))
    for t in torch.nonzero(p1).flatten().tolist():  # top-k 6: six first tokens are possible
        exact[t] = p1[t] * p_next(prompt + [t])
    B = 2000
    spec = SpecConfig(algo=algo, num_steps=3, topk=topk, num_draft_tokens=6 if topk > 1 else None, max_new_tokens=2,
                      acceptance=rule, temperature=1.0, top_k=6, seed=11)
    reqs, _ = build_engine(target, drafters[algo], spec, [prompt] * B, ()).generate([prompt] * B)
    counts = torch.zeros_like(exact)
    for r in reqs:
        counts[r.output_ids[0], r.output_ids[1]] += 1
    stat, crit = chi_square(counts, exact)
    assert stat < crit, f"chi2 {stat:.1f} >= {crit:.1f}"


def test_vllm_greedy_and_random_requests_share_a_batch():
    """One batch, a greedy request beside a seeded random one: the greedy row follows the argmax
    rule; the random row is what the same request gets alone with the same seed."""
    from spectrace.compat.vllm import GREEDY_TEMPERATURE, RejectionSampler, SamplingMetadata, SpecDecodeMetadata

    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, V, generator=g)
    drafts = [[int(logits[0].argmax()), 0], [1, 2]]
    meta = SpecDecodeMetadata.make_dummy(drafts, "cpu")
    sm = SamplingMetadata(torch.tensor([float(GREEDY_TEMPERATURE), 1.0]), all_greedy=False, all_random=False,
                          generators={1: torch.Generator().manual_seed(9)})
    out = RejectionSampler()(meta, None, logits, torch.tensor([[5], [6]]), sm)
    argmax = logits[:2].argmax(-1).tolist()
    want = [argmax[0], argmax[1]] + ([5] if drafts[0][1] == argmax[1] else [-1])
    assert out[0].tolist() == want
    alone = RejectionSampler()(SpecDecodeMetadata.make_dummy(drafts[1:], "cpu"), None, logits[2:],
                               torch.tensor([[6]]), SamplingMetadata(torch.tensor([1.0]), False, True,
                                                                      generators={0: torch.Generator().manual_seed(9)}))
    assert out[1].tolist() == alone[0].tolist()

"""Which acceptance rules keep the target's distribution: chi-square tests of the rules' own code
against the exact target distribution, on small vocabularies, for one step and for whole
two-token continuations; and through the engine on the embedded models.

The harness (the synthetic Markov model, the rules' walks over its trees and chains, the sample
sizes and the chi-square test) is spectrace/testing.py, which lessons import too.
"""
import pytest
import torch

from spectrace.core.drafters import SampledDrafts
from spectrace.core.drafters.eagle_worker import build_draft_tree, draft_forward
from spectrace.testing import BIAS, ENGINE_BIAS, V, chi_square, continuations, markov, samples_for

LOSSLESS = [("target_only", False), ("tree_rejection", False), ("rejection", False), ("vllm", False), ("vllm", True)]


@pytest.mark.parametrize("rule, one_hot", LOSSLESS, ids=[f"{r}{'-one_hot' if h else ''}" for r, h in LOSSLESS])
def test_lossless_rules_keep_the_target_distribution(rule, one_hot):
    (p0, exact), first, pairs = continuations(rule, seed=3, one_hot=one_hot)
    stat, crit = chi_square(first, p0)
    assert stat < crit, f"first token: chi2 {stat:.1f} >= {crit:.1f}"
    stat, crit = chi_square(pairs, exact)
    assert stat < crit, f"two-token continuation: chi2 {stat:.1f} >= {crit:.1f}"


def test_a_sampled_trees_shape_does_not_depend_on_its_draws():
    """What tree_rejection's losslessness rests on (acceptance/tree_rejection.py), checked
    directly: ranked by sibling worth, every request's sampled tree has the same shape, whatever
    it drew (ranking by the draws' own q once biased the output by about 1.3% in total variation)."""
    g = torch.Generator().manual_seed(0)
    bs, K, S, n, vocab = 300, 3, 3, 8, 40
    q = torch.softmax(torch.randn(bs, vocab, generator=g) * 2, -1)
    sampled = SampledDrafts([g] * bs, torch.tensor([[0.6, 0.3, 0.1]]).expand(bs, K))

    def forward(i, input_ids, hidden_states, parents):
        return torch.softmax(torch.randn(len(input_ids), vocab, generator=g) * 2, -1), None

    tree = build_draft_tree(draft_forward(forward, q, None, S, K, sampled), torch.zeros(bs, dtype=torch.int64),
                            [0] * bs, n, K, 5, sampled)
    assert (tree.retrive_next_token == tree.retrive_next_token[0]).all()
    assert (tree.retrive_next_sibling == tree.retrive_next_sibling[0]).all()
    assert len({tuple(t) for t in tree.draft_tokens.tolist()}) > bs // 2  # while what they drew differs


def test_the_test_catches_the_bias():
    """A sampler whose two-token law moves BIAS from the likeliest continuation to the next
    fails the same test at the same N, in 99 of 100 seeded repetitions or more."""
    p0, P, _, _ = markov(3)
    exact = p0[:, None] * P
    n = samples_for(exact)
    a, b = torch.topk(exact.flatten(), 2).indices.tolist()
    biased = exact.flatten().clone()
    biased[a] -= BIAS
    biased[b] += BIAS
    gen = torch.Generator().manual_seed(5)
    draws = torch.multinomial(biased.expand(100, -1), n, replacement=True, generator=gen)  # 100 repetitions
    caught = sum(chi_square(torch.bincount(row, minlength=V * V), exact)[0] > chi_square(exact * n, exact)[1]
                 for row in draws)
    assert caught >= 97, f"the test caught a {BIAS} bias in {caught} of 100 repetitions of N = {n}"


LOSSY = [("target_only", {"threshold_single": 0.5, "threshold_acc": 1.0}),
         ("target_only", {"threshold_single": 1.0, "threshold_acc": 0.5}),
         ("typical", {})]  # Medusa's rule keeps plausible drafts without any rejection test


@pytest.mark.parametrize("rule, kw", LOSSY, ids=["threshold_single", "threshold_acc", "typical"])
def test_lossy_rules_are_biased(rule, kw, capsys):
    """The same chi-square rejects them, and the test prints how far they are from the target
    (4,000 runs: their biases are many times BIAS)."""
    (p0, exact), first, pairs = continuations(rule, seed=3, n=4000, **kw)
    stat, crit = chi_square(pairs, exact)
    tv = 0.5 * float((pairs / pairs.sum() - exact).abs().sum())
    with capsys.disabled():
        print(f"\n{rule} {kw or '(posterior_threshold 0.09, posterior_alpha 0.3)'}: total variation from the target "
              f"over two-token continuations {tv:.3f} (chi2 {stat:.0f}, critical {crit:.0f})")
    assert stat > crit and tv > 5 * BIAS


def test_sibling_worth_is_the_chance_each_draw_is_the_accepted_one():
    """r_j = accepted / tried per sibling rank (a prior of 1 in 2), a_j = r_j prod_{i<j} (1 - r_i),
    never increasing with j."""
    from spectrace.core.acceptance.tree_rejection import SiblingStats

    stats = SiblingStats(3)
    # root 0 with children 1, 2, 3 in sibling order: draws 1 and 2 rejected, 3 accepted; then 1 accepted
    nt, ns = [1, -1, -1, -1], [-1, 2, 3, -1]
    stats.observe([{"node": 1, "accepted": False}, {"node": 2, "accepted": False}, {"node": 3, "accepted": True}],
                  nt, ns)
    stats.observe([{"node": 1, "accepted": True}], nt, ns)
    r = torch.tensor([2 / 4, 1 / 3, 2 / 3], dtype=torch.float64)  # (1 + accepted) / (2 + tried)
    a = torch.stack([r[0], r[1] * (1 - r[0]), r[2] * (1 - r[0]) * (1 - r[1])])
    torch.testing.assert_close(stats.worth(), torch.cummin(a, 0).values.float())
    assert (stats.worth()[1:] <= stats.worth()[:-1]).all()


# ---- the embedded model: whole two-token continuations through the engine ------------------

def exact_two_token_law(prompt: list[int], top_k: int) -> torch.Tensor:
    """p(t1 | prompt) p(t2 | prompt, t1) at temperature 1 and top-k, from transformers' forward
    of the embedded target and a plain top-k softmax: none of the engine's code."""
    from transformers import AutoModelForCausalLM

    from spectrace.zoo import TARGET_DIR

    hf = AutoModelForCausalLM.from_pretrained(TARGET_DIR, dtype=torch.float32).eval()

    def p_next(ids):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1]
        top = torch.topk(logits, top_k)
        return torch.zeros_like(logits).scatter(0, top.indices, torch.softmax(top.values, -1))

    p1 = p_next(prompt)
    exact = torch.zeros(len(p1), len(p1))
    for t in torch.nonzero(p1).flatten().tolist():
        exact[t] = p1[t] * p_next(prompt + [t])
    return exact


@pytest.mark.parametrize("rule, algo, topk", [("target_only", "eagle", 4), ("tree_rejection", "eagle3", 4),
                                              ("rejection", "mtp", 1), ("vllm", "eagle", 1)])
def test_engine_two_token_continuations_follow_the_target(target, drafters, tokenizer, rule, algo, topk):
    """B requests of one prompt, each with its own generator, 2 new tokens: the first comes from
    prefill, the second from the rule's first verify; their joint law must be the target's,
    with temperature 1 and top-k 6 (36 outcomes). The rules' math is proven above at BIAS; here
    the engine's plumbing (generators, draft sampling, p after top-k), whose errors move far
    more: B catches a bias of ENGINE_BIAS."""
    from spectrace.core.spec import SpecConfig
    from spectrace.run import build_engine

    prompt = tokenizer.encode("    for line in text.split")
    exact = exact_two_token_law(prompt, 6)
    B = samples_for(exact, ENGINE_BIAS)
    spec = SpecConfig(algo=algo, num_steps=3, topk=topk, num_draft_tokens=6 if topk > 1 else None, max_new_tokens=2,
                      acceptance=rule, temperature=1.0, top_k=6, seed=11)
    reqs, _ = build_engine(target, drafters[algo], spec, [prompt] * B, ()).generate([prompt] * B)
    counts = torch.zeros_like(exact)
    for r in reqs:
        counts[r.output_ids[0], r.output_ids[1]] += 1
    stat, crit = chi_square(counts, exact)
    assert stat < crit, f"chi2 {stat:.1f} >= {crit:.1f}"

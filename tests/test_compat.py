"""spectrace.compat against the peers' own test vectors: the inputs and expected outputs of
sgl-kernel's tests/speculative/test_eagle_utils.py (verify_tree_greedy), test_speculative_sampling.py
(tree_speculative_sampling_target_only) and test_ngram_utils.py (reconstruct_indices_from_tree_mask),
SGLang's test/srt/test_build_eagle_tree.py, and vLLM's tests/v1/sample/test_rejection_sampler.py
(the greedy table, seeded determinism), run on CPU tensors; then the samplers' laws by chi-square."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from spectrace.compat.sglang import (build_tree_kernel_efficient, organize_draft_results,
                                     reconstruct_indices_from_tree_mask, tree_speculative_sampling_target_only,
                                     verify_tree_greedy)
from spectrace.compat.vllm import (GREEDY_TEMPERATURE, PLACEHOLDER_TOKEN_ID, RejectionSampler, SamplingMetadata,
                                   SpecDecodeMetadata, calc_spec_decode_metadata)
from spectrace.testing import chi_square

# ---- SGLang ------------------------------------------------------------------------------------

# two requests of 6 nodes (sgl-kernel's test_eagle_utils.py and test_speculative_sampling.py)
CANDIDATES = [[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]]
RETRIVE_INDEX = [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
RETRIVE_NEXT_TOKEN = [[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]]
RETRIVE_NEXT_SIBLING = [[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]]


def sglang_target_logits() -> torch.Tensor:
    """10 at the target's choice, 1 elsewhere; rows without a choice prefer token 18."""
    logits = torch.full((2, 6, 20), 1.0)
    for b, row, tok in [(0, 0, 3), (0, 3, 4), (0, 4, 5), (1, 0, 11), (1, 4, 12)]:
        logits[b, row, tok] = 10
    no_choice = logits.max(-1).values < 10
    logits[..., 18] = torch.where(no_choice, 10.0, logits[..., 18])
    return logits


def sglang_tree():
    return [torch.tensor(t, dtype=torch.int64) for t in (CANDIDATES, RETRIVE_INDEX, RETRIVE_NEXT_TOKEN,
                                                         RETRIVE_NEXT_SIBLING)]


def outputs(bs=2, num_spec_step=4, n=12):
    return (torch.full((n,), -1, dtype=torch.int32), torch.full((bs, num_spec_step), -1, dtype=torch.int32),
            torch.zeros(bs, dtype=torch.int32))


def test_verify_tree_greedy_sgl_kernel_vectors():
    predicts, accept_index, accept_token_num = outputs()
    verify_tree_greedy(predicts, accept_index, accept_token_num, *sglang_tree(), sglang_target_logits().argmax(-1))
    assert predicts.tolist() == [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18]
    assert accept_index.tolist() == [[0, 3, 4, 5], [6, 10, 11, -1]]
    assert accept_token_num.tolist() == [3, 2]


@pytest.mark.parametrize("threshold_single, threshold_acc, want_predicts, want_accept_index, want_num", [
    (1, 1, [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18], [[0, 3, 4, 5], [6, 10, 11, -1]], [3, 2]),
    (0, 0, [1, 2, 18, -1, -1, -1, 11, -1, -1, -1, 12, 18], [[0, 1, 2, -1], [6, 10, 11, -1]], [2, 2]),
])
def test_tree_speculative_sampling_target_only_sgl_kernel_vectors(threshold_single, threshold_acc, want_predicts,
                                                                  want_accept_index, want_num):
    """At temperature 0.01 the target is nearly one-hot, so any coins give these outputs; with
    both thresholds 0 every first child is accepted."""
    target_probs = torch.softmax(sglang_target_logits() / 0.01, dim=-1)
    draft_probs = torch.zeros_like(target_probs)
    gen = torch.Generator().manual_seed(0)
    coins, coins_final = torch.rand(2, 6, generator=gen), torch.rand(2, generator=gen)
    predicts, accept_index, accept_token_num = outputs()
    tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, *sglang_tree(), coins,
                                          coins_final, target_probs, draft_probs, threshold_single, threshold_acc, True)
    assert predicts.tolist() == want_predicts
    assert accept_index.tolist() == want_accept_index
    assert accept_token_num.tolist() == want_num


def test_target_only_writes_rejected_mass_into_draft_probs():
    """A high root coin rejects both children; their target mass is written into draft_probs, as
    the kernel writes it, so the residual bonus avoids them."""
    g = torch.Generator().manual_seed(1)
    p0, p1, p2 = torch.softmax(torch.randn(3, 4, generator=g) * 1.5, -1)
    a = torch.topk(p0, 2).indices.tolist()
    assert p0[a].sum() < 0.99
    predicts, accept_index, accept_num = outputs(1, 2, 3)
    draft_probs = torch.zeros(1, 3, 4)
    tree_speculative_sampling_target_only(predicts, accept_index, accept_num, torch.tensor([[0, a[0], a[1]]]),
                                          torch.tensor([[0, 1, 2]]), torch.tensor([[1, -1, -1]]),
                                          torch.tensor([[-1, 2, -1]]), torch.tensor([[0.99, 0.5, 0.5]]),
                                          torch.tensor([0.3]), torch.stack([p0, p1, p2]).unsqueeze(0), draft_probs)
    assert accept_num.tolist() == [0] and accept_index.tolist() == [[0, -1]]
    assert draft_probs[0, 0, a].tolist() == p0[a].tolist() and int(predicts[0]) not in a


def test_reconstruct_indices_from_tree_mask_sgl_kernel_vector():
    """A 4-node tree: 1 and 2 under the root, 3 under 2."""
    mask = torch.tensor([1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 0, 1, 1], dtype=torch.bool)
    positions = torch.empty(4, dtype=torch.int64)
    ri, rnt, rns = torch.full((3, 1, 4), -1, dtype=torch.int64)
    reconstruct_indices_from_tree_mask(mask, torch.tensor([12]), positions, ri, rnt, rns, 1, 4)
    assert ri.tolist() == [[0, 1, 2, 3]] and rnt.tolist() == [[1, -1, 3, -1]] and rns.tolist() == [[-1, 2, -1, -1]]
    assert positions.tolist() == [12, 13, 13, 14]


def test_build_eagle_tree_sglang_vector():
    """SGLang's test_build_eagle_tree.py: two requests, topk 4, depth 4, 8 draft tokens."""
    score_list = [
        torch.tensor([[[7.1127e-01, 2.8292e-01, 2.2995e-03, 1.7357e-03]],
                      [[9.7476e-01, 2.2219e-02, 6.5031e-04, 1.3212e-04]]]),
        torch.tensor([[[6.9142e-01, 1.2863e-02, 1.6873e-03, 1.1871e-03], [2.4787e-01, 1.8818e-02, 1.4204e-02, 9.2235e-04],
                       [2.2971e-03, 1.6700e-06, 1.8737e-07, 8.3146e-08], [1.2771e-03, 2.4374e-04, 1.7832e-04, 1.1947e-05]],
                      [[8.4832e-02, 6.6068e-02, 5.8304e-02, 5.7851e-02], [2.3616e-03, 1.1243e-03, 5.4368e-04, 2.7768e-04],
                       [2.5286e-04, 1.5578e-04, 2.8817e-05, 1.2888e-05], [1.2834e-04, 2.5417e-06, 1.1279e-06, 1.6088e-08]]]),
        torch.tensor([[[6.6438e-01, 2.6997e-02, 2.4236e-05, 4.0821e-06], [2.4402e-01, 2.8409e-03, 5.0935e-04, 2.9022e-04],
                       [1.6178e-02, 2.0567e-03, 4.5892e-04, 3.0034e-05], [1.3023e-02, 5.0497e-04, 3.6371e-04, 8.7750e-05]],
                      [[2.3263e-02, 2.0054e-02, 9.3990e-03, 2.7783e-03], [6.4156e-02, 5.5506e-04, 1.0429e-04, 9.7211e-05],
                       [4.9950e-02, 5.0630e-03, 9.0068e-04, 3.3656e-04], [7.5817e-03, 8.5731e-04, 6.9972e-04, 6.0793e-04]]]),
        torch.tensor([[[6.6420e-01, 1.0525e-04, 6.5864e-05, 1.2253e-06], [1.3019e-01, 1.0461e-01, 5.2083e-03, 1.6777e-03],
                       [2.0103e-02, 6.7335e-03, 1.2625e-04, 1.0364e-05], [1.5142e-02, 7.0819e-04, 9.6595e-05, 8.7951e-05]],
                      [[5.8608e-02, 1.8840e-03, 7.8535e-04, 4.4400e-04], [1.2185e-02, 2.0684e-03, 1.7418e-03, 1.4327e-03],
                       [6.2455e-03, 6.1487e-03, 2.6862e-03, 1.8034e-03], [1.8590e-03, 1.6151e-03, 1.2481e-03, 3.6038e-04]]]),
    ]
    token_list = [torch.tensor(t) for t in (
        [[29896, 29906, 29900, 29945], [13, 2, 29871, 28956]],
        [[29889, 29974, 29945, 29900, 29974, 29922, 29930, 29958, 29889, 29974, 29930, 29945, 29974, 29922, 29930, 29958],
         [22550, 4136, 16492, 8439, 29871, 2, 3001, 13, 2, 13, 29906, 29946, 2, 13, 29871, 259]],
        [[29946, 29945, 29953, 29906, 29896, 29945, 29900, 29906, 29896, 29945, 29906, 29953, 29896, 29945, 29906, 29946],
         [29871, 2, 29901, 29889, 29871, 2, 395, 259, 29901, 29871, 2, 29889, 3001, 1234, 7146, 2186]],
        [[29946, 29974, 29945, 29930, 29889, 29922, 29974, 29930, 29974, 29946, 29930, 29922, 29889, 29974, 29945, 29922],
         [29941, 29906, 2, 29946, 29871, 450, 319, 14990, 29946, 29941, 2, 29906, 29871, 2, 3001, 13]])]
    parents_list = [torch.tensor(t) for t in (
        [[-1, 0, 1, 2, 3], [-1, 0, 1, 2, 3]], [[4, 8, 9, 10], [4, 5, 6, 7]], [[20, 24, 21, 28], [24, 28, 20, 21]],
        [[36, 40, 41, 44], [36, 40, 44, 45]])]
    seq_lens = torch.tensor([5, 10])
    parent_list, top_scores_index, draft_tokens = organize_draft_results(score_list, token_list, parents_list, 8)
    _, positions, ri, rnt, rns, draft_tokens = build_tree_kernel_efficient(
        torch.tensor([29974, 13], dtype=torch.int32), parent_list, top_scores_index, draft_tokens, seq_lens,
        int(seq_lens.sum()), 4, 4, 8)
    assert positions.tolist() == [5, 6, 6, 7, 7, 8, 8, 9, 10, 11, 12, 12, 12, 12, 13, 14]
    assert ri.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]]
    assert rnt.tolist() == [[1, 3, 4, 5, 6, 7, -1, -1], [1, 2, -1, 6, -1, -1, 7, -1]]
    assert rns.tolist() == [[-1, 2, -1, -1, -1, -1, -1, -1], [-1, -1, 3, 4, 5, -1, -1, -1]]
    assert draft_tokens.tolist() == [29974, 29896, 29906, 29889, 29974, 29946, 29896, 29946,
                                     13, 13, 22550, 4136, 16492, 8439, 29871, 29941]


# ---- vLLM --------------------------------------------------------------------------------------

def vllm_logits(output_tokens: list[list[int]], vocab: int = 100) -> torch.Tensor:
    """vLLM's create_logits_tensor: +100 at each wanted token, -100 elsewhere, one row per draft."""
    rows = [t for tokens in output_tokens for t in tokens[:-1]]
    logits = torch.full((len(rows), vocab), -100.0)
    logits[torch.arange(len(rows)), rows] = 100.0
    return logits


@pytest.mark.parametrize("spec_tokens, output_tokens, expected", [
    ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),  # perfect match
    ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, -1, -1]]),  # early mismatch
    ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, -1]]),  # multiple sequences
    ([[1]], [[1, 2]], [[1, 2]]),  # single token
    ([[]], [[5]], [[5]]),  # empty sequence: just the bonus
    ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]], [[1, 2, 7, -1], [4, 8, -1, -1]]),  # multiple mismatches
    ([[1, 2]], [[1, 2, 3]], [[1, 2, 3]]),
    ([[1]], [[2, 3]], [[2, -1]]),
    ([[1, 2], [3, 4]], [[1, 5, 6], [3, 4, 7]], [[1, 5, -1], [3, 4, 7]]),
])
def test_rejection_sampler_vllm_greedy_table(spec_tokens, output_tokens, expected):
    """vLLM's greedy cases: the output at a mismatch is the target's argmax, then placeholders;
    all accepted, the bonus. As in vLLM's tests, temperature is None when all are greedy."""
    logits = vllm_logits(output_tokens)
    bonus = torch.tensor([[tokens[-1]] for tokens in output_tokens])
    sm = SamplingMetadata(temperature=None, all_greedy=True, all_random=False)
    out = RejectionSampler()(SpecDecodeMetadata.make_dummy(spec_tokens, "cpu"), None, logits, bonus, sm)
    assert torch.equal(out, torch.tensor(expected, dtype=torch.int32))
    assert PLACEHOLDER_TOKEN_ID == -1


@pytest.mark.parametrize("k, batch_size", [(1, 4), (3, 8)])
def test_rejection_sampler_seeded_rows_repeat(k, batch_size):
    """vLLM's test_deterministic_when_seeded: rows with a generator repeat bit for bit."""
    g = torch.Generator().manual_seed(0)
    vocab = 1000
    draft_probs = torch.softmax(torch.rand(batch_size * k, vocab, generator=g), -1)
    target_logits = torch.rand(batch_size * k, vocab, generator=g)
    drafts = torch.randint(0, vocab, (batch_size, k), generator=g).tolist()
    bonus = torch.randint(0, vocab, (batch_size, 1), generator=g)
    seeded = [i for i in range(batch_size) if i % 2 == 0]
    runs = []
    for _ in range(3):
        sm = SamplingMetadata(torch.ones(batch_size), all_greedy=False, all_random=True,
                              generators={i: torch.Generator().manual_seed(i) for i in seeded})
        runs.append(RejectionSampler()(SpecDecodeMetadata.make_dummy(drafts, "cpu"), draft_probs, target_logits,
                                       bonus, sm))
    for i in seeded:
        assert torch.equal(runs[0][i], runs[1][i]) and torch.equal(runs[0][i], runs[2][i])


def test_vllm_greedy_and_random_requests_share_a_batch():
    """One batch, a greedy request beside a seeded random one: the greedy row follows the argmax
    rule; the random row is what the same request gets alone with the same seed."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 4, generator=g)
    drafts = [[int(logits[0].argmax()), 0], [1, 2]]
    sm = SamplingMetadata(torch.tensor([float(GREEDY_TEMPERATURE), 1.0]), all_greedy=False, all_random=False,
                          generators={1: torch.Generator().manual_seed(9)})
    out = RejectionSampler()(SpecDecodeMetadata.make_dummy(drafts, "cpu"), None, logits, torch.tensor([[5], [6]]), sm)
    argmax = logits[:2].argmax(-1).tolist()
    assert out[0].tolist() == [argmax[0], argmax[1]] + ([5] if drafts[0][1] == argmax[1] else [-1])
    alone = RejectionSampler()(SpecDecodeMetadata.make_dummy(drafts[1:], "cpu"), None, logits[2:],
                               torch.tensor([[6]]), SamplingMetadata(torch.tensor([1.0]), False, True,
                                                                      generators={0: torch.Generator().manual_seed(9)}))
    assert out[1].tolist() == alone[0].tolist()


@pytest.mark.parametrize("with_probs", [True, False])
def test_rejection_sampler_is_lossless_at_the_first_position(with_probs):
    """vLLM's own statistical setup (two drafts per request, bonus column dropped), judged by
    chi-square: every emitted first-position token is a sample of the target."""
    from spectrace.testing import samples_for

    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(4, generator=g), -1)
    target_logits = torch.randn(4, generator=g)
    p = torch.softmax(target_logits, -1)
    B = samples_for(p)
    drafts = torch.multinomial(q, 2 * B, replacement=True, generator=g).view(B, 2) if with_probs else \
        torch.full((B, 2), int(q.argmax()))
    sm = SamplingMetadata(torch.ones(B), all_greedy=False, all_random=True, generators={i: g for i in range(B)})
    out = RejectionSampler()(SpecDecodeMetadata.make_dummy(drafts.tolist(), "cpu"), q.repeat(2 * B, 1) if with_probs
                             else None, target_logits.repeat(2 * B, 1), torch.zeros(B, 1, dtype=torch.long), sm)
    stat, crit = chi_square(torch.bincount(out[:, 0].long(), minlength=4), p)
    assert stat < crit


def test_calc_spec_decode_metadata_on_vllms_example():
    """gpu_model_runner's `_calc_spec_decode_metadata` example (reference/vllm.md §1.2)."""
    input_ids = torch.arange(1000, 1209)
    m = calc_spec_decode_metadata([3, 0, 2, 0, 1], [4, 104, 107, 207, 209], input_ids)
    assert m.logits_indices.tolist() == [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
    assert m.bonus_logits_indices.tolist() == [3, 4, 7, 8, 10]
    assert m.target_logits_indices.tolist() == [0, 1, 2, 5, 6, 9]
    assert m.draft_token_ids.tolist() == (1000 + torch.tensor([1, 2, 3, 105, 106, 208])).tolist()
    assert m.cu_num_draft_tokens.tolist() == [3, 3, 5, 5, 6] and m.max_spec_len == 3


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 20)), min_size=1, max_size=6))
def test_calc_spec_decode_metadata_finds_each_requests_drafts_and_judges(reqs):
    """Request i schedules a prefix of p_i tokens, then its last token and its d_i drafts: the
    logits rows are its last d_i + 1 scheduled tokens, its bonus row the last, and draft j is
    judged by the row just before it."""
    num_draft = [d for d, _ in reqs]
    sched = [d + 1 + p for d, p in reqs]
    cu = torch.tensor(sched).cumsum(0)
    input_ids = torch.randperm(int(cu[-1]))  # distinct ids: a row is known by its token
    m = calc_spec_decode_metadata(num_draft, cu.numpy(), input_ids)
    want_rows = [r for i, d in enumerate(num_draft) for r in range(int(cu[i]) - d - 1, int(cu[i]))]
    assert m.logits_indices.tolist() == want_rows
    assert m.logits_indices[m.bonus_logits_indices.long()].tolist() == (cu - 1).tolist()
    drafts = [int(input_ids[r]) for i, d in enumerate(num_draft) for r in range(int(cu[i]) - d, int(cu[i]))]
    assert m.draft_token_ids.tolist() == drafts
    judges = m.logits_indices[m.target_logits_indices.long()]  # the row before each draft
    assert (input_ids[judges + 1] == m.draft_token_ids.long()).all()

"""The explicit path on a GPU: the same numbers as on the CPU in fp32, and bf16 close to
transformers' bf16. Runs where torch sees a GPU (the project's H200 machine); CI has none."""
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_backend import CASES as BACKEND_CASES
from test_fast_engine import CASE_IDS as FAST_IDS
from test_fast_engine import CASES as FAST_CASES
from test_fast_engine import assert_same_steps, quick_tiers, run_both  # noqa: F401  (a fixture)
from test_tree import run_draft_loop  # at import: hypothesis refuses @given tests defined inside one
from transformers import AutoModelForCausalLM

from spectrace.core.batch import ForwardBatch
from spectrace.core.spec import SpecConfig
from spectrace.core.drafters.ngram import NgramConfig
from spectrace.core.model import load_model
from spectrace.core.tree import tree_capacity
from spectrace.run import build_engine, load_tokenizer
from spectrace.zoo import DRAFT_DIR, TARGET_DIR
from spectrace.zoo.prompts import HELD_OUT_PROMPTS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _logits(model, ids, device):
    kv = model.new_kv_cache("target", "sglang", len(ids), 1, len(ids))
    return model(ForwardBatch.build(kv, [(0, 0, ids)]), kv).logits


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 0.1)])
def test_gpu_forward_matches_transformers(tokenizer, dtype, tol):
    ids = tokenizer.encode(HELD_OUT_PROMPTS[7])
    ours = _logits(load_model(TARGET_DIR, dtype, "cuda"), ids, "cuda")
    hf = AutoModelForCausalLM.from_pretrained(TARGET_DIR, dtype=dtype).to("cuda").eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids], device="cuda")).logits[0].float()
    err = ((ours - ref).norm() / ref.norm()).item()
    print(f"{dtype}: relative logit error vs transformers {err:.2e}")
    assert err < tol
    if dtype == torch.float32:  # and the GPU agrees with the CPU
        cpu = _logits(load_model(TARGET_DIR, dtype, "cpu"), ids, "cpu")
        torch.testing.assert_close(ours.cpu(), cpu, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("style", ["sglang", "vllm"])
def test_gpu_fp32_speculative_equals_autoregressive(tokenizer, style):
    target = load_model(TARGET_DIR, torch.float32, "cuda")
    draft = load_model(DRAFT_DIR, torch.float32, "cuda")
    ids = [tokenizer.encode(p) for p in HELD_OUT_PROMPTS]
    out = {}
    for algo in ("none", "standalone"):
        spec = SpecConfig(algo=algo, num_steps=4, max_new_tokens=48, commit_style=style)
        reqs, _ = build_engine(target, draft if algo != "none" else None, spec, ids, (0,)).generate(ids)
        out[algo] = [r.output_ids for r in reqs]
    assert out["none"] == out["standalone"]


@pytest.mark.parametrize("algo", ["standalone", "eagle", "eagle3", "mtp", "frozen_kv_mtp"])
def test_gpu_fp32_trees_equal_autoregressive(tokenizer, algo):
    """Every drafter at SGLang's Llama tree (5, 4, 8), batch 8, fp32 on the GPU."""
    from spectrace.loading.models import load_drafter_model
    from spectrace.run import RunConfig

    target = load_model(TARGET_DIR, torch.float32, "cuda")
    draft = load_drafter_model(algo, RunConfig(algo=algo).draft_path, target, load_tokenizer(TARGET_DIR),
                               torch.float32, "cuda")
    ids = [tokenizer.encode(p) for p in HELD_OUT_PROMPTS]
    out = {}
    for a in ("none", algo):
        spec = SpecConfig(algo=a, num_steps=5, topk=4, num_draft_tokens=8, max_new_tokens=48)
        reqs, metrics = build_engine(target, draft if a != "none" else None, spec, ids, (0,)).generate(ids)
        out[a] = [r.output_ids for r in reqs]
    print(f"{algo}: accept length {metrics['accept_length']:.3f} on the GPU")
    assert out["none"] == out[algo]


@pytest.mark.parametrize("algo, kw, ngram", [
    ("medusa", {"num_steps": 3, "topk": 9, "num_draft_tokens": 25}, None),  # the default tree: 24 paths
    ("ngram", {"num_steps": 5}, NgramConfig(prompt_lookup_min=2, prompt_lookup_max=4)),
    ("eagle", {"num_steps": 3, "adaptive": True}, None),
    ("ngram", {"num_steps": 11, "topk": 10, "num_draft_tokens": 12}, NgramConfig(style="sglang")),
    ("dflash", {"num_steps": 7, "topk": 1, "num_draft_tokens": 8}, None),
])
def test_gpu_fp32_other_drafters_equal_autoregressive(tokenizer, algo, kw, ngram):
    """Medusa's static tree, n-gram chains and trie trees, adaptive EAGLE chains and DFLASH blocks,
    batch 8, fp32 on the GPU."""
    from spectrace.loading.models import load_drafter_model
    from spectrace.run import RunConfig

    target = load_model(TARGET_DIR, torch.float32, "cuda")
    draft = None if algo == "ngram" else load_drafter_model(algo, RunConfig(algo=algo).draft_path, target,
                                                            load_tokenizer(TARGET_DIR), torch.float32, "cuda")
    ids = [tokenizer.encode(p) for p in HELD_OUT_PROMPTS]
    none, _ = build_engine(target, None, SpecConfig(algo="none", max_new_tokens=48), ids, (0,)).generate(ids)
    spec = SpecConfig(algo=algo, max_new_tokens=48, **kw)
    reqs, metrics = build_engine(target, draft, spec, ids, (0,), ngram=ngram).generate(ids)
    print(f"{algo}: accept length {metrics['accept_length']:.3f} on the GPU")
    assert [r.output_ids for r in reqs] == [r.output_ids for r in none]


def test_gpu_sampled_trees_repeat_and_keep_the_invariants(tokenizer):
    """tree_rejection at T 1 on the GPU: the seeded run repeats bit for bit."""
    from spectrace.loading.models import load_drafter_model
    from spectrace.run import RunConfig

    target = load_model(TARGET_DIR, torch.float32, "cuda")
    draft = load_drafter_model("eagle", RunConfig(algo="eagle").draft_path, target, load_tokenizer(TARGET_DIR),
                               torch.float32, "cuda")
    ids = [tokenizer.encode(p) for p in HELD_OUT_PROMPTS]
    spec = SpecConfig(algo="eagle", num_steps=5, topk=4, num_draft_tokens=8, max_new_tokens=32,
                      acceptance="tree_rejection", temperature=1.0, seed=3)
    runs = [build_engine(target, draft, spec, ids, (0,)).generate(ids) for _ in range(2)]
    assert [r.output_ids for r in runs[0][0]] == [r.output_ids for r in runs[1][0]]
    print(f"tree_rejection T 1: accept length {runs[0][1]['accept_length']:.3f} on the GPU")


# ---- the Triton twins, compiled, at real sizes ---------------------------------------------

def _to(device, *tensors):
    return [t.to(device) for t in tensors]


@settings(max_examples=60, deadline=None)
@given(bs=st.integers(1, 8), K=st.integers(1, 8), S=st.integers(1, 8), data=st.data())
def test_gpu_build_tree_twin_equals_the_explicit_build(bs, K, S, data):
    """bs <= 8, topk <= 8, depth <= 8, n <= 64, every mask layout."""
    from spectrace.compat import sglang as explicit
    from spectrace.core.tree import TreeMaskMode
    from spectrace.compat import triton as kernels

    n = data.draw(st.integers(2, min(tree_capacity(K, S) + 1, 64)))
    seq_lens = torch.tensor(data.draw(st.lists(st.integers(0, 300), min_size=bs, max_size=bs)))
    parent_list, sel, draft_tokens = run_draft_loop(bs, K, S, n, data.draw(st.integers(0, 2**31)))
    for mode in [m for m in TreeMaskMode if m != TreeMaskMode.QLEN_ONLY_BITPACKING or n <= 32]:
        args = (torch.arange(bs), parent_list, sel, draft_tokens, seq_lens)
        want = explicit.build_tree_kernel_efficient(*args, int(seq_lens.sum()), K, S, n, mode)
        got = kernels.build_tree_kernel_efficient(*_to("cuda", *args), int(seq_lens.sum()), K, S, n, mode)
        assert all(torch.equal(w, g.cpu()) for w, g in zip(want, got)), mode


@pytest.mark.parametrize("vocab", [4096, 128_256])
def test_gpu_walk_twins_equal_the_explicit_walks(vocab):
    """bs 64, trees of 8 nodes (topk 4, depth 5), the embedded-size and a Llama-3-size vocabulary:
    greedy exactly; target_only and chain rejection with the same coins, exactly but for a bonus
    drawn at a CDF boundary (tests/test_kernels.py: assert_same_walk)."""
    from test_kernels import assert_same_walk
    from test_compat import outputs

    from spectrace.compat import sglang as explicit
    from spectrace.compat import triton as kernels

    bs, K, S, n = 64, 4, 5, 8
    g = torch.Generator().manual_seed(vocab)
    parent_list, sel, draft_tokens = run_draft_loop(bs, K, S, n, 3)
    _, _, ri, nt, ns, _ = explicit.build_tree_kernel_efficient(torch.zeros(bs, dtype=torch.int64), parent_list, sel,
                                                               draft_tokens, torch.zeros(bs, dtype=torch.int64), 0,
                                                               K, S, n)
    logits = torch.randn(bs, n, vocab, generator=g) * 3
    target_probs = torch.softmax(logits, -1)
    candidates = torch.topk(logits, 2, dim=-1).indices[..., 1].roll(1, 1)  # children often the target's second choice
    candidates = torch.where(torch.rand(bs, n, generator=g) < 0.5, logits.argmax(-1).roll(1, 1), candidates)
    coins, coins_final = torch.rand(bs, n, generator=g), torch.rand(bs, generator=g)
    cuda = lambda *t: _to("cuda", *t)  # noqa: E731
    for fn in ("verify_tree_greedy", "tree_speculative_sampling_target_only"):
        results = []
        for module, move in ((explicit, lambda *t: list(t)), (kernels, cuda)):
            out = move(*outputs(bs, S + 1, bs * n))
            draft_probs = move(torch.zeros_like(target_probs))[0]
            args = move(candidates, ri, nt, ns)
            if fn == "verify_tree_greedy":
                module.verify_tree_greedy(*out, *args, move(logits.argmax(-1))[0])
            else:
                module.tree_speculative_sampling_target_only(*out, *args, *move(coins, coins_final, target_probs),
                                                             draft_probs)
            results.append(([t.cpu() for t in out], draft_probs.cpu()))
        (out1, d1), (out2, d2) = results
        assert torch.equal(d1, d2), fn
        full = out1[2] == S
        differed = assert_same_walk(out1, out2, lambda b, node: target_probs[b, node] if full[b] else
                                    (target_probs[b, node] - d1[b, node]).clamp(min=0), coins_final)
        print(f"{fn} V {vocab}: bonuses drawn differently at a CDF boundary: {differed} of {bs}")
    draft_probs = torch.softmax(torch.randn(bs, n - 1, vocab, generator=g) * 3, -1)
    drafts = torch.multinomial(draft_probs.view(-1, vocab), 1, generator=g).view(bs, -1)
    chain = torch.cat([candidates[:, :1], drafts], 1)
    chain_index = torch.arange(bs * n).view(bs, n)
    results = []
    for module, move in ((explicit, lambda *t: list(t)), (kernels, cuda)):
        out = move(*outputs(bs, n, bs * n))
        module.chain_speculative_sampling(*out, *move(chain, chain_index, coins, coins_final, target_probs,
                                                      draft_probs))
        results.append([t.cpu() for t in out])
    accepted_all = results[0][2] == n - 1
    differed = assert_same_walk(*results, lambda b, row: target_probs[b, row] if accepted_all[b] else
                                (target_probs[b, row] - draft_probs[b, row]).clamp(min=0), coins_final)
    print(f"chain_speculative_sampling V {vocab}: bonuses drawn differently at a CDF boundary: {differed} of {bs}")


@pytest.mark.parametrize("rule", ["target_only", "rejection"])
def test_gpu_walk_twins_keep_the_target_distribution(rule):
    """The synthetic Markov model of tests/test_acceptance.py, every run one request of a batched
    twin call: the two-token law is the target's (chi-square, the N that catches a 2% bias)."""
    from spectrace.testing import V, chi_square, markov, samples_for
    from test_compat import outputs

    from spectrace.compat import triton as kernels

    p0, P, q0, Q = markov(3)
    exact = p0[:, None] * P
    N = samples_for(exact)
    g = torch.Generator().manual_seed(4)

    def step(root_p, root_q, roots):
        """One batched step of len(roots) requests; returns each request's emitted tokens."""
        bs = len(roots)
        if rule == "target_only":  # the draft's top 2, twice: nodes 0; 1, 2; 3, 4 under 1; 5, 6 under 2
            a = torch.topk(root_q, 2, dim=-1).indices
            kids = torch.topk(Q[a], 2, dim=-1).indices.view(bs, 4)
            candidates = torch.cat([roots.view(bs, 1), a, kids], 1)
            tp = torch.cat([root_p.view(bs, 1, V), P[candidates[:, 1:]]], 1)
            nt = torch.tensor([1, 3, 5, -1, -1, -1, -1]).expand(bs, 7)
            ns = torch.tensor([-1, 2, -1, 4, -1, 6, -1]).expand(bs, 7)
            out = [t.cuda() for t in outputs(bs, 3, bs * 7)]
            kernels.tree_speculative_sampling_target_only(
                *out, *_to("cuda", candidates, torch.arange(bs * 7).view(bs, 7), nt.contiguous(), ns.contiguous(),
                           torch.rand(bs, 7, generator=g), torch.rand(bs, generator=g), tp.contiguous(),
                           torch.zeros_like(tp)))
        else:  # a chain of two drafts sampled from q
            d1 = torch.multinomial(root_q, 1, generator=g).view(bs)
            d2 = torch.multinomial(Q[d1], 1, generator=g).view(bs)
            candidates = torch.stack([roots, d1, d2], 1)
            tp = torch.stack([root_p, P[d1], P[d2]], 1)
            out = [t.cuda() for t in outputs(bs, 3, bs * 3)]
            kernels.chain_speculative_sampling(*out, *_to("cuda", candidates, torch.arange(bs * 3).view(bs, 3),
                                                          torch.rand(bs, 3, generator=g), torch.rand(bs, generator=g),
                                                          tp.contiguous(), torch.stack([root_q, Q[d1]], 1)))
        predicts, accept_index, accept_num = (t.cpu() for t in out)
        return [[int(predicts[r]) for r in accept_index[b, :accept_num[b] + 1]] for b in range(bs)]

    outs = step(p0.expand(N, V), q0.expand(N, V), torch.zeros(N, dtype=torch.int64))
    short = [i for i, o in enumerate(outs) if len(o) < 2]
    firsts = torch.tensor([outs[i][0] for i in short], dtype=torch.int64)
    if short:
        for i, more in zip(short, step(P[firsts], Q[firsts], firsts)):
            outs[i] = outs[i] + more[:1]
    counts = torch.zeros(V, V)
    for o in outs:
        counts[o[0], o[1]] += 1
    stat, crit = chi_square(counts, exact)
    print(f"{rule} through the twin: chi2 {stat:.1f} (critical {crit:.1f}), N {N}")
    assert stat < crit



@pytest.mark.parametrize("vocab", [4096, 128_256])
def test_gpu_vllm_sampler_twin_equals_the_explicit_sampler(vocab):
    """64 requests of 0 to 7 drafts, half greedy, seeded, with and without draft_probs."""
    from spectrace.compat.vllm import GREEDY_TEMPERATURE, RejectionSampler, SamplingMetadata, SpecDecodeMetadata
    from spectrace.compat import triton as twin

    g = torch.Generator().manual_seed(1)
    B = 64
    num = torch.randint(0, 8, (B,), generator=g).tolist()
    N = sum(num)
    draft_logits = torch.randn(N, vocab, generator=g) * 2
    logits = draft_logits + torch.randn(N, vocab, generator=g) * 0.3
    sampled = torch.multinomial(torch.softmax(draft_logits, -1), 1, generator=g).view(-1).tolist()
    drafts = [sampled[sum(num[:r]):sum(num[:r + 1])] for r in range(B)]
    temperature = torch.where(torch.rand(B, generator=g) < 0.5, float(GREEDY_TEMPERATURE), 1.0)
    bonus = torch.randint(0, vocab, (B, 1), generator=g)
    for draft_probs in (torch.softmax(draft_logits, -1), None):
        outs = []
        for sampler, device in ((RejectionSampler(), "cpu"), (twin.RejectionSampler(), "cuda")):
            sm = SamplingMetadata(temperature, all_greedy=False, all_random=False,
                                  generators={r: torch.Generator().manual_seed(r) for r in range(B)})
            dp = None if draft_probs is None else draft_probs.to(device)
            outs.append(sampler(SpecDecodeMetadata.make_dummy(drafts, device), dp, logits.to(device),
                                bonus.to(device), sm).cpu())
        assert torch.equal(*outs)


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(32, 8, 128), (12, 4, 80), (12, 4, 13)])
def test_gpu_extend_attention_twin_equals_the_explicit_attention(heads, kv_heads, head_dim):
    """19 requests, prefixes up to 3000 tokens: a verify (8-node trees) and a causal prefill chunk;
    and one request's one new token after 2,000 (decode_tile's short tiles in many splits); fp32
    (IEEE dots) against the explicit attention; bf16 against fp32 within SGLang's rtol 1e-2."""
    from test_attention_kernels import attention_case, run

    from spectrace.compat import sglang as explicit
    from spectrace.kernels import attention

    g = torch.Generator().manual_seed(heads + head_dim)
    prefix_lens = torch.randint(0, 3000, (19,), generator=g).tolist()
    for prefix_lens, extend_lens, tree in ((prefix_lens, [8] * 19, True),
                                           (prefix_lens, torch.randint(1, 300, (19,), generator=g).tolist(), False),
                                           ([2000], [1], False)):
        case, _ = attention_case(0, prefix_lens, extend_lens, heads, kv_heads, head_dim, tree=tree, device="cuda")
        ref = run(explicit, case)
        for splits in (None, 1, 7):  # None: auto_kv_splits
            ours = run(attention, case, num_kv_splits=splits)
            print(f"h {heads}/{kv_heads} d {head_dim} tree {tree} KV splits {splits}: "
                  f"fp32 max |diff| {(ours - ref).abs().max():.1e}")
            torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
        half = {k: v.bfloat16() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in case.items()}
        ours16, ref16 = run(attention, half).float(), run(explicit, half).float()
        print(f"  bf16 max |diff| to fp32: twin {(ours16 - ref).abs().max():.1e}, "
              f"explicit {(ref16 - ref).abs().max():.1e}")
        torch.testing.assert_close(ours16, ref, atol=1e-2, rtol=1e-2)


def test_gpu_tree_attention_branches_equal_causal_chains_in_bf16():
    """vLLM's tree-attention test at its sizes: prefix 1024, 16 requests' worth of heads, bf16,
    atol 7.81e-3: every node equals the causal chain of its ancestors."""
    from test_attention_kernels import attention_case, run

    from spectrace.kernels import attention

    prefix, n = 1024, 16
    case, masks = attention_case(1, [prefix], [n], 32, 8, 128, dtype=torch.bfloat16, device="cuda")
    tree_out = run(attention, case)
    for j in range(n):
        chain = masks[0][j, prefix:].nonzero().flatten()
        chain_case = {**case, "q_extend": case["q_extend"][chain], "k_extend": case["k_extend"][chain],
                      "v_extend": case["v_extend"][chain], "o_extend": case["o_extend"][chain],
                      "qo_indptr": torch.tensor([0, len(chain)], device="cuda"), "custom_mask": None,
                      "mask_indptr": None, "max_len_extend": len(chain)}
        torch.testing.assert_close(tree_out[j], run(attention, chain_case)[-1], atol=7.81e-3, rtol=0)



@pytest.mark.parametrize("algo,options", [(algo, {**options, "batch": batch, "commit_style": style})
                                          for algo, options in BACKEND_CASES for batch in (1, 2)
                                          for style in ("sglang", "vllm")])
def test_gpu_triton_backend_runs_the_explicit_steps(algo, options, tmp_path):
    """tests/test_backend.py compiled on the GPU, fp32, 24 tokens, and the whole cross product:
    every case at batch 1 and 2, in both commit styles."""
    from test_backend import steps

    from spectrace.run import RunConfig, run

    traces = {}
    for backend in ("explicit", "triton"):
        traces[backend] = tmp_path / f"{backend}.jsonl"
        run(RunConfig(algo=algo, max_new_tokens=24, seed=3, trace=str(traces[backend]), backend=backend,
                      device="cuda", dtype="float32", **options))
    for want, got in zip(steps(traces["explicit"]), steps(traces["triton"]), strict=True):
        assert got == want


def test_gpu_batch_invariant_verify_equals_one_token_decodes_in_bf16():
    """--deterministic on the GPU: each tree node's verify logits equal its path's one-token
    decodes bit for bit; without it, a batched matrix product may reduce in another order."""
    from test_model import tree_verify_and_decodes

    for j, (verified, decoded) in enumerate(tree_verify_and_decodes("cuda", invariant=True)):
        assert torch.equal(verified, decoded), j
    plain = tree_verify_and_decodes("cuda", invariant=False)
    print(f"without --deterministic: {sum(torch.equal(a, b) for a, b in plain)} of {len(plain)} nodes bit-equal, "
          f"max |diff| {max((a - b).abs().max().item() for a, b in plain):.2e}")


@pytest.mark.parametrize("backend", ["explicit", "fast"])
def test_gpu_deterministic_bf16_speculative_output_equals_plain_decoding(tokenizer, backend):
    """bf16, batch 8, 48 tokens: eagle with --deterministic gives none's tokens (none decoding its
    rows one at a time too) on every prompt; prints how many the batched verify matched. On the
    fast engine from CUDA graphs: verify as one-token forwards captured in the graph."""
    from spectrace.run import RunConfig, run

    out = {}
    for algo in ("none", "eagle"):
        for det in (False, True):
            res = run(RunConfig(algo=algo, prompts=HELD_OUT_PROMPTS, batch=8, max_new_tokens=48, device="cuda",
                                dtype="bfloat16", deterministic=det, trace_level="off", backend=backend))
            out[algo, det] = [r.output_ids for r in res.requests]
    assert out["eagle", True] == out["none", True]
    print(f"{backend}: bf16 eagle = none on {sum(a == b for a, b in zip(out['eagle', False], out['none', False]))} "
          f"of 8 prompts batched, {sum(a == b for a, b in zip(out['eagle', True], out['none', True]))} of 8 with "
          f"--deterministic")


# ---- the fast engine (fast/engine.py) ------------------------------------------------------

@pytest.mark.usefixtures("quick_tiers")
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("algo,options", FAST_CASES, ids=FAST_IDS)
def test_gpu_fast_engine_decides_every_step_as_the_explicit_one(algo, options, batch, tmp_path):
    """fp32, compiled, CUDA graphs replayed: the explicit engine's trees, walks and tokens."""
    options = {**options, "batch": batch}
    if "prompts" in options:  # the case's own prompts, the last (the one that drafts) at batch 1
        options["prompts"] = options["prompts"][-batch:]
    runs = run_both(algo, options, tmp_path, max_new_tokens=32, device="cuda", dtype="float32")
    assert runs["fast"][0].texts == runs["explicit"][0].texts
    assert_same_steps(runs["explicit"][1], runs["fast"][1], batch, 1e-5)


@pytest.mark.usefixtures("quick_tiers")
@pytest.mark.parametrize("algo,options", FAST_CASES, ids=FAST_IDS)
def test_gpu_fast_engine_graph_replay_equals_eager(algo, options):
    """bf16, batch 8: every step's record (tree, q, path scores, p, walk, tokens) from replayed
    CUDA graphs equals the eager run's, bit for bit (an adaptive run: a graph set per tier, switched
    between steps); and overlapped steps give the same tokens."""
    from spectrace.loading.models import load_drafter_model
    from spectrace.run import RunConfig, resolve, resolve_prompts

    cfg = RunConfig(algo=algo, **{**options, "batch": 8}, max_new_tokens=32, device="cuda", dtype="bfloat16")
    spec, options = resolve(cfg)  # options: Medusa's tree, n-gram's config
    tok = load_tokenizer(cfg.target_model)
    target = load_model(cfg.target_model, torch.bfloat16, "cuda")
    draft = load_drafter_model(algo, cfg.draft_path, target, tok, torch.bfloat16, "cuda") if cfg.draft_path else None
    ids = [tok.encode(p) for p in resolve_prompts(cfg.prompts, cfg.batch)]
    records = {}
    for graphs in (False, True):
        seen = records[graphs] = []
        engine = build_engine(target, draft, spec, ids, (0,), on_step=seen.append, backend="fast", graphs=graphs,
                              **options)
        assert all((t.graphs is not None) == graphs for t in engine.runner.tiers.values())
        reqs, _ = engine.generate(ids)
        seen.append([r.output_ids for r in reqs])
    strip = lambda recs: [{k: v for k, v in r.items() if k != "timing"} if isinstance(r, dict) else r  # noqa: E731
                          for r in recs]
    assert strip(records[True]) == strip(records[False])
    assert len(records[True]) > 8
    # nothing recording: steps overlap the host's reading; the same tokens
    reqs, _ = build_engine(target, draft, spec, ids, (0,), backend="fast", **options).generate(ids)
    assert [r.output_ids for r in reqs] == records[True][-1]


# ---- real shapes (random weights, spectrace/zoo/random_checkpoint.py) ----------------------------

REAL_ALGOS = ("none", "standalone", "eagle", "eagle3", "mtp", "frozen_kv_mtp", "medusa", "dflash", "ngram")


def test_gpu_llama32_1b_shape_every_algorithm_fp32_equals_transformers(tmp_path):
    """Llama-3.2-1B's shape (llama3 RoPE, factor 32, tied head, 16 layers of 2048) with a drafter of
    every kind: the fast engine's fp32 greedy tokens on the 8 held-out prompts (batch 8, graphs)
    equal transformers' greedy generate, prompt by prompt."""
    from spectrace.run import RunConfig, run
    from spectrace.zoo.random_checkpoint import make

    root = make("llama-3.2-1b", tmp_path / "m", dtype=torch.float32, device="cuda")
    loaded, outs = {}, {}
    for algo in REAL_ALGOS:
        draft = {"none": None, "ngram": None, "standalone": root / "draft"}.get(algo, root / algo)
        cfg = RunConfig(algo=algo, target_model=str(root / "target"), draft_model=draft and str(draft),
                        prompts=list(HELD_OUT_PROMPTS), max_new_tokens=24, device="cuda", dtype="float32",
                        backend="fast", trace_level="off", raw_prompt=True)
        outs[algo] = [(r.prompt_ids, r.output_ids) for r in run(cfg, loaded=loaded).requests]
    loaded.clear()
    hf = AutoModelForCausalLM.from_pretrained(root / "target", dtype=torch.float32).to("cuda").eval()
    for i, (prompt_ids, output_ids) in enumerate(outs["none"]):
        ref = hf.generate(torch.tensor([prompt_ids], device="cuda"), max_new_tokens=len(output_ids), do_sample=False,
                          eos_token_id=None, pad_token_id=0)[0, len(prompt_ids):].tolist()
        for algo in REAL_ALGOS:
            assert outs[algo][i][1] == ref, (algo, i)


def test_gpu_bench_runs_eagle3_at_llama31_8b_width(tmp_path, capsys):
    """`spectrace bench --target-model DIR --draft-model HEAD --algos none eagle3` end to end at
    Llama-3.1-8B's width (8 of its 32 layers, to keep the test short; the numbers of the
    full model are in docs/models.md), bf16, with SafeAILab's EAGLE-3 head."""
    from spectrace.cli import main
    from spectrace.zoo.random_checkpoint import make

    root = make("llama-3.1-8b", tmp_path / "m", ("eagle3",), layers=8, device="cuda")
    assert main(["bench", "--device", "cuda", "--backend", "fast", "--target-model", str(root / "target"),
                 "--draft-model", str(root / "eagle3"), "--algos", "none", "eagle3", "--repeat", "1",
                 "--max-new-tokens", "16"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.split()}
    assert float(rows["none"][2]) > 0 and float(rows["eagle3"][2]) > 0 and rows["eagle3"][1] == "5,4,8"


def test_gpu_the_grown_8b_pair_is_the_embedded_pair(tmp_path):
    """Llama-3.1-8B's shape computing the embedded pair (spectrace/zoo/grow, made on the GPU): in
    float32 the grown target's greedy tokens are the embedded target's on the 8 held-out prompts x
    64 tokens on both engines, and each grown drafter drafts the embedded drafter's trees step for
    step on the fast engine; in bfloat16 each grown pair's τ is within 3% of the embedded pair's.
    The drafters but the 1B draft LM are stored in bfloat16 (their numbers are bf16-exact); the
    draft LM in float32, since its q carries sqrt(2) (head_dim 64 over 32). SPECTRACE_GROWN_8B:
    a directory holding the bfloat16 pair already (what `spectrace bench --target-shape
    llama-3.1-8b` leaves in runs/grown/llama-3.1-8b), else it is grown here. It holds an 8B model
    in float32 (32 GB) beside the embedded ones: run it alone on an 80 GB card (`-k grown_8b`),
    the rest with `-n 6 -k "not grown_8b"`."""
    import os
    import shutil

    from spectrace.algos import ALGOS
    from spectrace.measure.bench import release
    from spectrace.loading.models import drop_drafters
    from spectrace.run import RunConfig, run
    from spectrace.zoo.grow import HEADS, head_dir, make as grow

    root = Path(os.environ.get("SPECTRACE_GROWN_8B") or tmp_path / "grown")
    try:
        missing = [h for h in ["target", *HEADS] if h != "draft" and not (root / h / "README.md").is_file()]
        if missing:
            grow("llama-3.1-8b", root, [h for h in missing if h != "target"], device="cuda", target="target" in missing)
        grow("llama-3.1-8b", tmp_path, ["draft"], dtype=torch.float32, device="cuda", target=False)

        def records(algo, grown, backend, dtype, loaded):
            steps = []
            fmt = ALGOS[algo].checkpoint
            where = {"target_model": str(root / "target"),
                     **({"draft_model": str((tmp_path if fmt == "lm" else root) / head_dir(fmt))} if fmt else {})}
            cfg = RunConfig(algo=algo, prompts=list(HELD_OUT_PROMPTS), batch=8, max_new_tokens=64, device="cuda",
                            dtype=dtype, backend=backend, trace_level="off", **(where if grown else {}))
            res = run(cfg, loaded=loaded, on_step=lambda r: steps.append(
                (r["request"], r["accept_len"], (r.get("draft") or {}).get("tokens"))))
            drop_drafters(loaded)  # the drafter goes, the target stays
            release("cuda")  # and the run's CUDA-graph pools with it
            m = res.metrics
            return [r.output_ids for r in res.requests], steps, m["completion_tokens"] / max(m["verify_ct"], 1)

        algos = ["none", "standalone", "eagle", "eagle3", "mtp", "frozen_kv_mtp", "medusa", "dflash"]
        tiny, big = {}, {}
        assert records("none", True, "explicit", "float32", big)[0] == records("none", False, "explicit", "float32",
                                                                                 tiny)[0]
        tiny.clear(), big.clear()
        for algo in algos:
            a, b = records(algo, False, "fast", "float32", tiny), records(algo, True, "fast", "float32", big)
            print(f"float32 fast {algo}: {len(a[1])} steps, tau {a[2]:.4f} / {b[2]:.4f}, "
                  f"same steps {sum(x == y for x, y in zip(a[1], b[1]))}")
            assert a[:2] == b[:2], algo
        tiny.clear(), big.clear()
        torch.cuda.empty_cache()
        for algo in algos[1:]:
            a, b = records(algo, False, "fast", "bfloat16", tiny)[2], records(algo, True, "fast", "bfloat16", big)[2]
            print(f"bfloat16 fast {algo}: tau embedded {a:.4f}, grown {b:.4f} ({b / a - 1:+.2%})")
            assert abs(b / a - 1) <= 0.03, algo
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)

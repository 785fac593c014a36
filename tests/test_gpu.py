"""The explicit path on a GPU: the same numbers as on the CPU in fp32, and bf16 close to
transformers' bf16. Runs where torch sees a GPU (the project's H200 machine); CI has none."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from spectrace.core.batch import ForwardBatch
from spectrace.core.engine import SpecConfig
from spectrace.core.model import load_model
from spectrace.core.drafters.ngram import NgramConfig
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
    from spectrace.run import RunConfig, load_drafter_model

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
    from spectrace.run import RunConfig, load_drafter_model

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
    from spectrace.run import RunConfig, load_drafter_model

    target = load_model(TARGET_DIR, torch.float32, "cuda")
    draft = load_drafter_model("eagle", RunConfig(algo="eagle").draft_path, target, load_tokenizer(TARGET_DIR),
                               torch.float32, "cuda")
    ids = [tokenizer.encode(p) for p in HELD_OUT_PROMPTS]
    spec = SpecConfig(algo="eagle", num_steps=5, topk=4, num_draft_tokens=8, max_new_tokens=32,
                      acceptance="tree_rejection", temperature=1.0, seed=3)
    runs = [build_engine(target, draft, spec, ids, (0,)).generate(ids) for _ in range(2)]
    assert [r.output_ids for r in runs[0][0]] == [r.output_ids for r in runs[1][0]]
    print(f"tree_rejection T 1: accept length {runs[0][1]['accept_length']:.3f} on the GPU")

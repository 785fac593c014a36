"""`--backend triton` runs the same steps as `--backend explicit`: for every algorithm, greedy and
seeded sampling, batch 1 and a ragged batch, both commit styles, each step commits the same
tokens with the same correct_drafts and bonus_token, the draft trees are the same, and the KV
events (slots allocated, committed, moved, freed) are equal. On CPU the kernels run interpreted,
so the runs are a few tokens long; tests/test_gpu.py repeats this compiled on the GPU."""
import json

import pytest

from spectrace.run import RunConfig, run

pytest.importorskip("triton")

# (algo, options): every algorithm greedy and sampled, every rule with a twin, both commit styles,
# batch 1 and 2 (the held-out prompts differ in length: a ragged batch)
CASES = [
    ("none", dict(batch=1)),
    ("none", dict(temperature=1.0, batch=2, commit_style="vllm")),
    ("standalone", dict(batch=2)),
    ("standalone", dict(temperature=1.0, acceptance="vllm", batch=1, commit_style="vllm")),
    ("eagle", dict(topk=4, batch=2, commit_style="vllm")),
    ("eagle", dict(topk=4, temperature=1.0, batch=1)),
    ("eagle3", dict(topk=2, num_steps=3, num_draft_tokens=6, batch=1)),
    ("eagle3", dict(topk=1, temperature=1.0, acceptance="rejection", batch=2, commit_style="vllm")),
    ("mtp", dict(batch=2)),
    ("mtp", dict(temperature=1.0, batch=1, commit_style="vllm", threshold_single=0.9, threshold_acc=0.5)),
    ("frozen_kv_mtp", dict(batch=2, commit_style="vllm")),
    ("frozen_kv_mtp", dict(temperature=1.0, batch=1)),
    ("ngram", dict(batch=2, commit_style="vllm", prompt_lookup_min=1, prompt_lookup_max=3)),
    ("ngram", dict(temperature=1.0, acceptance="vllm", batch=1, prompt_lookup_min=1, prompt_lookup_max=3)),
    ("medusa", dict(batch=1)),
    ("medusa", dict(temperature=1.0, batch=2, commit_style="vllm")),
    ("dflash", dict(batch=2)),
    ("dflash", dict(temperature=1.0, acceptance="vllm", batch=1, commit_style="vllm")),
]


def steps(path):
    """What must agree, step by step: the decision and its KV bookkeeping (timings may not)."""
    out = []
    for line in open(path):
        rec = json.loads(line)
        if rec["kind"] in ("prefill", "step"):
            kv = {k: v for k, v in rec["kv"].items()}
            out.append({"kind": rec["kind"], "request": rec["request"], "kv": kv,
                        **{k: rec.get(k) for k in ("step", "committed_tokens", "correct_drafts", "bonus_token",
                                                   "first_token")},
                        "draft_tokens": (rec.get("draft") or {}).get("tokens")})
    return out


@pytest.mark.parametrize("algo,options", CASES, ids=[f"{a}-{i % 2 and 'sampled' or 'greedy'}"
                                                     for i, (a, _) in enumerate(CASES)])
def test_triton_backend_runs_the_explicit_steps(algo, options, tmp_path):
    traces = {}
    for backend in ("explicit", "triton"):
        traces[backend] = tmp_path / f"{backend}.jsonl"
        run(RunConfig(algo=algo, max_new_tokens=6, seed=3, trace=str(traces[backend]), backend=backend, **options))
    explicit, triton = steps(traces["explicit"]), steps(traces["triton"])
    assert len(explicit) > options.get("batch", 1)  # prefills and at least one step
    for want, got in zip(explicit, triton, strict=True):
        assert got == want
    header = json.loads(open(traces["triton"]).readline())
    assert header["config"]["backend"] == "triton"

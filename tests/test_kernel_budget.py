"""The fast engine's kernel budget (docs/kernel-budget.md), counted on the CPU as `spectrace bench
--profile --device cpu` counts it: every torch operator that launches a kernel and every Triton
launch of a step, phase by phase. The counted run is the fast engine with fused layers (as on a
GPU), so it is also checked to give the explicit engine's tokens."""
import pytest

pytest.importorskip("triton")

from spectrace.measure.profile import KernelCounter, by_phase, per_step  # noqa: E402
from spectrace.run import RunConfig, run  # noqa: E402

# kernels per step at most. Plain decoding: about 9 per layer of the 8-layer target, the embedding,
# RoPE, the final norm, lm_head and argmax, and the walk, accept and commit kernels. EAGLE (5, 4, 8):
# the budget is 220 a step, 80 for the draft and 25 for the extend; the ceilings below are what the
# engine launches today (draft 74, extend 23, total 187: a level's select is two launches, which
# made it 4x faster on the H200), held so that they only go down.
BUDGET = {"none": {"total": 100}, "eagle": {"total": 187, "draft": 74, "verify": 80, "extend": 23}}

@pytest.mark.parametrize("algo", ["none", "eagle"])
def test_a_step_stays_within_its_kernel_budget(algo):
    shape = dict(num_steps=5, topk=4, num_draft_tokens=8) if algo != "none" else {}
    # a prompt of a few tokens, and a few steps: interpreted, each token's RoPE over each head is a
    # program of its own, at about 7 ms
    options = dict(algo=algo, prompts=["Once upon a time"], raw_prompt=True, max_new_tokens=8 if shape else 4,
                   trace_level="off", **shape)
    counter = KernelCounter()
    fast = run(RunConfig(backend="fast", **options), probe=counter)
    explicit = run(RunConfig(**options))
    assert fast.requests[0].output_ids == explicit.requests[0].output_ids
    rows = per_step(counter.result())
    assert counter.launches["verify"] >= 2  # steps counted after the warm-up one
    for phase, limit in BUDGET[algo].items():
        assert rows[phase]["kernels"] <= limit, (phase, rows)
    for phase, kernels in by_phase(counter.result()).items():  # what --json lists: the rows, kernel by kernel
        assert abs(sum(k["per_launch"] for k in kernels) - rows[phase]["kernels"]) < 0.01 * len(kernels) + 0.1


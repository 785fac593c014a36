"""Metrics follow SGLang's and vLLM's definitions on any sequence of steps."""
from hypothesis import given
from hypothesis import strategies as st

from spectrace.core.metrics import SpecMetrics, predicted_speedup, speedup_model, vllm_log_line


@given(K=st.integers(1, 6), data=st.data())
def test_definitions_hold_for_any_accept_sequence(K, data):
    m = SpecMetrics(num_steps=K, num_draft_tokens=K + 1)
    n_req = data.draw(st.integers(1, 3))
    correct_counts = {r: data.draw(st.lists(st.integers(0, K), min_size=1, max_size=12)) for r in range(n_req)}
    step_ms = [data.draw(st.floats(0.1, 10)) for _ in range(12)]  # step i's phases, shared by its requests
    for r, counts in correct_counts.items():
        m.observe_prefill(r)
        for i, c in enumerate(counts):
            drafts = list(range(100, 100 + K))
            m.observe_step({"step": i, "request": r, "draft": {"tokens": drafts}, "correct_drafts": drafts[:c],
                            "accept_len": c + 1, "committed_tokens": drafts[:c] + [7],
                            "timing": {"draft": step_ms[i], "verify": 2 * step_ms[i], "batch_size": n_req}})
    s = m.summary(wall_s=2.0)
    steps = max(len(counts) for counts in correct_counts.values())
    assert s["decode_steps"] == steps  # each step's cost counted once, however many requests it carried
    assert s["phase_ms"]["verify"] == round(2 * sum(step_ms[:steps]), 3) and "batch_size" not in s["phase_ms"]
    flat = [c for counts in correct_counts.values() for c in counts]
    verify_ct = len(flat)
    completion = n_req + sum(c + 1 for c in flat)  # first token + accept_len per step
    assert s["verify_ct"] == verify_ct and s["completion_tokens"] == completion
    assert s["accept_length"] == completion / verify_ct  # SGLang tau includes the prefill token
    assert s["accept_rate"] == sum(flat) / (verify_ct * K)
    v = s["vllm"]
    assert v["mean_acceptance_length"] == 1 + sum(flat) / verify_ct
    assert v["draft_acceptance_rate"] == 100 * sum(flat) / (verify_ct * K)
    assert v["num_accepted_tokens_per_pos"] == [sum(c > i for c in flat) for i in range(K)]
    rates = v["per_position_acceptance_rate"]
    assert all(a >= b for a, b in zip(rates, rates[1:]))  # a later position needs the earlier ones
    assert sum(s["accept_len_histogram"].values()) == verify_ct
    assert "Mean acceptance length: %.2f" % v["mean_acceptance_length"] in vllm_log_line(s)


@given(tau=st.floats(1, 10), r=st.floats(0.001, 10))
def test_the_speedup_model_is_below_tau_and_below_1_without_acceptance(tau, r):
    """τ / (1 + r): below τ whenever drafting costs anything; below 1 when nothing is accepted."""
    assert predicted_speedup(tau, r) < tau
    assert predicted_speedup(1.0, r) < 1
    assert abs(predicted_speedup(3.5, 0.2) - 2.9167) < 1e-4  # 000 §1.1 table: τ 3.5, r 0.2, ≈ 2.9×


def test_speedup_model_reads_a_trace_as_the_run_counted_it(tmp_path):
    """From a trace of a ragged batch: the per-step phase costs the run's own metrics summed
    (each batch step once), τ from the summary, and τ / (1 + r)."""
    from spectrace.core.trace_reader import read_trace
    from spectrace.run import RunConfig, run

    res = run(RunConfig(algo="eagle", batch=3, max_new_tokens=12, trace=str(tmp_path / "t.jsonl")))
    t = read_trace(tmp_path / "t.jsonl")
    model = speedup_model(t.steps, t.summary["metrics"])
    m = res.metrics
    for phase, total in m["phase_ms"].items():
        assert abs(model["phase_ms"][phase] - total / m["decode_steps"]) < 1e-6
    assert model["tau"] == m["accept_length"]
    assert model["r"] == model["phase_ms"]["draft"] / model["phase_ms"]["verify"]
    assert model["predicted_speedup"] == predicted_speedup(model["tau"], model["r"])

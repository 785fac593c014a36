"""Metrics follow SGLang's and vLLM's definitions on any sequence of steps."""
from hypothesis import given
from hypothesis import strategies as st

from spectrace.core.metrics import SpecMetrics, vllm_log_line


@given(K=st.integers(1, 6), data=st.data())
def test_definitions_hold_for_any_accept_sequence(K, data):
    m = SpecMetrics(num_steps=K, num_draft_tokens=K + 1)
    n_req = data.draw(st.integers(1, 3))
    correct_counts = {r: data.draw(st.lists(st.integers(0, K), min_size=1, max_size=12)) for r in range(n_req)}
    for r, counts in correct_counts.items():
        m.observe_prefill(r)
        for c in counts:
            drafts = list(range(100, 100 + K))
            m.observe_step({"request": r, "draft": {"tokens": drafts}, "correct_drafts": drafts[:c],
                            "accept_len": c + 1, "committed_tokens": drafts[:c] + [7]})
    s = m.summary(wall_s=2.0)
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

"""SGLang's adaptive steps: the EMA and the tier switches follow the documented rule on synthetic
accept sequences, and adaptive runs of the embedded models equal autoregressive decoding."""
from hypothesis import given, settings
from hypothesis import strategies as st
from conftest import generate

from spectrace.core.adaptive import AdaptiveConfig, AdaptiveSpeculativeParams


def run(seq, initial=3):
    a = AdaptiveSpeculativeParams(initial)
    tiers = []
    for accepted in seq:
        a.update(accepted)
        tiers.append(a.current_steps)
    return a, tiers


def test_a_worked_sequence():
    """Three drafts accepted per request for 15 batches, then none. ema starts at 3 - 1 = 2."""
    a, tiers = run([[3, 3]] * 15 + [[0]] * 15)
    # decisions come after batch 15, 20, 25, 30 (warm-up 10, interval 5)
    ema15 = 3 - 1 * 0.8 ** 15  # 2.965 > 3 - 0.5: up to 7
    assert tiers[:14] == [3] * 14 and tiers[14] == 7
    ema20 = ema15 * 0.8 ** 5  # 0.97 <= 3 - 0.5 - 0.25: down to 3; > 1 - 0.75: no further
    assert tiers[15:19] == [7] * 4 and tiers[19] == 3
    ema25 = ema20 * 0.8 ** 5  # 0.318 > 0.25: stays at 3
    assert tiers[24] == 3
    ema30 = ema25 * 0.8 ** 5  # 0.104 <= 0.25: down to 1
    assert tiers[29] == 1 and abs(a.ema - ema30) < 1e-12


def test_defaults_and_tiers():
    assert AdaptiveSpeculativeParams(3).candidate_steps == [1, 3, 7]
    assert AdaptiveSpeculativeParams(5).candidate_steps == [1, 3, 5, 7]  # the initial steps join the tiers
    assert AdaptiveConfig().warmup_batches == 10 and AdaptiveConfig().update_interval == 5


@settings(max_examples=300, deadline=None)
@given(seq=st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=4), max_size=60),
       initial=st.sampled_from([1, 3, 7]))
def test_switches_follow_the_rule(seq, initial):
    a = AdaptiveSpeculativeParams(initial)
    cfg, cand = a.config, a.candidate_steps
    ema = initial - 1.0
    for i, accepted in enumerate(seq, start=1):
        before = a.current_steps
        switched = a.update(accepted)
        ema = (1 - cfg.ema_alpha) * ema + cfg.ema_alpha * sum(accepted) / len(accepted)
        assert abs(a.ema - ema) < 1e-9
        decides = i > cfg.warmup_batches and (i - cfg.warmup_batches) % cfg.update_interval == 0
        assert switched == (a.current_steps != before) and (decides or not switched)
        if decides:  # the tier it lands on is stable under both conditions
            idx = cand.index(a.current_steps)
            assert not (idx > 0 and ema <= cand[idx - 1] - 0.5 + cfg.down_hysteresis)
            assert not (idx < len(cand) - 1 and ema > cand[idx] - 0.5 + cfg.up_hysteresis)


# the target keeps repeating the line, so the drafts are accepted whole and the EMA climbs
REPEATING = "\n".join(["        self.a = None"] * 4)


def test_adaptive_runs_equal_autoregressive_and_record_switches(target, drafters, tokenizer):
    from spectrace.zoo.prompts import HELD_OUT_PROMPTS

    ids = [tokenizer.encode(REPEATING), tokenizer.encode(HELD_OUT_PROMPTS[2])]
    ar, _ = generate(target, None, "none", ids, max_new=100)
    spec, _ = generate(target, drafters["eagle"], "eagle", ids, 3, 100, "sglang", (0,), adaptive=True)
    assert spec == ar

    steps = []  # alone, so no other request pulls its EMA down
    generate(target, drafters["eagle"], "eagle", ids[:1], 3, 100, adaptive=True, steps=steps)
    # each step drafted the tier the rule held before it, fed the accepted drafts seen so far
    rule = AdaptiveSpeculativeParams(3)
    for s in steps:
        assert s["adaptive"]["num_steps"] == len(s["draft"]["tokens"]) == rule.current_steps
        switched = rule.update([len(s["correct_drafts"])])
        assert s["adaptive"]["switched_to"] == (rule.current_steps if switched else None)
    assert any(s["adaptive"]["switched_to"] for s in steps), "the prompt no longer makes the chain switch tiers"

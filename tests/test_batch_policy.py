"""--batch-policy: the shape a run takes from its number of requests, and what it refuses."""
import json
import re

import pytest
from hypothesis import given, strategies as st

from spectrace.batch_policy import EMBEDDED, BatchPolicy, parse_policy
from spectrace.cli import main
from spectrace.errors import SpectraceError
from spectrace.run import RunConfig, run

shapes = st.one_of(st.none(), st.tuples(st.integers(1, 6), st.integers(1, 4), st.integers(2, 9)))


@given(st.dictionaries(st.integers(1, 128), shapes, min_size=1), st.integers(1, 200))
def test_a_batch_takes_the_entry_of_the_largest_batch_size_not_above_it(table, batch):
    policy = BatchPolicy(table)
    fitting = [b for b in sorted(table) if b <= batch]
    expected = table[fitting[-1]] if fitting else table[min(table)]  # below every entry: the smallest
    assert policy.shape_for(batch) == expected


def test_auto_is_the_embedded_table_of_the_device_and_json_reads_the_same_from_text_or_file(tmp_path):
    assert parse_policy("auto", "cuda:1").table == EMBEDDED["cuda"]
    assert parse_policy("auto", "cpu").table == EMBEDDED["cpu"]
    text = '{"1": [5, 4, 8], "8": [3, 1, 4], "32": "off"}'
    (tmp_path / "policy.json").write_text(text)
    for source in (text, str(tmp_path / "policy.json")):
        assert parse_policy(source).table == {1: (5, 4, 8), 8: (3, 1, 4), 32: None}


@pytest.mark.parametrize("text, message", [
    ("fast", "--batch-policy fast: not auto, a JSON object or a file holding one (No such file or directory)"),
    ("{1: 2}", "not auto, a JSON object or a file holding one (Expecting property name"),
    ("[1, 2]", "expected an object of batch sizes"),
    ('{"0": [3, 1, 4]}', "'0' is not a batch size"),
    ('{"1": [3, 1]}', "needs [num_steps, topk, num_draft_tokens]"),
    ('{"1": [2, 2, 9]}', "9 draft tokens do not fit a tree of 2 steps and topk 2 (2 to 7"),
    ('{"1": [3, 1, 6]}', "a chain takes num_steps + 1"),
])
def test_a_bad_policy_is_refused_in_one_line(text, message, capsys):
    with pytest.raises(SpectraceError, match=re.escape(message)):
        parse_policy(text)
    assert main(["run", "--algo", "eagle", "--batch-policy", text, "--no-tui", "--trace-level", "off"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.parametrize("args, message", [
    (["--algo", "ngram"], "--algo ngram has no such shape"),
    (["--algo", "eagle", "--topk", "2"], "drop --topk"),
    (["--algo", "eagle", "--speculative-adaptive"], "drop --speculative-adaptive"),
])
def test_a_policy_is_refused_where_it_cannot_choose_the_shape(args, message, capsys):
    assert main(["run", *args, "--batch-policy", "auto", "--no-tui", "--trace-level", "off"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_policy_run_is_the_run_of_the_shape_it_chose(tmp_path):
    """At each batch the run equals the one given the chosen shape by hand (or plain decoding
    where it turns drafting off), token for token and step for step; the trace says what it chose."""
    policy = '{"1": [4, 2, 6], "2": [2, 1, 3], "3": "off"}'
    for batch, by_hand in ((1, dict(algo="eagle", num_steps=4, topk=2, num_draft_tokens=6)),
                           (2, dict(algo="eagle", num_steps=2, topk=1, num_draft_tokens=3)), (3, dict(algo="none"))):
        trace = tmp_path / f"policy-{batch}.jsonl"
        chosen = run(RunConfig(algo="eagle", batch=batch, max_new_tokens=10, batch_policy=policy, trace=str(trace)))
        plain = run(RunConfig(batch=batch, max_new_tokens=10, trace_level="off", **by_hand))
        assert [r.output_ids for r in chosen.requests] == [r.output_ids for r in plain.requests]
        assert chosen.metrics["verify_ct"] == plain.metrics["verify_ct"]
        assert (chosen.spec.algo, chosen.spec.num_steps, chosen.spec.topk) == \
            (plain.spec.algo, plain.spec.num_steps, plain.spec.topk)
        header = json.loads(trace.read_text().splitlines()[0])
        shape = None if batch == 3 else [by_hand["num_steps"], by_hand["topk"], by_hand["num_draft_tokens"]]
        assert header["batch_policy"] == {"policy": policy, "algo": "eagle", "batch": batch, "shape": shape}


def test_the_batch_lab_prints_the_policy_beside_the_fixed_shape(tmp_path, monkeypatch, capsys):
    from spectrace.measure.bench import batch_table
    from spectrace.zoo.prompts import HELD_OUT_PROMPTS
    monkeypatch.chdir(tmp_path)

    def config(**kw):
        return RunConfig(max_new_tokens=8, **kw)
    prompts = HELD_OUT_PROMPTS[:2]
    table = batch_table(config, ["eagle"], prompts, [1, 2], repeat=1, policy='{"1": [2, 1, 3], "2": "off"}')
    chain = [run(config(algo="eagle", prompts=[p], num_steps=2, topk=1, trace_level="off")).metrics for p in prompts]
    assert table[1]["eagle policy"][1] == sum(m["completion_tokens"] for m in chain) / sum(m["verify_ct"] for m in chain)
    assert table[2]["eagle policy"][1] is None  # drafting off: no verify, no τ
    assert capsys.readouterr().out.splitlines()[0].split("|")[2].split()[:3] == ["eagle", "policy", "tok/s"]
    assert main(["bench", "--algos", "eagle", "--batch-policy", "auto", "--max-new-tokens", "2"]) == 2
    assert "--batch-policy adds a column to the batch lab: add --batch-sizes" in capsys.readouterr().err

"""`spectrace rejudge` (spectrace/rejudge.py) over `run --record-probs` sidecars (core/probs.py):
under the recorded rule, thresholds and seed it gives back every recorded verdict exactly, for
every rule and the drafters that feed it; other rules and temperatures behave as their
definitions say; the re-judged trace opens in the viewers; bad input is one line, exit 2."""
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectrace.cli import main
from spectrace.core.probs import UNSEALED
from spectrace.core.trace_reader import TraceFile, read_trace

RECORDED = {  # name -> run options; each recorded once per session, with --record-probs
    "greedy_tree": ["--algo", "eagle", "--num-steps", "3", "--topk", "2", "--num-draft-tokens", "5", "--batch", "2"],
    "target_only": ["--algo", "eagle", "--num-steps", "3", "--topk", "2", "--num-draft-tokens", "5",
                    "--temperature", "0.8", "--speculative-accept-threshold-single", "0.6",
                    "--speculative-accept-threshold-acc", "0.5"],
    "rejection": ["--algo", "eagle", "--num-steps", "3", "--topk", "1", "--acceptance", "rejection",
                  "--temperature", "1"],
    "tree_rejection": ["--algo", "eagle", "--num-steps", "3", "--topk", "2", "--num-draft-tokens", "5",
                       "--acceptance", "tree_rejection", "--temperature", "1"],
    "vllm": ["--algo", "standalone", "--acceptance", "vllm", "--temperature", "1", "--top-k", "50"],
    "typical": ["--algo", "medusa", "--acceptance", "typical", "--temperature", "1"],
    "ngram_vllm": ["--algo", "ngram", "--prompt-lookup-min", "1", "--prompt-lookup-max", "3", "--acceptance", "vllm",
                   "--temperature", "1"],
    "adaptive": ["--algo", "eagle", "--speculative-adaptive", "--temperature", "1"],
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """name -> a trace recorded with --record-probs (made on first use)."""
    root, made = tmp_path_factory.mktemp("recorded"), {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = root / f"{name}.jsonl"
            assert main(["run", "--no-tui", "--max-new-tokens", "16", "--record-probs", "--trace", str(made[name]),
                         *RECORDED[name]]) == 0
        return made[name]
    return get


def rejudge(trace: Path, out: Path, *args) -> int:
    return main(["rejudge", str(trace), "-o", str(out), *args])


VERDICT = [("correct_drafts",), ("bonus_token",), ("accept_len",), ("committed_tokens",), ("accept", "accept_nodes"),
           ("accept", "decisions"), ("accept", "bonus_from"), ("draft", "fates"), ("verify", "target_predict"),
           ("verify", "target_topk"), ("verify", "p_draft")]


def field(rec, path):
    for k in path:
        rec = rec[k] if rec is not None else None  # a step without drafts has no draft record
    return rec


@pytest.mark.parametrize("name", list(RECORDED))
def test_the_recorded_rule_gives_back_every_recorded_verdict(recorded, tmp_path, capsys, name):
    trace = recorded(name)
    header = json.loads(trace.read_text().split("\n")[0])
    rule, cfg = header["config"]["acceptance"], header["config"]
    args = ["--acceptance", rule]
    if rule == "target_only":  # given explicitly once; the default is the recorded value too
        args += ["--speculative-accept-threshold-single", str(cfg["threshold_single"]), "--seed", str(cfg["seed"])]
    assert rejudge(trace, tmp_path / "same.jsonl", *args) == 0
    assert "random numbers: the recorded ones" in capsys.readouterr().out
    before, after = read_trace(trace), read_trace(tmp_path / "same.jsonl")
    assert len(after.steps) == len(before.steps) and any(s["draft"] is not None for s in before.steps)
    for a, b in zip(before.steps, after.steps):
        for path in VERDICT:
            assert field(b, path) == field(a, path), (name, a["step"], a["request"], path)
    for key in ("accept_length", "accept_rate", "num_correct_drafts", "completion_tokens"):
        assert after.summary["metrics"][key] == before.summary["metrics"][key]
    assert after.summary["requests"] == before.summary["requests"]
    assert after.header["rejudged"]["acceptance"] == [rule, rule]


def test_threshold_single_zero_accepts_the_first_child_all_the_way_down(recorded, tmp_path):
    """target_only accepts a draft whose p reaches threshold_single: at 0, every first child, so
    each path is the chain of first children to the tree's depth (or the step's room)."""
    assert rejudge(recorded("greedy_tree"), tmp_path / "t.jsonl", "--acceptance", "target_only", "--temperature", "1",
                   "--speculative-accept-threshold-single", "0") == 0
    for rec in read_trace(tmp_path / "t.jsonl").steps:
        nxt, path = rec["draft"]["retrive_next_token"], [0]
        while nxt[path[-1]] != -1 and len(path) <= 3:
            path.append(nxt[path[-1]])
        assert rec["accept"]["accept_nodes"] == path
        assert all(d["accepted"] for d in rec["accept"]["decisions"])
        assert rec["accept"]["rule"] == "target_only"


def test_target_only_near_temperature_zero_is_greedy(recorded, tmp_path):
    """As the temperature falls p becomes one-hot on the argmax: target_only's fresh coins then
    accept exactly greedy's drafts and draw greedy's bonus."""
    trace = recorded("greedy_tree")
    assert rejudge(trace, tmp_path / "t.jsonl", "--acceptance", "target_only", "--temperature", "1e-4") == 0
    for a, b in zip(read_trace(trace).steps, read_trace(tmp_path / "t.jsonl").steps):
        assert (b["accept"]["accept_nodes"], b["bonus_token"]) == (a["accept"]["accept_nodes"], a["bonus_token"])


def test_fresh_random_numbers_are_seeded_and_change_verdicts(recorded, tmp_path, capsys):
    trace = recorded("target_only")
    for out in ("a", "b"):
        assert rejudge(trace, tmp_path / f"{out}.jsonl", "--acceptance", "target_only", "--seed", "7") == 0
    assert "random numbers: fresh, seed 7" in capsys.readouterr().out
    a, b = (read_trace(tmp_path / f"{x}.jsonl") for x in "ab")
    assert a.steps == b.steps  # the same seed, the same draws
    recorded_steps = read_trace(trace).steps
    coins = [d["coin"] for s in a.steps for d in s["accept"]["decisions"]]
    assert coins != [d["coin"] for s in recorded_steps for d in s["accept"]["decisions"]]


def test_the_report_says_step_local_and_before_after(recorded, tmp_path, capsys):
    assert rejudge(recorded("greedy_tree"), tmp_path / "t.jsonl", "--acceptance", "tree_rejection",
                   "--temperature", "1") == 0
    out = capsys.readouterr().out
    assert "acceptance greedy -> tree_rejection, temperature 0.0 -> 1.0" in out
    assert "step-local" in out and "not samples of q" in out  # greedy trees were not sampled
    new = read_trace(tmp_path / "t.jsonl")
    tau = new.summary["metrics"]["accept_length"]
    assert f"{tau:.3f}" in out.split("tau (accept_length)")[1].split("\n")[0]
    assert new.header["config"]["acceptance"] == "tree_rejection" and "probs" not in new.header


def test_a_rejudged_trace_opens_in_the_walkthrough_and_renders(recorded, tmp_path):
    from spectrace.viz.tui.snapshot import drive

    assert rejudge(recorded("greedy_tree"), tmp_path / "t.jsonl", "--acceptance", "target_only",
                   "--temperature", "1") == 0
    _, text = drive(tmp_path / "t.jsonl", ["right", "right"], (120, 40), None)
    assert "re-judged" in text and "target_only" in text
    step = TraceFile(tmp_path / "t.jsonl").step(1)["step"]
    assert main(["render", str(tmp_path / "t.jsonl"), "--step", str(step), "-o", str(tmp_path / "s.dot")]) == 0


def test_an_interrupted_run_keeps_a_sealed_sidecar_of_its_finished_steps(tmp_path):
    from spectrace.run import RunConfig, run

    steps = []

    def stop(rec):
        steps.append(rec)
        if len(steps) == 3:
            raise KeyboardInterrupt
    trace = tmp_path / "t.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run(RunConfig(algo="eagle", max_new_tokens=32, trace=str(trace), record_probs=True), on_step=stop)
    assert UNSEALED not in trace.read_text().split("\n")[0]
    assert rejudge(trace, tmp_path / "r.jsonl", "--acceptance", "greedy") == 0
    assert [s["accept_tokens"] for s in read_trace(tmp_path / "r.jsonl").steps] == \
        [s["accept_tokens"] for s in read_trace(trace).steps]


def test_a_shared_trace_without_its_model_still_rejudges(recorded, tmp_path):
    """The target's directory gone: tokens the recorded trace never mentioned (new bonus tokens)
    are written as <id>; every other token keeps the recorded text."""
    src = recorded("greedy_tree")
    lines = src.read_text().split("\n")
    header = json.loads(lines[0])
    header["config"]["target_model"] = str(tmp_path / "gone")
    copy = tmp_path / "greedy_tree.jsonl"
    copy.write_text("\n".join([json.dumps(header)] + lines[1:]))
    sidecar = "greedy_tree.probs.safetensors"
    (tmp_path / sidecar).write_bytes(src.with_name(sidecar).read_bytes())
    assert rejudge(copy, tmp_path / "r.jsonl", "--acceptance", "target_only", "--temperature", "2") == 0
    before, after = TraceFile(copy), TraceFile(tmp_path / "r.jsonl")
    new = set(after.tokens) - set(before.tokens)
    assert all(after.tokens[t] == before.tokens[t] for t in before.tokens if t in after.tokens)
    assert new and all(after.tokens[t] == f"<{t}>" for t in new)  # T 2 draws bonuses the run never showed


def one_line_exit_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_bad_rejudges_are_one_line_and_exit_2(recorded, tmp_path, capsys):
    plain = tmp_path / "plain.jsonl"
    assert main(["run", "--no-tui", "--algo", "eagle", "--max-new-tokens", "4", "--trace", str(plain)]) == 0
    capsys.readouterr()
    out = str(tmp_path / "o.jsonl")
    one_line_exit_2(capsys, ["rejudge", str(plain), "--acceptance", "greedy", "-o", out], "--record-probs")
    ngram = recorded("ngram_vllm")
    one_line_exit_2(capsys, ["rejudge", str(ngram), "--acceptance", "rejection", "-o", out], "n-gram drafts are copied")
    tree = recorded("greedy_tree")
    one_line_exit_2(capsys, ["rejudge", str(tree), "--acceptance", "rejection", "--temperature", "1", "-o", out],
                    "needs --topk 1")
    one_line_exit_2(capsys, ["rejudge", str(tree), "--acceptance", "target_only", "-o", out], "--temperature > 0")
    one_line_exit_2(capsys, ["rejudge", str(tree), "--acceptance", "bogus", "-o", out], "unknown --acceptance")
    one_line_exit_2(capsys, ["rejudge", str(tree), "--acceptance", "greedy", "-o", str(tree)], "overwrite")
    # the sidecar moved away, changed, or never saved
    copy = tmp_path / "copy.jsonl"
    copy.write_text(tree.read_text())
    one_line_exit_2(capsys, ["rejudge", str(copy), "--acceptance", "greedy", "-o", out], "not beside it")
    side = tmp_path / "greedy_tree.probs.safetensors"  # the name the header gives
    side.write_bytes(tree.with_name("greedy_tree.probs.safetensors").read_bytes()[:-1] + b"\0")
    one_line_exit_2(capsys, ["rejudge", str(copy), "--acceptance", "greedy", "-o", out], "sha256 differs")
    lines = tree.read_text().split("\n")
    header = json.loads(lines[0])
    header["probs"]["sha256"] = UNSEALED
    copy.write_text("\n".join([json.dumps(header)] + lines[1:]))
    one_line_exit_2(capsys, ["rejudge", str(copy), "--acceptance", "greedy", "-o", out], "stopped before saving")


@pytest.mark.parametrize("args, rule", [
    (["--algo", "eagle", "--num-steps", "3", "--topk", "2", "--num-draft-tokens", "5"], "greedy"),
    (["--algo", "eagle", "--num-steps", "3", "--topk", "1", "--acceptance", "rejection", "--temperature", "1"],
     "rejection"),
])
def test_the_fast_engine_records_what_the_explicit_one_does(tmp_path, args, rule):
    """--backend fast keeps the same sidecar (logits, q at the parents, the walk's draws) within
    float tolerance, and re-judging its trace under its own rule gives back its verdicts."""
    from safetensors.torch import load_file

    sidecars = {}
    for backend in ("explicit", "fast"):
        trace = tmp_path / f"{backend}.jsonl"
        assert main(["run", "--no-tui", "--max-new-tokens", "8", "--record-probs", "--backend", backend,
                     "--trace", str(trace), *args]) == 0
        sidecars[backend] = load_file(str(tmp_path / f"{backend}.probs.safetensors"))
    assert sidecars["fast"].keys() == sidecars["explicit"].keys()
    for name, want in sidecars["explicit"].items():
        assert sidecars["fast"][name].shape == want.shape and sidecars["fast"][name].dtype == want.dtype, name
        assert (sidecars["fast"][name] - want).abs().max() < 1e-4, name
    assert rejudge(tmp_path / "fast.jsonl", tmp_path / "r.jsonl", "--acceptance", rule) == 0
    for a, b in zip(read_trace(tmp_path / "fast.jsonl").steps, read_trace(tmp_path / "r.jsonl").steps):
        assert (b["accept"]["accept_nodes"], b["bonus_token"]) == (a["accept"]["accept_nodes"], a["bonus_token"])


@pytest.mark.parametrize("args, message", [
    (["--trace-level", "off"], "--trace-level off writes none"),
    (["--algo", "none"], "nothing to re-judge"),
])
def test_record_probs_refusals(tmp_path, capsys, args, message):
    one_line_exit_2(capsys, ["run", "--no-tui", "--record-probs", "--trace", str(tmp_path / "t.jsonl"), *args], message)


REJUDGE_OPTIONS = {  # rejudge's options and values a user might type, good and bad
    "--acceptance": st.sampled_from(["greedy", "target_only", "rejection", "tree_rejection", "vllm", "typical", "y"]),
    "--temperature": st.sampled_from(["0", "0.7", "1", "-0.5", "nan", "inf", "1e9", "x"]),
    "--speculative-accept-threshold-single": st.sampled_from(["0", "0.5", "1", "1.5", "-1", "nan"]),
    "--speculative-accept-threshold-acc": st.sampled_from(["0", "0.3", "1", "2", "nan"]),
    "--seed": st.sampled_from(["0", "-1", "7", str(2 ** 64), "x"]),
}


@settings(max_examples=40, deadline=None, derandomize=True,  # the same examples in every CI run
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trace=st.sampled_from(["greedy_tree", "rejection", "ngram_vllm"]),
       options=st.dictionaries(st.sampled_from(sorted(REJUDGE_OPTIONS)), st.just(None), max_size=4).flatmap(
           lambda d: st.fixed_dictionaries({k: REJUDGE_OPTIONS[k] for k in d})))
def test_fuzzed_rejudges_work_or_fail_in_one_line(recorded, tmp_path, capsys, trace, options):
    args = [a for k, v in options.items() for a in (k, v)]
    if "--acceptance" not in options:
        args += ["--acceptance", "greedy"]
    path = recorded(trace)
    capsys.readouterr()  # what recording printed
    try:
        code = rejudge(path, tmp_path / "f.jsonl", *args)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code in (0, 2) and "Traceback" not in err, (args, err)
    if code == 2:
        assert len(err.strip().splitlines()) == 1, (args, err)
    else:
        read_trace(tmp_path / "f.jsonl")

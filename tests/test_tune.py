"""`spectrace tune` (a batch policy from measured tau and step costs) and `--prompts FILE`."""
import json
import re

import pytest

from spectrace.batch_policy import parse_policy
from spectrace.cli import main
from spectrace.measure.cli import read_prompts
from spectrace.errors import SpectraceError


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_tune_chooses_by_its_predictions_and_writes_a_policy(capsys, tmp_path):
    """A tiny sweep on the CPU: at each batch size the choice is the shape with the largest
    predicted speed-up, or `off` where none beats plain decoding; with --sweep the file keeps the
    best run end to end, a policy `--batch-policy FILE` reads."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("def add(a, b):\n\ndef sub(a, b):\n")
    policy = tmp_path / "policy.json"
    code, out, _ = _run(capsys, "tune", "--algos", "eagle", "--batch-sizes", "1", "2", "--shapes", "1,1,2", "3,2,4",
                        "--prompts", str(prompts), "--max-new-tokens", "6", "--cost-tokens", "4", "--repeat", "1",
                        "--sweep", "-o", str(policy))
    assert code == 0, out
    written = json.loads(policy.read_text())
    assert set(written) == {"1", "2"}
    rows = {int(m[1]): [float(x) for x in m[2].split("x")[:-1]] for m in re.finditer(r"^\s+(\d+)\s+[\d.]+ ((?:\s*[\d.]+x)+)",
                                                                                        out, re.M)}
    shapes = ["1,1,2", "3,2,4"]
    assert rows.keys() == {1, 2}
    # --sweep: the choice's realised speed-up over the best of every shape (and plain) run end to end
    confirmed = re.findall(r"^\s+(\d+)\s+(\S+)\s+[\d.]+\s+[\d.]+x\s+([\d.]+)x\s+(\S+)\s+([\d.]+)x\s+([\d.]+)\s+(\S+)$",
                           out, re.M)
    assert [int(c[0]) for c in confirmed] == [1, 2]
    for bs, choice, ratio, best, best_ratio, against, kept in confirmed:
        predicted, top = rows[int(bs)], max(rows[int(bs)])  # printed to 0.01: a choice ties with the best within that
        if choice == "off":
            assert top <= 1.005
        else:
            assert predicted[shapes.index(choice)] >= max(top - 0.005, 0.995)
        assert best in ("off", "1,1,2", "3,2,4") and float(best_ratio) >= max(float(ratio), 1.0) - 0.005
        assert abs(float(against) - float(ratio) / float(best_ratio)) < 0.01
        assert kept == best == (",".join(map(str, written[bs])) if written[bs] != "off" else "off")
    assert parse_policy(str(policy)).table.keys() == {1, 2}
    code, out, _ = _run(capsys, "bench", "--algos", "eagle", "--batch-sizes", "2", "--batch-policy", str(policy),
                        "--prompts", str(prompts), "--max-new-tokens", "4", "--repeat", "1")
    assert code == 0 and "eagle policy" in out


@pytest.mark.parametrize("sweep, want", [(False, {"1": [3, 2, 4], "2": "off"}),
                                          (True, {"1": [3, 2, 4], "2": [1, 1, 2]})])
def test_tune_keeps_only_what_paid_end_to_end(capsys, tmp_path, monkeypatch, sweep, want):
    """Measurements made up (no model runs): (3, 2, 4) accepts more, so it is predicted best at both
    batch sizes, and ran 1.10x plain decoding at batch 1, 0.80x at 2, where (1, 1, 2) ran 1.20x.
    The written policy keeps a choice only where it paid; --sweep keeps the best run end to end."""
    import types

    from spectrace.measure import tune

    small, large = (1, 1, 2), (3, 2, 4)
    verifies = {small: 4, large: 3}  # per request, 6 tokens each: tau 1.5 and 2.0
    tokens_per_s = {(None, 1): 100, (None, 2): 100, (small, 1): 90, (small, 2): 120, (large, 1): 110, (large, 2): 80}

    def fake_run(config, loaded=None):
        v = verifies[(config.num_steps, config.topk, config.num_draft_tokens)]
        per = [{"completion_tokens": 6, "spec_verify_ct": v}] * 2
        return types.SimpleNamespace(metrics={"completion_tokens": 12, "verify_ct": 2 * v, "per_request": per})

    monkeypatch.setattr(tune, "run", fake_run)
    monkeypatch.setattr(tune, "step_ms", lambda config, algo, group, tokens, repeat, loaded, shape: 1.0)
    monkeypatch.setattr(tune, "realised", lambda config, algo, prompts, bs, shape, loaded, repeat:
                        tokens_per_s[(shape, bs)])
    out = tmp_path / "policy.json"
    kept = tune.tune(lambda **kw: types.SimpleNamespace(max_new_tokens=6, device="cpu", **kw), "eagle", [1, 2], [small, large],
                     ["a", "b"], 4, 1, out, lambda message: None, "prompts", sweep)
    assert json.loads(out.read_text()) == want
    assert kept == {int(bs): tuple(s) if s != "off" else None for bs, s in want.items()}
    rows = re.findall(r"^\s+(\d+)\s+(\S+)\s.*\s(\S+)$", capsys.readouterr().out.split("confirmed end to end")[1], re.M)
    assert rows == [("1", "3,2,4", "3,2,4"), ("2", "3,2,4", "1,1,2" if sweep else "off")]  # choice, then policy


@pytest.mark.parametrize("argv, says", [
    (["--algos", "none"], "give one --algos"),
    (["--algos", "eagle", "eagle3"], "give one --algos"),
    (["--algos", "medusa"], "fixes its own shape"),
    (["--algos", "eagle", "--shapes", "5,4"], "--shapes: 5,4 needs [num_steps, topk, num_draft_tokens]"),
    (["--algos", "eagle", "--shapes", "5,x,8"], "--shapes: '5,x,8' is not num_steps,topk,num_draft_tokens"),
    (["--algos", "eagle", "--shapes", "3,1,8"], "--shapes: 3,1,8: 8 draft tokens do not fit"),
    (["--algos", "eagle", "--cost-tokens", "1"], "--cost-tokens must be at least 2"),
])
def test_tune_refuses_in_one_line(capsys, tmp_path, argv, says):
    code, _, err = _run(capsys, "tune", *argv, "-o", str(tmp_path / "p.json"))
    assert code == 2 and says in err and err.count("\n") == 1


def test_prompts_file_reads_lines_or_json_lines(tmp_path):
    lines = tmp_path / "a.txt"
    lines.write_text("first prompt\n\n  second one\n")
    assert read_prompts(str(lines)) == ["first prompt", "  second one"]
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text(json.dumps({"prompt": "def f():\n    return 1\n", "id": 3}) + "\n" + json.dumps({"prompt": "x"}) + "\n")
    assert read_prompts(str(jsonl)) == ["def f():\n    return 1\n", "x"]
    for text, says in [("", "no prompt in it"), ('{"prompt": "a"}\n{"text": "b"}\n', 'line 2: no "prompt" string'),
                       ('{"prompt": "a"}\n{"prompt": \n', "line 2: not JSON")]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        with pytest.raises(SpectraceError, match=re.escape(says)):
            read_prompts(str(bad))
    with pytest.raises(SpectraceError, match="--prompts"):
        read_prompts(str(tmp_path / "missing.txt"))


def test_bench_runs_on_the_prompts_of_a_file(capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "import os\n"}) + "\n")
    code, out, _ = _run(capsys, "bench", "--algos", "none", "--prompts", str(prompts), "--max-new-tokens", "4",
                        "--repeat", "1")
    assert code == 0 and f"{prompts} prompts: 1," in out

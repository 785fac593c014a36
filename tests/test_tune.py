"""`spectrace tune` (a batch policy from measured tau and step costs) and `--prompts FILE`."""
import json
import re

import pytest

from spectrace.batch_policy import parse_policy
from spectrace.cli import main
from spectrace.cli_measure import read_prompts
from spectrace.errors import SpectraceError


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_tune_writes_the_policy_its_predictions_choose(capsys, tmp_path):
    """A tiny sweep on the CPU: at each batch size the shape with the largest predicted speed-up,
    or `off` where none beats plain decoding; the file is a policy `--batch-policy FILE` reads."""
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
    shapes = [[1, 1, 2], [3, 2, 4]]
    assert rows.keys() == {1, 2}
    for bs, predicted in rows.items():  # printed to 0.01: a choice ties with the best within that
        choice, top = written[str(bs)], max(predicted)
        if choice == "off":
            assert top <= 1.005
        else:
            assert predicted[shapes.index(choice)] >= max(top - 0.005, 0.995)
    # --sweep: the choice's realised speed-up over the best of every shape (and plain) run end to end
    confirmed = re.findall(r"^\s+(\d+)\s+(\S+)\s+[\d.]+\s+[\d.]+x\s+([\d.]+)x\s+(\S+)\s+([\d.]+)x\s+([\d.]+)$", out, re.M)
    assert [int(c[0]) for c in confirmed] == [1, 2]
    for _, choice, ratio, best, best_ratio, against in confirmed:
        assert best in ("off", "1,1,2", "3,2,4") and float(best_ratio) >= max(float(ratio), 1.0) - 0.005
        assert abs(float(against) - float(ratio) / float(best_ratio)) < 0.01
    assert parse_policy(str(policy)).table.keys() == {1, 2}
    code, out, _ = _run(capsys, "bench", "--algos", "eagle", "--batch-sizes", "2", "--batch-policy", str(policy),
                        "--prompts", str(prompts), "--max-new-tokens", "4", "--repeat", "1")
    assert code == 0 and "eagle policy" in out


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

"""vLLM's --speculative-config on spectrace (spectrace/speculative_config.py): each method maps to
the chain vLLM runs, k drafts a step; what vLLM refuses is refused in one line; and a run given
the JSON equals the run given the same options as flags."""
import pytest

from spectrace.cli import main
from spectrace.core.trace_reader import read_trace
from spectrace.speculative_config import parse
from spectrace.zoo import EAGLE_DIR, MODELS_DIR

EAGLE, MEDUSA = str(EAGLE_DIR), str(MODELS_DIR / "tiny-medusa")


@pytest.mark.parametrize("text, want", [
    ('{"method": "eagle", "num_speculative_tokens": 3, "model": "D"}',
     dict(algo="eagle", num_steps=3, topk=1, num_draft_tokens=4, draft_model="D")),
    ('{"method": "eagle3", "num_speculative_tokens": 5, "model": "D"}',
     dict(algo="eagle3", num_steps=5, topk=1, num_draft_tokens=6, draft_model="D")),
    ('{"method": "draft_model", "num_speculative_tokens": 2, "model": "D"}',
     dict(algo="standalone", num_steps=2, topk=1, num_draft_tokens=3, draft_model="D")),
    ('{"method": "deepseek_mtp", "num_speculative_tokens": 1}',  # vLLM rewrites *_mtp to mtp
     dict(algo="mtp", num_steps=1, topk=1, num_draft_tokens=2)),
    ('{"method": "ngram", "num_speculative_tokens": 4}',  # both lookups missing: 5 / 5
     dict(algo="ngram", num_steps=4, topk=1, num_draft_tokens=5, prompt_lookup_min=5, prompt_lookup_max=5)),
    ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}',  # one missing copies the other
     dict(algo="ngram", num_steps=4, topk=1, num_draft_tokens=5, prompt_lookup_min=3, prompt_lookup_max=3)),
    ('{"model": "ngram", "num_speculative_tokens": 2}',  # vLLM infers the method from the model
     dict(algo="ngram", num_steps=2, topk=1, num_draft_tokens=3, prompt_lookup_min=5, prompt_lookup_max=5)),
    ('{"model": "org/EAGLE3-LLaMA3.1-8B", "num_speculative_tokens": 2}',
     dict(algo="eagle3", num_steps=2, topk=1, num_draft_tokens=3, draft_model="org/EAGLE3-LLaMA3.1-8B")),
    ('{"model": "yuhuili/EAGLE-LLaMA3-8B", "num_speculative_tokens": 2}',
     dict(algo="eagle", num_steps=2, topk=1, num_draft_tokens=3, draft_model="yuhuili/EAGLE-LLaMA3-8B")),
    ('{"model": "tiny-draft", "num_speculative_tokens": 2}',
     dict(algo="standalone", num_steps=2, topk=1, num_draft_tokens=3, draft_model="tiny-draft")),
    ('{"method": "medusa", "num_speculative_tokens": 3, "model": "D"}',  # head i's argmax at depth i + 1
     dict(algo="medusa", medusa_choices=[[0], [0, 0], [0, 0, 0]], draft_model="D")),
])
def test_methods_map_to_vllms_chains(text, want):
    assert parse(text) == want


@pytest.mark.parametrize("argv, message", [
    (["--speculative-config", "{not json"], "not JSON"),
    (["--speculative-config", "[1]"], "must be a JSON object"),
    (["--speculative-config", "{}"], "give a method or a model"),
    (["--speculative-config", '{"method": "eagle", "model": "D"}'], "num_speculative_tokens must be a positive"),
    (["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 0, "model": "D"}'], "positive integer"),
    (["--speculative-config", '{"method": "eagle", "num_speculative_tokens": true, "model": "D"}'], "positive integer"),
    (["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 3}'], "needs a draft model"),
    (["--speculative-config", '{"method": "medusa", "num_speculative_tokens": 3}'], "needs a draft model"),
    (["--speculative-config", f'{{"method": "medusa", "num_speculative_tokens": 9, "model": "{MEDUSA}"}}'],
     "more than the 3 Medusa heads"),
    (["--medusa-choices", "c.json", "--speculative-config", '{"method": "medusa", "num_speculative_tokens": 2, '
                                                            '"model": "D"}'], "drop --medusa-choices"),
    (["--speculative-config", '{"method": "suffix", "num_speculative_tokens": 3}'], "does not run it as vLLM"),
    (["--speculative-config", '{"method": "lookahead", "num_speculative_tokens": 3}'], "unknown method"),
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0}'], ">= 1"),
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, '
                              '"prompt_lookup_max": 2}'], "more than prompt_lookup_max"),
    (["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 3, "model": "D", '
                              '"prompt_lookup_max": 2}'], "belong to method ngram"),
    (["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 3, "model": "D", "quantization": "fp8"}'],
     "'quantization' is not a key"),
    (["--algo", "eagle", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'], "drop --algo"),
    (["--num-steps", "2", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'],
     "drop --num-steps"),
])
def test_what_vllm_refuses_is_one_line(capsys, argv, message):
    code = main(["run", "--no-tui", "--max-new-tokens", "2", "--trace-level", "off", *argv])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err


def test_the_json_runs_what_the_flags_run(capsys, tmp_path):
    traces = {}
    for name, argv in (("json", ["--speculative-config", f'{{"method": "eagle", "num_speculative_tokens": 3, '
                                                          f'"model": "{EAGLE}"}}']),
                       ("flags", ["--algo", "eagle", "--num-steps", "3", "--topk", "1", "--draft-model", EAGLE])):
        traces[name] = tmp_path / f"{name}.jsonl"
        assert main(["run", "--no-tui", "--max-new-tokens", "12", "--trace", str(traces[name]), *argv]) == 0
    out = capsys.readouterr().out
    assert "algo=eagle num_steps=3 topk=1 num_draft_tokens=4" in out
    json_run, flags_run = read_trace(traces["json"]), read_trace(traces["flags"])
    assert [s["accept_tokens"] for s in json_run.steps] == [s["accept_tokens"] for s in flags_run.steps]
    shape = lambda t: [t.header["config"][k] for k in ("algo", "num_steps", "topk", "num_draft_tokens")]  # noqa: E731
    assert shape(json_run) == shape(flags_run) == ["eagle", 3, 1, 4]


def test_medusa_runs_vllms_chain_of_head_argmaxes(tmp_path):
    """vLLM's Medusa proposer: draft i = argmax of head i. The JSON's chain equals the static tree
    [[0], [0, 0], [0, 0, 0]] given as --medusa-choices, step for step, and every node's token is
    its head's top token (the draft top-k the trace keeps at the node)."""
    choices = tmp_path / "chain.json"
    choices.write_text("[[0], [0, 0], [0, 0, 0]]")
    traces = {}
    for name, argv in (("json", ["--speculative-config", f'{{"method": "medusa", "num_speculative_tokens": 3, '
                                                          f'"model": "{MEDUSA}"}}']),
                       ("flags", ["--algo", "medusa", "--medusa-choices", str(choices)])):
        traces[name] = tmp_path / f"{name}.jsonl"
        assert main(["run", "--no-tui", "--max-new-tokens", "12", "--trace", str(traces[name]), *argv]) == 0
    json_run, flags_run = read_trace(traces["json"]), read_trace(traces["flags"])
    assert [s["accept_tokens"] for s in json_run.steps] == [s["accept_tokens"] for s in flags_run.steps]
    for s in json_run.steps:
        assert s["draft"]["parents"] == [0, 1, 2]
        assert [top[0][0] for top in s["draft"]["draft_topk"]] == s["draft"]["tokens"]

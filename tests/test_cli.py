"""The `spectrace` command: same text with and without speculation, one-line errors, exit code 2."""
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from spectrace.cli import main
from spectrace.core.trace_reader import TraceFile, read_trace


def _run(capsys, *args):
    capsys.readouterr()  # drop what fixtures printed
    try:
        code = main(list(args))
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_every_algorithm_prints_the_same_text_as_none(capsys, tmp_path):
    """The whole `spectrace run` path (loading, defaults, engine, trace, summary) per algorithm."""
    texts = {}
    for algo in ("none", "standalone", "eagle", "eagle3", "nextn", "mtp", "frozen_kv_mtp", "ngram", "medusa", "dflash"):
        trace = tmp_path / f"{algo}.jsonl"
        extra = ["--prompt-lookup-min", "1", "--prompt-lookup-max", "3"] if algo == "ngram" else []
        code, out, err = _run(capsys, "run", "--algo", algo, "--no-tui", "--batch", "2",
                              "--max-new-tokens", "20", "--trace", str(trace), *extra)
        assert code == 0, err
        first, text = out.split("\n---\n")[0].split("\n", 1)
        assert first.startswith(f"algo={algo} ") and first.endswith(" backend=explicit")  # what ran
        texts[algo] = text  # the requests' text, before the metrics
        t = read_trace(trace)
        per_req = {r["request"]: len(r["output_ids"]) for r in t.summary["requests"]}
        if algo == "none":  # one step per generated token after the first
            assert len(t.steps) == sum(n - 1 for n in per_req.values())
        else:
            assert "SpecDecoding metrics: Mean acceptance length" in out
            # SGLang's choice for a Llama target; n-gram: a chain of vLLM's k tokens
            # Medusa: the depth, widest rank and size of its default tree (24 paths of mc_sim_7b_63)
            shape = {"standalone": (3, 1, 4), "ngram": (5, 1, 6), "medusa": (3, 9, 25), "dflash": (7, 1, 8)}.get(
                algo, (5, 4, 8))
            cfg = t.header["config"]
            assert (cfg["num_steps"], cfg["topk"], cfg["num_draft_tokens"]) == shape
        assert texts[algo] == texts["none"], algo


def without_topk(rec: dict) -> dict:
    """A step record less what --trace-level steps leaves out (and the token texts of those ids),
    and less its timing, which never repeats."""
    rec = {k: v for k, v in rec.items() if k not in ("timing", "tokens")}
    rec["verify"] = {k: v for k, v in rec["verify"].items() if k != "target_topk"}
    if rec["draft"]:
        rec["draft"] = {k: v for k, v in rec["draft"].items() if k != "draft_topk"}
    if rec["accept"]["bonus_from"]:
        rec["accept"] = {**rec["accept"], "bonus_from": {k: v for k, v in rec["accept"]["bonus_from"].items()
                                                         if k != "topk"}}
    return rec


@pytest.mark.parametrize("args", [["--algo", "eagle", "--topk", "4"],
                                  ["--algo", "standalone", "--temperature", "1", "--batch", "2"]])
def test_trace_levels_keep_every_step_and_leave_out_only_the_topk(capsys, tmp_path, args):
    """full and steps: the same steps, verdicts, KV events and summary; steps records no top-k
    lists. off: no file, the same text."""
    outs, traces = {}, {}
    for level in ("full", "steps", "off"):
        path = tmp_path / f"{level}.jsonl"
        code, out, err = _run(capsys, "run", "--no-tui", "--max-new-tokens", "16", "--trace", str(path),
                              "--trace-level", level, *args)
        assert code == 0, err
        outs[level] = out.split("\n---\n")[0]
        traces[level] = read_trace(path) if level != "off" else None
    assert not (tmp_path / "off.jsonl").exists() and "trace: none (--trace-level off)" in out
    assert outs["full"] == outs["steps"] == outs["off"]
    full, steps = traces["full"], traces["steps"]
    assert [without_topk(r) for r in full.steps] == [without_topk(r) for r in steps.steps]
    assert full.summary["requests"] == steps.summary["requests"]
    assert any(pairs for r in full.steps for pairs in r["verify"]["target_topk"])
    assert all(not pairs for r in steps.steps for pairs in r["verify"]["target_topk"])
    assert all(not pairs for r in steps.steps if r["draft"] for pairs in r["draft"]["draft_topk"])
    assert steps.header["config"]["trace_level"] == "steps"


def test_deterministic_bf16_speculative_output_equals_plain_decoding(tmp_path):
    """--deterministic through the whole run (drafters reading the verify's features included):
    bf16 speculative output equals plain decoding's, token for token."""
    from spectrace.run import RunConfig, run

    out = {}
    for algo in ("none", "eagle3", "standalone"):
        res = run(RunConfig(algo=algo, batch=2, max_new_tokens=16, dtype="bfloat16", deterministic=True,
                            trace=str(tmp_path / f"{algo}.jsonl")))
        out[algo] = [r.output_ids for r in res.requests]
        assert read_trace(tmp_path / f"{algo}.jsonl").header["config"]["deterministic"] is True
    assert out["eagle3"] == out["none"] == out["standalone"]


@pytest.fixture
def other_vocab_model(tmp_path):
    cfg = LlamaConfig(vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "other")
    return str(tmp_path / "other")


@pytest.mark.parametrize("args, message", [
    (["--algo", "bogus"], "invalid choice"),
    (["--algo", "dflash", "--draft-model", "DFLASH", "--num-draft-tokens", "4"], "block of 6 tokens"),
    (["--algo", "dflash", "--draft-model", "DFLASH", "--acceptance", "rejection", "--temperature", "1"],
     "argmax of a block"),
    (["--algo", "medusa", "--topk", "2"], "do not apply"),
    (["--algo", "medusa", "--acceptance", "tree_rejection", "--temperature", "1"], "static tree"),
    (["--algo", "medusa", "--medusa-choices", "/nonexistent.json"], "--medusa-choices"),
    (["--algo", "eagle", "--speculative-adaptive", "--topk", "4"], "needs --topk 1"),
    (["--speculative-adaptive"], "runs with EAGLE"),
    (["--algo", "mtp", "--adaptive", "--num-steps", "5"], "must be one of [1, 3, 7]"),
    (["--algo", "ngram", "--topk", "4"], "drafts a chain"),
    (["--algo", "ngram", "--ngram-style", "sglang", "--speculative-ngram-max-trie-depth", "1"], "max_trie_depth > 1"),
    (["--algo", "ngram", "--prompt-lookup-min", "4", "--prompt-lookup-max", "2"], "need 1 <= min <= max"),
    (["--algo", "ngram", "--acceptance", "rejection", "--temperature", "1"], "n-gram drafts are copied"),
    (["--num-steps", "0"], "--num-steps must be at least 1"),
    (["--prompt", "x = 1\n" * 400], "more than the model's context"),
    (["--target-model", "/nonexistent/model"], "no such directory"),
    (["--draft-model", "OTHER"], "vocabulary"),
    (["--trace", "/proc/forbidden/t.jsonl"], "cannot write trace"),
    (["--batch", "1", "--prompt", "a", "--prompt", "b"], "--batch 1 is smaller"),
    (["--acceptance", "rejection", "--temperature", "0.7"], "only for EAGLE"),
    (["--algo", "eagle", "--speculative-use-rejection-sampling", "--temperature", "0.7"], "needs --topk 1"),
    (["--acceptance", "greedy", "--temperature", "0.7"], "needs --temperature 0"),
    (["--algo", "eagle", "--acceptance", "vllm", "--topk", "1"], "give --temperature > 0"),
    (["--algo", "eagle", "--acceptance", "tree_rejection", "--temperature", "1",
      "--speculative-accept-threshold-single", "0.5"], "thresholds belong to target_only"),
    (["--temperature", "1", "--speculative-accept-threshold-acc", "1.5"], "must lie in [0, 1]"),
    (["--acceptance", "speculative"], "unknown --acceptance"),
    (["--trace-level", "some"], "invalid choice"),
    (["--deterministic", "--backend", "triton"], "--deterministic runs on --backend explicit"),
    (["--algo", "eagle", "--speculative-algorithm", "NGRAM"], "--algo and --speculative-algorithm are one option"),
    # inputs that would otherwise end in a traceback, an allocation of many GB, or be accepted silently
    (["--algo", "eagle", "--topk", "100000"], "more than the draft's vocabulary of 4096"),
    (["--algo", "eagle3", "--topk", "5000"], "more than the draft's vocabulary of 3072"),
    (["--target-model", "TRUNCATED"], "cannot load model"),
    (["--algo", "standalone", "--draft-model", "TRUNCATED"], "cannot load model"),
    (["--prompt", "a\udcffb"], "is not valid UTF-8"),  # what Python makes of the byte 0xff in argv
    (["--device", "mps"], "unknown --device 'mps'"),
    (["--seed", str(2 ** 70)], "--seed must lie in"),
    (["--temperature", "nan"], "finite number >= 0"),
    (["--temperature", "inf"], "finite number >= 0"),
    (["--temperature", "-1"], "finite number >= 0"),
    (["--top-p", "nan", "--temperature", "1"], "--top-p must lie in (0, 1]"),
    (["--top-k", "-2", "--temperature", "1"], "--top-k must be a count"),
    (["--algo", "eagle3", "--draft-model", "EAGLE1"], "is an EAGLE-1 head: use --algo eagle"),
    (["--algo", "eagle", "--draft-model", "MEDUSA"], "holds no model.safetensors"),
    (["--algo", "eagle", "--medusa-choices", "/nonexistent.json"], "--algo eagle does not draft one"),
    (["--medusa-choices", "/nonexistent.json"], "--algo standalone does not draft one"),
    (["--algo", "eagle", "--prompt-lookup-max", "3"], "--prompt-lookup-max shapes the n-gram drafter; --algo eagle"),
    (["--algo", "eagle", "--ngram-style=sglang"], "--ngram-style shapes the n-gram drafter; --algo eagle does not"),
    (["--algo", "ngram", "--draft-model", "EAGLE1"], "--draft-model names the draft model; --algo ngram drafts"),
    (["--algo", "eagle", "--draft-model", __file__], "a file, not a model directory"),
    (["--batch", "100000"], "--batch 100000: the KV caches would need"),  # was 33 GB allocated, then a RuntimeError
])
def test_bad_input_is_one_line_and_exit_2(capsys, other_vocab_model, dflash_dir, truncated_dir, args, message):
    from spectrace.zoo import EAGLE_DIR, MODELS_DIR

    args = [{"OTHER": other_vocab_model, "DFLASH": str(dflash_dir), "TRUNCATED": str(truncated_dir),
             "EAGLE1": str(EAGLE_DIR), "MEDUSA": str(MODELS_DIR / "tiny-medusa")}.get(a, a) for a in args]
    code, out, err = _run(capsys, "run", "--no-tui", "--max-new-tokens", "4", *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("args, message", [
    (["--algos", "none", "foo"], "invalid choice: 'foo'"),
    (["--batch-sizes", "4", "0"], "--batch-sizes must each be at least 1, not 0"),
    (["--algos", "none", "eagle", "--medusa-choices", "/nonexistent.json"], "does not draft one"),
])
def test_bad_bench_input_is_one_line_and_exit_2_before_any_table(capsys, args, message):
    code, out, err = _run(capsys, "bench", *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


@pytest.fixture(scope="module")
def truncated_dir(tmp_path_factory):
    """The embedded target with its weights cut short, as an interrupted download leaves them."""
    import shutil

    from spectrace.zoo import TARGET_DIR

    d = tmp_path_factory.mktemp("truncated")
    for f in TARGET_DIR.iterdir():
        if f.suffix == ".json":
            shutil.copy(f, d / f.name)
    (d / "model.safetensors").write_bytes((TARGET_DIR / "model.safetensors").read_bytes()[:1000])
    return d


def test_replay_without_a_terminal_says_so_instead_of_waiting(capsys):
    """Under pytest stdin is not a terminal: the walkthrough would wait for one forever."""
    from pathlib import Path

    code, out, err = _run(capsys, "replay", str(Path(__file__).with_name("data") / "walkthrough.jsonl"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "needs a terminal" in err and "render" in err


OPTIONS = {  # run's options and values a user might type, good and bad
    "--algo": st.sampled_from(["none", "eagle", "eagle3", "standalone", "ngram", "medusa", "dflash", "mtp", "x"]),
    "--num-steps": st.sampled_from(["-1", "0", "1", "3", "40", "1e3", "x"]),
    "--topk": st.sampled_from(["0", "1", "4", "9", "5000", "-3", "2.5"]),
    "--num-draft-tokens": st.sampled_from(["0", "1", "2", "8", "300"]),
    "--temperature": st.sampled_from(["0", "0.7", "1", "-0.5", "nan", "inf", "1e9", "x"]),
    "--top-k": st.sampled_from(["-5", "-1", "0", "3", "99999"]),
    "--top-p": st.sampled_from(["0", "0.5", "1", "1.5", "nan"]),
    "--seed": st.sampled_from(["0", "-1", "7", str(2 ** 64)]),
    "--acceptance": st.sampled_from(["greedy", "target_only", "rejection", "tree_rejection", "vllm", "typical", "y"]),
    "--batch": st.sampled_from(["0", "1", "3", "-2"]),
    "--commit-style": st.sampled_from(["sglang", "vllm", "z"]),
    "--prompt": st.text(max_size=12),
    "--dtype": st.sampled_from(["float32", "bfloat16", "int8"]),
    "--device": st.sampled_from(["cpu", "cuda", "cuda:7", "tpu", ""]),
}


@settings(max_examples=30, deadline=None, derandomize=True,  # the same examples in every CI run
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(sorted(OPTIONS)), st.just(None), max_size=4).flatmap(
    lambda d: st.fixed_dictionaries({k: OPTIONS[k] for k in d})))
def test_fuzzed_options_run_or_fail_in_one_line(capsys, options):
    """Any mix of options: the run works (exit 0) or is refused in one line with exit 2; never a
    traceback, never a hang (runs are 2 tokens; the trace is off)."""
    args = [a for k, v in options.items() for a in (k, v)]
    code, out, err = _run(capsys, "run", "--no-tui", "--max-new-tokens", "2", "--trace-level", "off", *args)
    assert code in (0, 2), (args, err)
    assert "Traceback" not in err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, (args, err)


def test_console_script_reports_errors_without_traceback():
    p = subprocess.run([sys.executable, "-m", "spectrace.cli", "run", "--num-steps", "0"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.strip() == "spectrace: error: --num-steps must be at least 1, got 0"


def test_every_command_on_a_missing_gpu_says_so_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without a GPU, wherever this runs
    for command in (["run", "--no-tui", "--device", "cuda"], ["bench", "kernels", "--device", "cuda"],
                    ["bench", "--device", "cuda", "--algos", "none"]):
        code, out, err = _run(capsys, *command)
        assert code == 2 and err.strip().splitlines() == ["spectrace: error: --device cuda asked for, but torch sees no GPU"]


def test_running_out_of_device_memory_is_one_line_and_keeps_the_finished_steps(capsys, monkeypatch, tmp_path):
    """torch's out-of-memory error at the third step: one line, exit 2, and the trace opens with
    the two steps before it."""
    from spectrace.core.engine import Engine
    from spectrace.core.trace_reader import read_trace

    step, calls = Engine.speculative_step, []

    def third_runs_out(self, reqs):
        calls.append(1)
        if len(calls) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB.")
        return step(self, reqs)
    monkeypatch.setattr(Engine, "speculative_step", third_runs_out)
    trace = tmp_path / "t.jsonl"
    code, out, err = _run(capsys, "run", "--no-tui", "--algo", "eagle", "--max-new-tokens", "16", "--trace", str(trace))
    assert code == 2 and err.strip().splitlines() == ["spectrace: error: CUDA out of memory. Tried to allocate 20.00 MiB."]
    assert sorted({r["step"] for r in read_trace(trace).steps}) == [0, 1]


def test_a_reader_that_went_away_ends_the_run_as_a_unix_filter_ends(tmp_path):
    """`spectrace run --no-tui | head`: once the reader is gone, exit 141 (128 + SIGPIPE), no traceback."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    done = subprocess.run([sys.executable, "-m", "spectrace", "run", "--no-tui", "--max-new-tokens", "4",
                           "--trace", str(tmp_path / "t.jsonl")], stdout=write_end, stderr=subprocess.PIPE, text=True)
    os.close(write_end)
    assert done.returncode == 141 and "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr


def test_triton_backend_on_cpu_without_the_interpreter_says_how(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for command in (["run", "--no-tui", "--backend", "triton"], ["bench", "kernels"]):
        code, out, err = _run(capsys, *command)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "set TRITON_INTERPRET=1" in err


def test_python_m_spectrace_and_version_with_a_bare_environment(tmp_path):
    """Called by path with PATH=/usr/bin:/bin and the venv not activated (an IDE, cron, pipx): the
    renderer installed beside this interpreter is found, and `python -m spectrace` works."""
    import os
    from pathlib import Path

    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    trace = Path(__file__).with_name("data") / "walkthrough.jsonl"
    version = subprocess.run([sys.executable, "-m", "spectrace", "--version"], env=env, capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("spectrace ")
    render = subprocess.run([sys.executable, "-m", "spectrace", "render", str(trace), "--step", "1", "-o",
                             str(tmp_path / "t.svg")], env=env, capture_output=True, text=True)
    assert render.returncode == 0, render.stderr
    assert (tmp_path / "t.svg").read_text().lstrip().startswith("<?xml")


def test_a_trace_that_stops_fitting_ends_at_its_last_whole_step(tmp_path):
    """A disk that fills mid-run (here a file-size limit, which fails the write as a full disk
    does): one line naming the cause, exit 2, and a trace readable up to its last whole record."""
    import resource
    import signal

    limit = 40_000

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    trace = tmp_path / "t.jsonl"
    done = subprocess.run([sys.executable, "-m", "spectrace", "run", "--algo", "eagle", "--topk", "4", "--no-tui",
                           "--max-new-tokens", "64", "--trace", str(trace)], capture_output=True, text=True,
                          preexec_fn=small_disk)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [f"spectrace: error: cannot write trace {trace}: File too large"]
    assert 0 < trace.stat().st_size <= limit and trace.read_bytes().endswith(b"\n")
    assert len(read_trace(trace).steps) >= 1


def test_a_run_killed_mid_way_leaves_a_trace_that_opens_up_to_its_last_whole_step(tmp_path):
    """SIGKILL: no handler runs, nothing is flushed or closed. Every record was written whole
    and flushed as its step finished, so replay's reader, the walkthrough and render open the
    trace up to the last whole step (a torn last line is a notice, not an error)."""
    import asyncio

    from spectrace.core.trace_reader import TraceFile
    from spectrace.testing import killed_once_written
    from spectrace.viz.tui.app import Walkthrough

    trace = tmp_path / "t.jsonl"
    # a step's four records are about 30 KB (the writer's buffer may spill part of one before its
    # step's flush): past 100 KB, a few steps are whole
    killed_once_written(["run", "--algo", "eagle", "--topk", "4", "--no-tui", "--batch", "4",
                         "--max-new-tokens", "400", "--trace", str(trace)], trace, 100_000)
    steps = TraceFile(trace)
    last = steps.index[-1]
    assert len(steps) >= 4
    assert main(["render", str(trace), "--step", str(last.step), "--request", str(last.request),
                 "-o", str(tmp_path / "t.dot")]) == 0
    assert (tmp_path / "t.dot").read_text().startswith("digraph")

    async def last_step():
        async with Walkthrough(steps).run_test(size=(100, 30)) as pilot:
            await pilot.press(*["right"] * (len(steps) + 5))
            await pilot.pause()
            return pilot.app.position
    assert asyncio.run(last_step()) == len([m for m in steps.index if m.request == steps.index[0].request]) - 1


@pytest.mark.parametrize("when", ["loading", "generating"])
def test_ctrl_c_says_where_the_finished_steps_are_only_when_there_are_some(capsys, monkeypatch, tmp_path, when):
    import spectrace.loading.models
    from spectrace.core.engine import Engine

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(*((spectrace.loading.models, "load_model") if when == "loading" else (Engine, "generate")), interrupt)
    trace = tmp_path / "t.jsonl"
    code, _, err = _run(capsys, "run", "--algo", "eagle", "--no-tui", "--trace", str(trace))
    assert code == 130 and len(err.strip().splitlines()) == 1
    if when == "loading":  # no trace was begun: none is left, and none is promised
        assert err.strip() == "spectrace: interrupted" and not trace.exists()
    else:
        assert err.strip() == f"spectrace: interrupted; {trace} holds every step finished so far"
        assert read_trace(trace).header["config"]["algo"] == "eagle"


def test_replay_with_stderr_redirected_refuses_instead_of_drawing_into_the_file(monkeypatch):
    """Textual draws through stderr: `spectrace replay T 2>err.log` drew the whole UI into err.log
    and left the terminal blank."""
    import io
    from pathlib import Path

    from spectrace.errors import SpectraceError
    from spectrace.viz.tui.app import replay

    class Stream(io.StringIO):
        def __init__(self, tty):
            super().__init__()
            self.tty = tty

        def isatty(self):
            return self.tty

    monkeypatch.setattr(sys, "stdin", Stream(True))
    monkeypatch.setattr(sys, "stdout", Stream(True))
    monkeypatch.setattr(sys, "stderr", Stream(False))
    with pytest.raises(SpectraceError, match="stdin, stdout and stderr"):
        replay(TraceFile(Path(__file__).with_name("data") / "walkthrough.jsonl"))


def test_render_to_a_path_without_a_file_name_is_one_line(capsys):
    from pathlib import Path

    trace = str(Path(__file__).parent / "data" / "walkthrough.jsonl")
    for which in (["--all"], ["--step", "2"]):
        code, _, err = _run(capsys, "render", trace, *which, "-o", "")
        assert code == 2 and err.strip().splitlines() == ["spectrace: error: -o '' names no file (e.g. -o tree.svg)"]


@pytest.mark.parametrize("argv", [["run", "--max-new-tokens", "0"], ["run", "--topk", "0"], ["run", "--batch", "0"],
                                  ["run", "--temperature", "nan"], ["bench", "--top-p", "0"],
                                  ["bench", "--algos", "none", "eagle", "--num-steps", "0"]])
def test_a_number_out_of_range_is_refused_before_torch_loads(argv):
    """core/ranges.py's table, checked by the CLI first: the error comes at once, torch never loaded."""
    code = f"import sys; from spectrace.cli import main; rc = main({argv!r}); print(rc, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["2", "False"], done.stderr
    assert done.stderr.startswith("spectrace: error: --") and len(done.stderr.splitlines()) == 1

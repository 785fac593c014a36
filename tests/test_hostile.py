"""What a new user trips over, by kind: an abbreviated flag, an option the run would not read, a
hostile checkpoint, a hostile trace or file, a run stopped or starved of disk. Each ends in one
line on stderr and exit code 2 (or does what the docs say), loses nothing, and hangs nowhere: a
reader that would block (a FIFO) trips a 10 s alarm, which fails the test."""
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from spectrace.cli import NGRAM_STYLE_OPTIONS, build_parser, main
from spectrace.core.trace import TraceWriter, frames_path
from spectrace.core.trace_reader import TraceFile
from spectrace.traces import open_trace
from spectrace.zoo import TARGET_DIR

WALKTHROUGH = Path(__file__).with_name("data") / "walkthrough.jsonl"
LINES = WALKTHROUGH.read_text(encoding="utf-8").splitlines()
REPO = Path(__file__).resolve().parents[1]


class Hung(BaseException):
    """Raised by the alarm: a BaseException, so no `except OSError` in the code under test eats it."""


@pytest.fixture
def within_10_s():
    def hung(signum, frame):
        raise Hung("blocked for 10 s")
    saved = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, saved)


def one_line_exit_2(capsys, argv: list[str], message: str = "") -> str:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert message in err, err
    return err


def long_options():
    """(command, option) for every long option of every subcommand."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for command, parser in sub.choices.items():
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    yield command, parser, flag


REQUIRED = {"replay": ["T"], "render": ["T", "-o", "x"], "report": ["T", "-o", "x"], "export": ["T", "-o", "x"],
            "rejudge": ["T", "--acceptance", "greedy", "-o", "x"], "tune": ["-o", "x"]}


def test_no_option_is_read_from_a_prefix_of_its_name():
    """argparse would take `--speculative-alg` for --speculative-algorithm (and so slip past the
    check that both spellings agree): every proper prefix of every long option of every command,
    unless it is an option itself, is left unread, which the command then refuses."""
    seen = 0
    for command, parser, flag in long_options():
        names = {f for a in parser._actions for f in a.option_strings}
        for cut in range(3, len(flag)):
            prefix = flag[:cut]
            if prefix not in names:
                _, unread = parser.parse_known_args(REQUIRED.get(command, []) + [f"{prefix}=1"])
                assert unread == [f"{prefix}=1"], (command, prefix)
                seen += 1
    assert seen > 1000


@pytest.mark.parametrize("argv", [["run", "--alg", "eagle"], ["run", "--speculative-alg", "NGRAM"],
                                  ["run", "--algo", "medusa", "--medusa", "[[0]]"], ["bench", "--batch=4"],
                                  ["tune", "--target-mod", "x", "-o", "p.json"], ["run", "--num-draft", "4"]])
def test_an_abbreviated_option_is_one_line(capsys, argv):
    one_line_exit_2(capsys, argv + ["--no-tui"] * (argv[0] == "run"), "unrecognized arguments")


OTHER_STYLE = [(style, flag) for style in NGRAM_STYLE_OPTIONS for other, flags in NGRAM_STYLE_OPTIONS.items()
               if other != style for flag in sorted(flags)]
VALUES = {"--speculative-ngram-match-type": "BFS", "--ngram-match": "longest"}


@pytest.mark.parametrize("style, flag", OTHER_STYLE)
def test_an_ngram_option_of_the_other_style_is_refused(capsys, style, flag):
    one_line_exit_2(capsys, ["run", "--algo", "ngram", "--ngram-style", style, flag, VALUES.get(flag, "2"),
                             "--no-tui"], f"{flag} shapes the other n-gram drafter")


@pytest.mark.parametrize("option", [["--num-steps", "3"], ["--speculative-num-steps", "3"], ["--topk", "2"],
                                    ["--speculative-eagle-topk", "2"], ["--num-draft-tokens", "4"],
                                    ["--speculative-adaptive"], ["--acceptance", "greedy"],
                                    ["--speculative-accept-threshold-single", "0.5"]])
def test_a_drafting_option_without_drafts_is_refused(capsys, option):
    one_line_exit_2(capsys, ["run", "--algo", "none", *option, "--no-tui"],
                    f"{option[0]} shapes or judges the drafts; --algo none drafts nothing")


@pytest.mark.parametrize("option", [["--top-p", "0.9"], ["--top-k", "20"], ["--top-p=0.5", "--top-k=3"]])
def test_a_sampling_option_of_a_greedy_run_is_refused(capsys, option):
    one_line_exit_2(capsys, ["run", "--algo", "eagle", *option, "--no-tui"], "at --temperature 0 decoding is greedy")


@pytest.mark.parametrize("option", [["--algos", "eagle"], ["--batch-sizes", "4"], ["--repeat", "3"],
                                    ["--target-shape", "llama-3.1-8b"], ["--backend", "fast"], ["--trace-level", "full"],
                                    ["--max-new-tokens", "8"], ["--compare-hf"], ["--prompts", "p.txt"]])
def test_bench_kernels_refuses_what_it_would_not_read(capsys, option):
    one_line_exit_2(capsys, ["bench", "kernels", *option], f"bench kernels reads only --device, not {option[0]}")


@pytest.mark.parametrize("policy, message", [
    ('{"1": [3, 1, 4], "1": [2, 1, 3]}', "batch size 1 is given twice"),
    ('{"01": [3, 1, 4], "1": [2, 1, 3]}', "batch size 1 is given twice"),
    ('{"\u0661": [3, 1, 4]}', "is not a batch size"),  # an Arabic-Indic one: int() would read it
    ('{"+1": [3, 1, 4]}', "is not a batch size"),
    ('{" 1": [3, 1, 4]}', "is not a batch size"),
    ('{"1e3": [3, 1, 4]}', "is not a batch size"),
    ('{"1": [true, 1, 2]}', "needs [num_steps, topk, num_draft_tokens]"),
    ('{"1": [3.0, 1, 4]}', "needs [num_steps, topk, num_draft_tokens]"),
    ('{"1": [1e400, 1, 2]}', "needs [num_steps, topk, num_draft_tokens]"),
    ('{"1": [3, 1, 4]} {}', "Extra data"),
])
def test_a_batch_policy_that_would_be_read_loosely_is_refused(capsys, policy, message):
    one_line_exit_2(capsys, ["run", "--algo", "eagle", "--batch-policy", policy, "--no-tui"], message)


# --- checkpoints: the embedded target with one thing changed ------------------------------------

Q = "model.layers.0.self_attn.q_proj.weight"


def _weights(edit):
    def make(d):
        w = load_file(d / "model.safetensors")
        edit(w)
        save_file(w, d / "model.safetensors")
    return make


def _config(**fields):
    def make(d):
        c = json.loads((d / "config.json").read_text())
        c.update(fields)
        (d / "config.json").write_text(json.dumps(c))
    return make


def _write(name, data):
    return lambda d: (d / name).write_bytes(data) if isinstance(data, bytes) else (d / name).write_text(data)


def _replace(name, make):
    def edit(d):
        (d / name).unlink()
        make(d / name)
    return edit


def _index(weight_map):
    def edit(d):
        (d / "model.safetensors").rename(d / "model-00001-of-00001.safetensors")
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return edit


_LYING = json.dumps({"a": {"dtype": "F32", "shape": [2 ** 40], "data_offsets": [0, 2 ** 42]}}).encode()
CHECKPOINTS = {
    "int8": (_weights(lambda w: w.__setitem__(Q, w[Q].to(torch.int8))), "is stored as int8"),
    "bool": (_weights(lambda w: w.__setitem__(Q, w[Q] > 0)), "is stored as bool"),
    "nan": (_weights(lambda w: w[Q].__setitem__((0, 0), float("nan"))), "holds NaN or infinite values"),
    "inf": (_weights(lambda w: w[Q].__setitem__((3, 5), float("inf"))), "holds NaN or infinite values"),
    "a tensor missing": (_weights(lambda w: w.pop(Q)), "missing ['model.layers.0.self_attn.q_proj.weight']"),
    "a tensor extra": (_weights(lambda w: w.__setitem__("model.layers.99.x.weight", torch.zeros(3))), "unexpected"),
    "a shape wrong": (_weights(lambda w: w.__setitem__(Q, torch.zeros(3, 3))), "is (3, 3), the config makes it"),
    "pickle": (lambda d: (d / "model.safetensors").unlink() or torch.save({"x": Hung}, d / "pytorch_model.bin"),
               "is not a plain state dict of tensors"),
    "truncated": (lambda d: (d / "model.safetensors").write_bytes((TARGET_DIR / "model.safetensors").read_bytes()[
        :100_000]), "cannot load model"),
    "header of 2**62 bytes": (_write("model.safetensors", struct.pack("<Q", 2 ** 62) + b"{}"), "header too large"),
    "header lying about sizes": (_write("model.safetensors", struct.pack("<Q", len(_LYING)) + _LYING + bytes(16)),
                                 "cannot load model"),
    "header not JSON": (_write("model.safetensors", struct.pack("<Q", 5) + b"xxxxx"), "cannot load model"),
    "weights empty": (_write("model.safetensors", b""), "cannot load model"),
    "weights a FIFO": (_replace("model.safetensors", os.mkfifo), "model.safetensors is not a regular file"),
    "weights a directory": (_replace("model.safetensors", Path.mkdir), "model.safetensors is not a regular file"),
    "index outside": (_index({Q: "../../etc/passwd"}), "must name files in its own directory"),
    "index shard missing": (_index({Q: "model-00001-of-00002.safetensors"}), "No such file"),
    "index not JSON": (lambda d: _index({})(d) or (d / "model.safetensors.index.json").write_text("{"),
                       "cannot load model"),
    "config not JSON": (_write("config.json", "{"), "config.json: Expecting property name"),
    "config a list": (_write("config.json", "[]"), "config.json is not a JSON object"),
    "hidden_size a string": (_config(hidden_size="256"), "hidden_size must be a positive integer, got '256'"),
    "layers negative": (_config(num_hidden_layers=-1), "num_hidden_layers must be a positive integer"),
    "layers 10**9": (_config(num_hidden_layers=10 ** 9), "the config makes at least 737,280,001,048,576 parameters"),
    "hidden 10**6": (_config(hidden_size=10 ** 6, head_dim=None), "the config makes at least"),
    "vocabulary 0": (_config(vocab_size=0), "vocab_size must be a positive integer, got 0"),
    "heads over KV heads": (_config(num_key_value_heads=3), "8 is not a multiple of num_key_value_heads 3"),
    "head_dim a string": (_config(head_dim="32"), "head_dim must be a positive integer"),
    "rope theta negative": (_config(rope_parameters={"rope_type": "default", "rope_theta": -1.0}),
                            "rope_theta must be a finite number > 0"),
    "rope theta a string": (_config(rope_parameters={"rope_type": "default", "rope_theta": "1e4"}),
                            "rope_theta must be a finite number > 0"),
    "llama3 factor NaN": (_config(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4, "factor": float("nan"),
                                                   "low_freq_factor": 1, "high_freq_factor": 4}), "factor must be"),
    "eps NaN": (_config(rms_norm_eps=float("nan")), "rms_norm_eps must be a finite number > 0"),
    "context 0": (_config(max_position_embeddings=0), "max_position_embeddings must be a positive integer"),
    "activation gelu": (_config(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
    "model type gpt2": (_config(model_type="gpt2"), "model_type 'gpt2' is not supported"),
    "tokenizer not JSON": (_write("tokenizer.json", "{oops"), "no usable tokenizer"),
    "generation config not JSON": (_write("generation_config.json", "{"), "generation_config.json: not a JSON object"),
    "generation config eos a string": (_write("generation_config.json", '{"eos_token_id": "2"}'),
                                       "eos_token_id must be a token id"),
}


@pytest.mark.parametrize("case", sorted(CHECKPOINTS))
def test_a_hostile_checkpoint_is_one_line(capsys, tmp_path, within_10_s, case):
    edit, message = CHECKPOINTS[case]
    d = tmp_path / "model"
    shutil.copytree(TARGET_DIR, d)
    edit(d)
    one_line_exit_2(capsys, ["run", "--target-model", str(d), "--no-tui", "--max-new-tokens", "2",
                             "--trace-level", "off"], message)


# --- traces: the committed walkthrough trace with one thing changed -----------------------------

def _header(**fields):
    h = json.loads(LINES[0])
    h.update(fields)
    return "\n".join([json.dumps(h), *LINES[1:]]) + "\n"


def _step(edit, line=3):
    rec = json.loads(LINES[line])
    edit(rec)
    return "\n".join(LINES[:line] + [json.dumps(rec)] + LINES[line + 1:]) + "\n"


def _draft(**fields):
    return _step(lambda r: r["draft"].update(fields))


TEXT = "\n".join(LINES) + "\n"
TRACES = {
    "config a list": (_header(config=[1, 2]), "its header's config is not an object"),
    "config a string": (_header(config="eagle"), "its header's config is not an object"),
    "models a list": (_header(models=[]), "its header's models is not an object"),
    "tokens a list": (_header(tokens=["a"]), "its header's tokens is not an object"),
    "a token of 3 MB": (_header(tokens={"5": "x" * 3_000_000}), "a token's text of 3,000,000 characters"),
    "another schema": (_header(schema="spectrace.trace/99"), "spectrace.trace/99 is not readable"),
    "no header": ("\n".join(LINES[1:]) + "\n", "no spectrace.trace header"),
    "two headers": (LINES[0] + "\n" + TEXT, "unknown record kind 'header'"),
    "depth 10**30": (_draft(depths=[10 ** 30] * 7), "is not its parent's + 1"),
    "depth -1": (_draft(depths=[-1] * 7), "is not its parent's + 1"),
    "parent 10**18": (_draft(parents=[10 ** 18] * 7), "is not an earlier node"),
    "accept_len 10**12": (_step(lambda r: r.update(accept_len=10 ** 12)), "accept_len != len(correct_drafts) + 1"),
    "accept tokens not the drafts": (_step(lambda r: r.update(accept_tokens=[-5])), "accept_tokens != correct_drafts"),
    "draft a list": (_step(lambda r: r.update(draft=[1])), "step field 'draft' has the wrong type"),
    "kv a string": (_step(lambda r: r.update(kv="x")), "step field 'kv' has the wrong type"),
    "request -1": (_step(lambda r: r.update(request=-1)), "not a step record"),
    "nested 10**5 deep": ("\n".join([LINES[0], "[" * 100_000 + "]" * 100_000, *LINES[1:]]) + "\n", "nested too deeply"),
    "a line of 50 MB": (LINES[0] + '\n{"kind": "step", "x": "' + "y" * 50_000_000 + '"}\n', "not a step record"),
    "a byte-order mark": ("\ufeff" + TEXT, "line 1 is not a JSON header"),
    "not UTF-8": (TEXT.encode()[:5000] + b"\xff\xfe" + TEXT.encode()[5000:], "not UTF-8 text"),
    "empty": ("", "is empty"),
    "blank lines": ("\n\n\n", "is empty"),
    "a JSON array": ("[1, 2, 3]\n", "line 1 is not a JSON header"),
    "a PNG": (b"\x89PNG\r\n\x1a\n" + bytes(100), "not a spectrace trace"),
}
READERS = {
    "render": lambda t, out: ["render", t, "--step", "0", "-o", str(out / "t.svg")],
    "export": lambda t, out: ["export", t, "--format", "csv", "-o", str(out / "t.csv")],
    "report": lambda t, out: ["report", t, "-o", str(out / "t.html")],
    "rejudge": lambda t, out: ["rejudge", t, "--acceptance", "greedy", "-o", str(out / "t.jsonl")],
}


@pytest.mark.parametrize("case", sorted(TRACES))
def test_a_hostile_trace_is_one_line_in_every_reader(capsys, tmp_path, within_10_s, case):
    content, message = TRACES[case]
    trace = tmp_path / "hostile.jsonl"
    trace.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    for reader, argv in READERS.items():
        one_line_exit_2(capsys, argv(str(trace), tmp_path), message)
        assert not any(f.name.startswith("t.") for f in tmp_path.iterdir()), reader  # no half-written output


@pytest.mark.parametrize("content", [TEXT.replace("\n", "\r\n"),  # a trace an editor saved with CRLF line ends
                                     TEXT.replace('"prompt_len": 24', '"prompt_len": NaN')])  # a bare NaN
def test_a_trace_json_reads_loosely_opens_in_every_reader(capsys, tmp_path, content):
    trace = tmp_path / "t.jsonl"
    trace.write_text(content, encoding="utf-8")
    for reader, written in (("render", "t.svg"), ("export", "t.csv"), ("report", "t.html")):
        assert main(READERS[reader](str(trace), tmp_path)) == 0, capsys.readouterr().err
        assert (tmp_path / written).stat().st_size > 0


# --- files that are not files: FIFOs and devices ------------------------------------------------

@pytest.fixture(scope="module")
def probs_trace(tmp_path_factory):
    """A --record-probs trace: rejudge can read it."""
    d = tmp_path_factory.mktemp("probs")
    assert main(["run", "--algo", "eagle", "--topk", "1", "--max-new-tokens", "8", "--no-tui", "--trace",
                 str(d / "t.jsonl"), "--record-probs"]) == 0
    return d / "t.jsonl"


def test_a_fifo_or_a_device_is_refused_wherever_a_file_goes(capsys, tmp_path, within_10_s, probs_trace):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero", "/dev/urandom"):
        for reader, argv in READERS.items():
            one_line_exit_2(capsys, argv(path, tmp_path), "is not a regular file")
    rejudge = ["rejudge", str(probs_trace), "--acceptance", "tree_rejection", "--temperature", "1"]
    one_line_exit_2(capsys, rejudge + ["-o", str(fifo)], "it is a FIFO, and a trace is a file")
    one_line_exit_2(capsys, ["run", "--no-tui", "--max-new-tokens", "2", "--trace", str(fifo)], "it is a FIFO")
    one_line_exit_2(capsys, rejudge + ["-o", "/dev/full"], "No space left on device")
    fast = tmp_path / "fast.jsonl"
    os.mkfifo(frames_path(fast))  # where a fast run keeps its steps: refused, never opened for writing
    one_line_exit_2(capsys, ["run", "--backend", "fast", "--algo", "none", "--no-tui", "--max-new-tokens", "2",
                             "--trace", str(fast)], "a trace's frames are one")
    fast.write_text((Path(__file__).with_name("data") / "walkthrough.jsonl").read_text())
    assert any("frames is not a regular file" in n for n in open_trace(fast).notices)  # read around, not read
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(probs_trace, copy / "t.jsonl")
    os.mkfifo(copy / sidecar_name(probs_trace))  # the probabilities file a FIFO: refused, not read
    one_line_exit_2(capsys, [*rejudge[:1], str(copy / "t.jsonl"), *rejudge[2:], "-o", str(tmp_path / "r.jsonl")],
                    "which is not beside it")


def sidecar_name(trace: Path) -> str:
    return json.loads(trace.read_text().splitlines()[0])["probs"]["file"]


@pytest.mark.parametrize("damage", ["cut", "NaN", "another run's"])
def test_a_damaged_probabilities_file_is_refused_by_its_hash(capsys, tmp_path, probs_trace, damage):
    d = tmp_path / "t"
    d.mkdir()
    shutil.copy(probs_trace, d / "t.jsonl")
    sidecar, original = d / sidecar_name(probs_trace), probs_trace.with_name(sidecar_name(probs_trace))
    tensors = load_file(original)
    if damage == "cut":
        sidecar.write_bytes(original.read_bytes()[:1000])
    else:
        name = sorted(tensors)[0]
        tensors[name] = torch.full_like(tensors[name], float("nan")) if damage == "NaN" else tensors[name].flip(0)
        save_file(tensors, sidecar)
    one_line_exit_2(capsys, ["rejudge", str(d / "t.jsonl"), "--acceptance", "tree_rejection", "--temperature", "1",
                             "-o", str(tmp_path / "r.jsonl")], "sha256 differs")


# --- runs that are stopped, doubled or starved of disk ------------------------------------------

def test_a_second_run_writing_the_same_trace_is_refused_and_the_first_is_kept(capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    first = TraceWriter(trace, str)
    first.write({"kind": "header", "schema": "spectrace.trace/1"})
    one_line_exit_2(capsys, ["run", "--no-tui", "--max-new-tokens", "2", "--trace", str(trace)],
                    "another run is writing it")
    first.close()
    assert json.loads(trace.read_text().splitlines()[0])["schema"] == "spectrace.trace/1"
    assert main(["run", "--no-tui", "--max-new-tokens", "2", "--trace", str(trace)]) == 0  # free once it closes


def _spectrace(*argv, limit_bytes=None, **kw):
    def limit():
        if limit_bytes is not None:  # a disk that fills at limit_bytes: writes past it fail with EFBIG
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return subprocess.Popen([sys.executable, *argv], cwd=REPO, preexec_fn=limit, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_keeps_the_steps_and_the_probabilities_and_rejudge_reads_them(capsys, tmp_path, stop):
    trace = tmp_path / "t.jsonl"
    run = _spectrace("-m", "spectrace", "run", "--algo", "eagle", "--topk", "1", "--batch", "8",
                     "--max-new-tokens", "200", "--no-tui", "--trace", str(trace), "--record-probs")
    deadline = time.time() + 60
    while time.time() < deadline and (not trace.exists() or trace.read_text().count('"kind": "step"') < 3):
        time.sleep(0.05)
    run.send_signal(stop)
    _, err = run.communicate(timeout=30)
    assert run.returncode != 0 and "Traceback" not in err, err
    steps = len(TraceFile(trace))
    assert steps >= 3
    assert main(["rejudge", str(trace), "--acceptance", "tree_rejection", "--temperature", "1",
                 "-o", str(tmp_path / "r.jsonl")]) == 0, capsys.readouterr().err
    assert len(TraceFile(tmp_path / "r.jsonl")) == steps


@pytest.mark.parametrize("argv, env", [
    (["-m", "spectrace", "run", "--algo", "eagle", "--topk", "1", "--max-new-tokens", "16", "--no-tui", "--trace",
      "{d}/t.jsonl", "--record-probs"], {}),
    (["lessons/02_one_step_anatomy.py"], {"SPECTRACE_LESSON_OUT": "{d}/lessons"}),
])
def test_a_full_disk_is_one_line(tmp_path, argv, env):
    """RLIMIT_FSIZE stands in for a disk that fills at 20 kB: the run (its trace fits, its
    probabilities do not) or the lesson says so in a line, exit 2, and keeps what fitted."""
    argv = [a.format(d=tmp_path) for a in argv]
    run = _spectrace(*argv, limit_bytes=20_000, env={**os.environ, **{k: v.format(d=tmp_path) for k, v in env.items()}})
    _, err = run.communicate(timeout=120)
    assert run.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert "File too large" in err and "Traceback" not in err
    if "--record-probs" in argv:
        assert len(TraceFile(tmp_path / "t.jsonl")) > 0 and not list(tmp_path.glob("*.safetensors"))


@pytest.mark.parametrize("argv, message", [
    (["report", "{t}", "-o", "{t}"], "would overwrite the trace"),
    (["export", "{t}", "--format", "csv", "-o", "{t}"], "would overwrite the trace"),
    (["export", "{t}", "--format", "perfetto", "-o", "{d}/./t.jsonl"], "would overwrite the trace"),
    (["report", "{t}", "-o", "{d}/t.probs.safetensors"], "would overwrite a file the trace"),
    (["rejudge", "{t}", "--acceptance", "greedy", "-o", "{t}"], "would overwrite the trace"),
    (["rejudge", "{t}", "--acceptance", "greedy", "-o", "{t}.frames"], "would overwrite a file the trace"),
    (["run", "--no-tui", "--max-new-tokens", "2", "--trace", "{t}", "--report", "{t}"], "would overwrite the trace"),
    (["run", "--no-tui", "--max-new-tokens", "2", "--trace", "{t}", "--record-probs", "--report",
      "{d}/t.probs.safetensors"], "would overwrite a file the trace"),
])
def test_an_output_onto_the_trace_or_its_files_is_refused_and_they_are_kept(capsys, tmp_path, probs_trace, argv,
                                                                            message):
    """A page, an export or a re-judged trace written over the trace it reads (or its
    probabilities, its frames) would lose them: refused, every file kept byte for byte."""
    shutil.copy(probs_trace, tmp_path / "t.jsonl")
    shutil.copy(probs_trace.with_name(sidecar_name(probs_trace)), tmp_path / "t.probs.safetensors")
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    one_line_exit_2(capsys, [a.format(t=tmp_path / "t.jsonl", d=tmp_path) for a in argv], message)
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == before

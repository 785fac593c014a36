"""Trace v1: round trip, torn last line, clear errors."""
import json

import pytest

from spectrace.run import RunConfig, run
from spectrace.core.trace import SCHEMA, TraceError
from spectrace.core.trace_reader import read_trace


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "run.jsonl"
    return run(RunConfig(algo="eagle", batch=3, max_new_tokens=12, trace=str(path)))


def test_round_trip(traced_run):
    t = read_trace(traced_run.trace_path)
    assert t.header["schema"] == SCHEMA and not t.notices
    assert t.summary["metrics"]["completion_tokens"] == traced_run.metrics["completion_tokens"]
    for rq in t.summary["requests"]:
        r = traced_run.requests[rq["request"]]
        assert rq["output_ids"] == r.output_ids and rq["prompt_ids"] == r.prompt_ids
        # one step record per decode step per request, and their tokens rebuild the output
        steps = [s for s in t.steps if s["request"] == r.req_pool_idx]
        assert len(steps) == traced_run.metrics["per_request"][r.req_pool_idx]["spec_verify_ct"]
        rebuilt = [p["first_token"] for p in t.prefills if p["request"] == r.req_pool_idx]
        rebuilt += [tok for s in steps for tok in s["committed_tokens"]]
        assert rebuilt == r.output_ids
        # a viewer decodes every token from the trace alone
        assert "".join(t.token_text(i) for i in r.output_ids) == rq["output_text"]
    assert t.header["config"]["num_draft_tokens"] == 8 and t.header["config"]["resolved_algorithm"] == "EAGLE"
    for s in t.steps:
        assert s["accept_len"] == len(s["correct_drafts"]) + 1
        d = s["draft"]
        assert len(s["verify"]["target_topk"]) == len(d["tokens"]) + 1 == 8
        # the accepted path is made of the correct nodes, each the child of the one before
        path = s["accept"]["accept_nodes"]
        assert [d["tokens"][j - 1] for j in path[1:]] == s["correct_drafts"]
        assert all(d["parents"][b - 1] == a for a, b in zip(path, path[1:]))
        assert sorted(j for j, f in enumerate(d["fates"], 1) if f == "correct") == sorted(path[1:])
        assert s["bonus_token"] == s["verify"]["target_predict"][path[-1]]
        assert set(s["timing"]) >= {"draft", "verify", "accept", "commit"}


def test_torn_last_line_is_skipped_with_a_notice(traced_run, tmp_path):
    raw = traced_run.trace_path.read_bytes()
    lines = raw.split(b"\n")
    cut = tmp_path / "torn.jsonl"
    cut.write_bytes(b"\n".join(lines[:6]) + b"\n" + lines[6][: len(lines[6]) // 2])  # killed mid-write
    t = read_trace(cut)
    assert len(t.prefills) + len(t.steps) == 5
    assert any("torn" in n for n in t.notices) and any("did not finish" in n for n in t.notices)


@pytest.mark.parametrize("content, message", [
    (None, "no trace file"),
    (b"", "empty"),
    (b"\x89PNG\r\n\x1a\n", "not a spectrace trace"),
    (b'{"kind": "header", "schema": "other/1"}\n', "not a spectrace trace"),
    (b'{"kind": "header", "schema": "spectrace.trace/2"}\n', "spectrace.trace/2 is not readable"),
    (b'{"kind": "header", "schema": "spectrace.trace/1"}\n{oops\n{"kind": "summary"}\n', "corrupted at line 2"),
])
def test_bad_traces_give_one_clear_error(tmp_path, content, message):
    path = tmp_path / "t.jsonl"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_step_records_are_validated(traced_run, tmp_path):
    lines = traced_run.trace_path.read_text().splitlines()
    i = next(k for k, l in enumerate(lines) if json.loads(l)["kind"] == "step")
    rec = json.loads(lines[i])
    rec["accept_len"] += 1
    lines[i] = json.dumps(rec)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=f"line {i + 1}: accept_len"):
        read_trace(bad)


@pytest.mark.parametrize("edit, message", [
    # a key twice: json keeps the last one silently, so the record would not say what it seems to
    (lambda line: line.replace('"accept_len": ', '"accept_len": 1, "accept_len": ', 1), "duplicate key 'accept_len'"),
    # nesting deeper than the parser recurses: refused by line, not a RecursionError
    (lambda line: line.replace('"accept_tokens": ', '"accept_tokens": ' + "[" * 10_000 + "]" * 10_000 + ', "x": ',
                               1), "nested too deeply"),
])
def test_records_that_json_reads_loosely_are_refused_by_line(traced_run, tmp_path, capsys, edit, message):
    from spectrace.cli import main

    lines = traced_run.trace_path.read_text().splitlines()
    i = next(k for k, line in enumerate(lines) if json.loads(line)["kind"] == "step")
    lines[i] = edit(lines[i])
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=f"line {i + 1} \\({message}\\)"):
        read_trace(bad)
    assert main(["render", str(bad), "--step", "0", "-o", str(tmp_path / "t.svg")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err


def test_numbers_json_cannot_carry_are_written_as_null(tmp_path):
    """NaN and ±inf (a diverged model's q, a failed clock) never reach the file as bare tokens,
    which strict JSON readers (JSON.parse, Perfetto, jq) refuse; every other value is kept."""
    from spectrace.core.trace import TraceWriter

    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in the trace"))

    path = tmp_path / "t.jsonl"
    w = TraceWriter(path, str)
    w.write({"kind": "x", "q": [0.5, float("nan")], "timing": {"draft": float("inf"), "n": (1, -float("inf"))}})
    w.write({"kind": "y", "q": [0.25]})
    w.close()
    first, second = (strict(line) for line in path.read_text().splitlines())
    assert first["q"] == [0.5, None] and first["timing"] == {"draft": None, "n": [1, None]}
    assert second["q"] == [0.25]


def test_a_step_whose_flush_fails_is_cut_back_to_the_last_whole_step(tmp_path):
    """A step's records are written, then flushed at once: a flush that fails (a full disk) cuts
    the file back to the last flush, so no record of the failed step stays behind, whole or torn."""
    import errno

    from spectrace.core.trace import TraceWriter

    writer = TraceWriter(tmp_path / "t.jsonl", str)
    writer.write({"kind": "header"})
    disk = writer._f

    class Full:  # the step's bytes reach the file, then the disk is full
        def write(self, data):
            return disk.write(data)

        def flush(self):
            disk.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            disk.close()

    writer._f = Full()
    writer.write({"kind": "step", "request": 0}, flush=False)
    writer.write({"kind": "step", "request": 1}, flush=False)
    with pytest.raises(TraceError, match="No space left on device"):
        writer.flush()
    assert (tmp_path / "t.jsonl").read_text().splitlines() == ['{"kind": "header", "tokens": {}}']

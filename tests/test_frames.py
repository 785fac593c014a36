"""The fast engine's frames (fast/frames.py): a run keeps each step's tensors in TRACE.frames, and
spectrace's readers build the step records from them, the same records as an explicit run writes
into its lines, up to the last whole frame of a run that was killed."""
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from spectrace.cli import main
from spectrace.core.trace import frames_path
from spectrace.core.trace_reader import TraceFile
from spectrace.traces import open_trace
from spectrace.fast.frames import FrameWriter, Pack, read_frames
from spectrace.run import RunConfig, run


def without_timing(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in ("timing", "tokens")}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 255), max_size=40), min_size=1, max_size=5), st.data())
def test_a_torn_sidecar_reads_up_to_its_last_whole_frame(tmp_path_factory, blobs, data):
    path = tmp_path_factory.mktemp("frames") / "t.jsonl.frames"
    writer = FrameWriter(path)
    for i, blob in enumerate(blobs):
        writer.write({"step": i}, torch.tensor(blob, dtype=torch.uint8))
    writer.close()
    whole = path.read_bytes()
    cut = data.draw(st.integers(0, len(whole)))
    path.write_bytes(whole[:cut])
    frames = list(read_frames(path))
    assert [h["step"] for h, _ in frames] == list(range(len(frames)))  # a prefix, in order
    assert [b.tolist() for _, b in frames] == blobs[:len(frames)]
    assert len(frames) == len(blobs) or cut < len(whole)


def test_a_pack_reads_back_every_tensor_and_none():
    tensors = {"c": torch.tensor([[True, False, True]]), "a": torch.arange(6).view(2, 3), "none": None,
               "b": torch.tensor([0.5, -1.0], dtype=torch.float64), "d": torch.randn(3, 1, 3)[:, :, 1:]}
    pack = Pack(tensors)
    back = Pack(tensors).tensors()
    assert back["none"] is None and pack.host.numel() == sum(t.numel() * t.element_size() for t in tensors.values()
                                                             if t is not None)  # no padding
    for name, t in tensors.items():
        if t is not None:
            assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
    assert json.loads(json.dumps(pack.layout)) == pack.layout  # it travels in a frame's JSON head


@pytest.mark.parametrize("options", [dict(algo="eagle", topk=2, num_steps=3, num_draft_tokens=4), dict(algo="ngram")],
                         ids=["eagle", "ngram"])
def test_a_fast_run_keeps_its_steps_as_frames_that_every_reader_builds(tmp_path, options):
    """A finished fast run: the trace holds header, prefills and summary, TRACE.frames every step.
    spectrace's readers build the records from the frames (the same records as the trace that
    `export --format jsonl` writes, which core's reader opens alone); the summary carries the text
    of every token the records mention; a run killed before its summary (no tokenizer text) reads
    the same steps; a torn last frame costs that step only; a trace of today's older kind, killed
    while it wrote its records into its lines, does not build them twice; render opens the last step."""
    done, whole, killed = tmp_path / "done.jsonl", tmp_path / "whole.jsonl", tmp_path / "killed.jsonl"
    run(RunConfig(backend="fast", batch=2, max_new_tokens=4, trace=str(done), **options))
    assert frames_path(done).is_file() and '"kind": "step"' not in done.read_text()
    bare = TraceFile(done)  # the torch-free reader names the frames it does not build
    assert len(bare) == 0 and "does not build" in bare.notices[0]
    got = open_trace(done)
    assert got.notices == [] and len(got) >= 2
    assert main(["export", str(done), "--format", "jsonl", "-o", str(whole)]) == 0
    want = TraceFile(whole)
    assert want.notices == [] and len(want) == len(got) and want.tokens == got.tokens
    assert [without_timing(got.step(i)) for i in range(len(got))] == \
        [without_timing(want.step(i)) for i in range(len(want))]
    summary_tokens = {int(t) for t in got.summary["tokens"]} | {int(t) for t in got.header["tokens"]} | \
        {int(t) for p in got.prefills for t in p["tokens"]}
    assert all(got.step(i)["tokens"] == {} for i in range(len(got)))  # no record had a token to add
    assert summary_tokens >= {t for i in range(len(want)) for t in map(int, want.step(i)["tokens"])}

    lines = [line for line in done.read_text().splitlines(keepends=True) if '"kind": "summary"' not in line]
    killed.write_text("".join(lines))
    frames_path(killed).write_bytes(frames_path(done).read_bytes())
    again = open_trace(killed)
    assert [without_timing(again.step(i)) for i in range(len(again))] == \
        [without_timing(want.step(i)) for i in range(len(want))]
    assert again.notices == ["the run did not finish: no summary record"]
    last = again.index[-1]
    assert main(["render", str(killed), "--step", str(last.step), "--request", str(last.request),
                 "-o", str(tmp_path / "t.dot")]) == 0

    frames = frames_path(killed).read_bytes()
    last_frame_requests = sum(1 for meta in again.index if meta.step == last.step)
    frames_path(killed).write_bytes(frames[:-3])  # the last frame torn
    assert len(open_trace(killed)) == len(want) - last_frame_requests
    frames_path(killed).write_bytes(frames)

    built = [line for line in whole.read_text().splitlines(keepends=True) if '"kind": "step"' in line]
    killed.write_text("".join(lines[:1 + len(got.prefills)] + built[:2]))  # killed after writing two records
    older = open_trace(killed)
    assert [without_timing(older.step(i)) for i in range(len(older))] == \
        [without_timing(want.step(i)) for i in range(len(want))]


def test_a_trace_that_is_a_device_gets_its_records_as_the_run_goes():
    """--trace /dev/null: no sidecar beside a device (none could be made there); the run finishes."""
    result = run(RunConfig(backend="fast", algo="none", max_new_tokens=2, trace="/dev/null"))
    assert result.requests[0].output_ids and not frames_path("/dev/null").exists()


@pytest.mark.parametrize("heads", [[{"context": {"bogus": 1}}],
                                   [{"context": dict(acceptance="greedy", greedy=True, topk=1, trace_topk=5,
                                                     threshold_single=1.0, threshold_acc=1.0, drafted=False,
                                                     drafts_on_host=False, samples_drafts=False)},
                                    {"step": 0, "requests": [[0, 0, 1, [2], [2], None, None]]}]],
                         ids=["context", "step head"])
def test_a_sidecar_that_is_not_spectraces_is_a_notice(tmp_path, heads):
    """An edited or foreign sidecar: the trace opens with what it holds, and a notice says why
    the frames stop."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(line for line in (Path(__file__).with_name("data") / "walkthrough.jsonl")
                             .read_text().splitlines(keepends=True) if '"kind": "summary"' not in line))
    writer = FrameWriter(frames_path(trace))
    for head in heads:
        writer.write(head)
    writer.close()
    opened = open_trace(trace)
    assert len(opened) == len(TraceFile(trace).index) and any("frames" in n or "readable" in n for n in opened.notices)


def test_a_fast_run_killed_mid_way_reads_up_to_its_last_whole_frame(tmp_path):
    """SIGKILL during the decode loop: no handler runs, nothing is closed. Each frame was written
    whole and flushed as its step finished, so the trace opens with every step up to the last
    whole frame, and each of them builds (export writes them all)."""
    import os

    from spectrace.testing import killed_once_written

    trace = tmp_path / "t.jsonl"
    # a step's frame is under 1 KB here, the first (with its layout) about 2 KB: past 5 KB, a few
    killed_once_written(["run", "--backend", "fast", "--algo", "none", "--no-tui", "--batch", "2",
                         "--max-new-tokens", "400", "--trace", str(trace)], frames_path(trace), 5_000,
                        {**os.environ, "TRITON_INTERPRET": "1"})
    opened = open_trace(trace)
    assert len(opened) >= 2 and "the run did not finish: no summary record" in opened.notices
    assert main(["export", str(trace), "--format", "jsonl", "-o", str(tmp_path / "whole.jsonl")]) == 0
    assert len(TraceFile(tmp_path / "whole.jsonl")) == len(opened)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 40), st.data())
def test_a_frame_keeps_each_rows_last_slots_as_the_record_reads_them(bs, columns, data):
    """step_record.last_slots gathers on the device what a record keeps of req_to_token: a row's
    slots from max(0, len - 16) to len; RecordBuilder.kv_record reads them back."""
    from spectrace.fast.records import RecordBuilder, RecordContext
    from spectrace.fast.step_record import last_slots

    req_to_token = torch.randint(0, 10_000, (bs, columns))
    lens = torch.tensor(data.draw(st.lists(st.integers(0, columns), min_size=bs, max_size=bs)))
    tail = last_slots(req_to_token, lens)
    builder = RecordBuilder(RecordContext("greedy", True, 1, 5, 1.0, 1.0, False, False, False))
    for b in range(bs):
        kv = builder.kv_record(b, {"req_to_token_tail": tail, "seq_lens": lens}, 0)["req_to_token_tail"]
        after = int(lens[b])
        assert kv == {"start": max(0, after - 16), "slots": req_to_token[b, max(0, after - 16):after].tolist()}


def test_frames_go_with_their_own_trace_only(tmp_path):
    """The header's run id is the frames' first head's: frames of another run beside a trace (a
    copy, a rename) are named in a notice and not read; a run writing a trace where an earlier
    fast run's was removes that run's frames."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for trace in (a, b):
        run(RunConfig(backend="fast", algo="none", max_new_tokens=3, trace=str(trace)))
    frames_path(a).write_bytes(frames_path(b).read_bytes())
    opened = open_trace(a)
    assert len(opened) == 0 and any("another run's steps" in n for n in opened.notices)
    run(RunConfig(algo="none", max_new_tokens=3, trace=str(b)))  # the explicit engine: its steps are lines
    assert not frames_path(b).exists() and len(open_trace(b)) == len(TraceFile(b)) > 0


def test_frames_of_the_earlier_layout_build_the_records_that_version_built():
    """tests/data/frames-v0: a fast run of the version whose frame heads listed each request and
    carried every KV row whole (2026-12-07): killed.jsonl is its trace before the records, with
    those frames; done.jsonl holds the records that version built from them. They build alike now."""
    data = Path(__file__).with_name("data") / "frames-v0"
    want, got = TraceFile(data / "done.jsonl"), open_trace(data / "killed.jsonl")
    assert len(got) == len(want) > 0
    assert [without_timing(got.step(i)) for i in range(len(got))] == \
        [without_timing(want.step(i)) for i in range(len(want))]


def test_a_fast_runs_summary_says_what_its_trace_cost(tmp_path, capsys):
    """`spectrace run --backend fast --trace T` ends with the trace's size and what writing it
    cost: the host's time in the loop and after it (the run's metrics, in the summary record too)."""
    trace = tmp_path / "t.jsonl"
    assert main(["run", "--backend", "fast", "--algo", "none", "--no-tui", "--max-new-tokens", "3",
                 "--trace", str(trace)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"trace: {trace} (") and "its steps in t.jsonl.frames" in last
    metrics = TraceFile(trace).summary["metrics"]
    assert f"writing it took {metrics['trace_loop_s'] * 1e3:.1f} ms of the" in last
    assert f"and {metrics['trace_s'] * 1e3:.1f} ms after it" in last


def test_a_fast_trace_replays_behind_a_first_screen(tmp_path):
    """`spectrace replay` of a fast trace: the app is up before the steps are built (building
    needs torch), shows them once a thread has opened the trace, and a trace that cannot open
    closes the app with its one line."""
    import asyncio
    import threading

    from spectrace.core.trace import TraceError
    from spectrace.viz.tui.opening import Opening

    trace = tmp_path / "t.jsonl"
    run(RunConfig(backend="fast", algo="eagle", topk=2, num_steps=3, num_draft_tokens=4, max_new_tokens=4,
                  trace=str(trace)))

    async def walk(opener):
        built = threading.Event()  # the opening waits for it: the app is up before the steps
        app = Opening(lambda: built.wait(30) and opener(), "opening t.jsonl")
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            assert app.trace is None and app.is_running  # up, the steps still to come
            built.set()
            for _ in range(400):
                await pilot.pause(0.05)
                if app.trace is not None or app.problem is not None:
                    break
            await pilot.press("right")
            return app.trace, app.problem, app.position if app.trace else None

    opened, problem, position = asyncio.run(walk(lambda: open_trace(trace)))
    assert problem is None and len(opened) >= 2 and position == 1  # it walks to the next step
    assert opened.step(0) == open_trace(trace).step(0)

    def refuse():
        raise TraceError("t.jsonl.frames is not readable")
    assert asyncio.run(walk(refuse))[1] == "t.jsonl.frames is not readable"


def test_a_trace_whose_name_leaves_no_room_for_frames_reads(tmp_path, capsys):
    """A trace named to the file system's limit (255 bytes) has no `.frames` beside it: every
    reader opens its lines, and replay without a terminal says so in one line, no traceback."""
    trace = tmp_path / ("y" * 249 + ".jsonl")
    trace.write_text((Path(__file__).with_name("data") / "walkthrough.jsonl").read_text())
    assert len(open_trace(trace)) == len(TraceFile(trace)) > 0
    assert main(["export", str(trace), "--format", "csv", "-o", str(tmp_path / "t.csv")]) == 0
    assert main(["replay", str(trace)]) == 2
    assert "Traceback" not in capsys.readouterr().err

"""The fast engine's frames sidecar (fast/frames.py): a run keeps each step's tensors there while it
decodes and builds the records after its loop; a run killed before that leaves the frames, and
TraceFile builds the same records from them up to the last whole frame."""
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from spectrace.cli import main
from spectrace.core.trace import frames_path
from spectrace.core.trace_reader import TraceFile
from spectrace.recovery import open_trace
from spectrace.fast import step_record
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
def test_a_fast_run_that_never_built_its_records_opens_from_its_frames(tmp_path, monkeypatch, options):
    """A run killed between its loop and its records: the trace holds header and prefills, the
    sidecar every step. Opened by spectrace's commands, it reads as the finished run's trace
    (the same records); a torn last frame costs that step only; records the trace holds already
    are not built twice; render opens the last step."""
    done, killed = tmp_path / "done.jsonl", tmp_path / "killed.jsonl"
    finish = step_record.StepRecorder.finish

    def keep_a_copy(recorder):
        recorder.frames.close()  # flushed: the frames as a kill after the loop leaves them
        frames_path(killed).write_bytes(recorder.frames.path.read_bytes())
        return finish(recorder)
    monkeypatch.setattr(step_record.StepRecorder, "finish", keep_a_copy)
    run(RunConfig(backend="fast", batch=2, max_new_tokens=4, trace=str(done), **options))
    assert not frames_path(done).exists()  # built and removed
    want = [TraceFile(done).step(i) for i in range(len(TraceFile(done)))]
    lines = [line for line in done.read_text().splitlines(keepends=True) if '"kind": "step"' not in line
             and '"kind": "summary"' not in line]  # the header and the prefills
    killed.write_text("".join(lines))

    assert len(TraceFile(killed)) == 0 and "does not build" in TraceFile(killed).notices[0]  # torch-free reader
    got = open_trace(killed)
    assert len(got) == len(want) and any("built from killed.jsonl.frames" in n for n in got.notices)
    assert [without_timing(got.step(i)) for i in range(len(got))] == [without_timing(r) for r in want]
    assert got.tokens.keys() >= {t for r in want for t in r["accept_tokens"]}  # their text came along
    last = got.index[-1]
    assert main(["render", str(killed), "--step", str(last.step), "--request", str(last.request),
                 "-o", str(tmp_path / "t.dot")]) == 0

    frames = frames_path(killed).read_bytes()
    last_frame_requests = sum(1 for meta in got.index if meta.step == last.step)
    frames_path(killed).write_bytes(frames[:-3])  # the last frame torn
    assert len(open_trace(killed)) == len(want) - last_frame_requests
    frames_path(killed).write_bytes(frames)

    prefix = open_trace(killed)._lines[:len(lines) + 2]  # killed while building: two records made
    killed.write_text("\n".join(prefix) + "\n")
    again = open_trace(killed)
    assert [without_timing(again.step(i)) for i in range(len(again))] == [without_timing(r) for r in want]


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

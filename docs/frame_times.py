"""What a fast run's trace costs: the host's part inside the decode loop (StepRecorder.keep, a
step's frame made and written, alone, on the tensors of an eagle3 (5,4,8) step at batch 1, 16 and
64; on a GPU the same call runs once a step, after the step's one sync), and what reading one
costs (a trace of 3,500 frames, a small fast run's frames repeated: its index at open, one step's
records built).

    taskset -c 1 python docs/frame_times.py      # µs a step and the frame's bytes; then reading
"""
import json
import os
import struct
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels' modules: the reading's run on a CPU
import torch  # noqa: E402

from spectrace.fast import step_record  # noqa: E402
from spectrace.fast.frames import FrameWriter, Pack  # noqa: E402


def step_tensors(bs: int, n: int = 8, steps: int = 5, k: int = 5) -> dict:
    """The tensors an eagle3 (steps, 4, n) step's frame holds (fast/step_record.py: step_tensors)."""
    ints = lambda *shape: torch.zeros(*shape, dtype=torch.int64)  # noqa: E731
    return {"host_row": ints(bs, steps + 3), "target_predict": ints(bs, n), "accept_index": ints(bs, steps + 1),
            "accept_num": ints(bs), "req_to_token_tail": ints(bs, step_record.TAIL), "seq_lens": ints(bs),
            "seq_lens_before": ints(bs), "roots": ints(bs), "target_topk_indices": ints(bs, n, k),
            "target_topk_values": torch.zeros(bs, n, k), "p_tokens": torch.zeros(bs, n, n),
            **{name: ints(bs, n) for name in step_record.TREE_FIELDS}, "tree_mask": torch.zeros(bs, n, n, dtype=torch.bool),
            "q": torch.zeros(bs, n), "scores": torch.zeros(bs, n), "draft_top_values": torch.zeros(bs, n, k),
            "draft_top_indices": ints(bs, n, k)}


def reading(tmp: Path, copies: int = 700) -> None:
    """A fast run of 4 requests x 12 tokens (interpreted on a CPU), its step frames repeated
    `copies` times, renumbered: the time to open it and to build one step's records."""
    from spectrace.fast.frames import MAGIC, frame_heads
    from spectrace.traces import open_trace
    from spectrace.run import RunConfig, run

    trace = tmp / "big.jsonl"
    run(RunConfig(backend="fast", algo="eagle3", batch=4, max_new_tokens=12, trace=str(trace)))
    frames = trace.with_name(trace.name + ".frames")
    data, (first, *steps) = frames.read_bytes(), list(frame_heads(frames))
    lengths, out, n = struct.Struct("<QQ"), bytearray(MAGIC), 0
    for copy in range(copies + 1):
        for head, offset, size in [first] if copy == 0 else steps:
            if copy:
                head = {**{k: v for k, v in head.items() if k != "layouts" or copy == 1}, "step": n}
                n += 1
            text = json.dumps(head, separators=(",", ":")).encode()
            out += lengths.pack(len(text), size) + text + data[offset:offset + size]
    frames.write_bytes(out)
    t0 = time.perf_counter()
    opened = open_trace(trace)
    t1 = time.perf_counter()
    opened.step(len(opened) // 2)
    t2 = time.perf_counter()
    print(f"a trace of {len(opened):,} step records in {n:,} frames ({len(out) / 1e6:.1f} MB): opens in "
          f"{t1 - t0:.2f} s, a step's records built in {(t2 - t1) * 1e3:.1f} ms")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for bs in (1, 16, 64):
            copied = Pack(step_tensors(bs))
            rec = step_record.StepRecorder.__new__(step_record.StepRecorder)  # the parts keep reads
            rec.drafter, rec.no_host, rec.layouts_kept, rec.loop_s = None, Pack({}), {}, 0.0
            rec.frames = FrameWriter(Path(tmp) / f"b{bs}.frames")
            kept = [step_record.Kept(b, 5, None, None) for b in range(bs)]
            timing = {"draft": 0.1, "verify": 0.2, "accept": 0.01, "commit": 0.01, "extend": 0.05, "batch_size": bs}
            for i in range(2000):
                if i == 200:  # the first frames carry the layout; warm
                    t0 = time.perf_counter()
                rec.keep(i, copied, kept, timing, None, 5)
            rec.frames.close()
            print(f"batch {bs:>2}: {(time.perf_counter() - t0) / 1800 * 1e6:6.1f} µs a step, "
                  f"a frame of {copied.flat.numel():,} bytes")
        reading(Path(tmp))


if __name__ == "__main__":
    main()

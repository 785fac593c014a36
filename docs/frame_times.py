"""What a fast run's trace costs the host inside its decode loop: StepRecorder.keep, a step's
frame made and written, alone (no torch work around it), on the tensors of an eagle3 (5,4,8) step
at batch 1, 16 and 64. On a GPU the same call runs once a step, after the step's one sync.

    taskset -c 1 python docs/frame_times.py      # µs a step, and the frame's bytes
"""
import tempfile
import time
from pathlib import Path

import torch

from spectrace.fast import step_record
from spectrace.fast.frames import FrameWriter, Pack


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


if __name__ == "__main__":
    main()

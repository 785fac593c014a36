"""Plain-text summaries of a run, for `--no-tui` and for logs."""
from __future__ import annotations

from spectrace.core.metrics import vllm_log_line
from spectrace.viz.tokens import shown


def _fmt(x, spec="{:.3f}") -> str:
    return "n/a" if x is None else spec.format(x)


def metrics_lines(m: dict, algo: str) -> list[str]:
    lines = [f"completion tokens {m['completion_tokens']} in {m['wall_s']:.2f} s: "
             f"{_fmt(m['tokens_per_s'], '{:.1f}')} tokens/s"]
    if algo != "none":
        lines.append(f"verify_ct {m['verify_ct']}  accept_length tau {_fmt(m['accept_length'])}  "
                     f"accept_rate alpha {_fmt(m['accept_rate'])}  "
                     f"(correct drafts {m['num_correct_drafts']} of {m['num_proposed_drafts']} proposed)")
        lines.append("accept_len histogram " + ", ".join(f"{k}: {v}" for k, v in m["accept_len_histogram"].items()))
        if m["vllm"]["num_drafts"]:
            lines.append(vllm_log_line(m))
    return lines


def what_ran(spec, backend: str) -> str:
    """One line naming what ran, the summary's first: the resolved shape, rule and backend."""
    shape = "" if spec.algo == "none" else \
        f" num_steps={spec.num_steps} topk={spec.topk} num_draft_tokens={spec.num_draft_tokens}"
    return f"algo={spec.algo}{shape} acceptance={spec.acceptance} backend={backend}"


def run_summary(result, algo: str, backend: str = "explicit") -> str:
    out = [what_ran(result.spec, backend)] if getattr(result, "spec", None) is not None else []
    if getattr(result, "policy", None):
        out.append(result.policy)
    for r, text in zip(result.requests, result.texts):
        out.append(f"--- request {r.req_pool_idx} ({len(r.prompt_ids)} prompt tokens, {len(r.output_ids)} generated, "
                   f"finished: {r.finish_reason})")
        out.append(shown(text, newline="\n"))  # generated text is untrusted: no control character reaches the terminal
    out.append("---")
    out += metrics_lines(result.metrics, algo)
    if getattr(result, "load_s", 0):
        out.append(f"models loaded in {result.load_s:.2f} s")
    out.append(trace_line(result))
    return "\n".join(out)


def trace_line(result) -> str:
    """Where the trace is, its size, and what writing it cost a fast run: the host's time making
    and writing frames inside the decode loop and its time after the loop."""
    path = result.trace_path
    if path is None:
        return "trace: none (--trace-level off)"
    frames = path.with_name(path.name + ".frames")
    try:
        sizes = [p.stat().st_size for p in (path, frames) if p.is_file()]
    except OSError:
        sizes = []
    line = f"trace: {path}" + (f" ({sum(sizes) / 1e6:.2f} MB" + (f", its steps in {frames.name})" if len(sizes) > 1
                                                                   else ")") if sizes else "")
    m = result.metrics
    if "trace_s" in m:
        line += (f"; writing it took {m.get('trace_loop_s', 0) * 1e3:.1f} ms of the {m['wall_s']:.3f} s loop and "
                 f"{m['trace_s'] * 1e3:.1f} ms after it")
    return line

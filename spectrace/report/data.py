"""A trace as the report page reads it (report.js): every step once, its tree as viz/steptree.py's
node model, token texts once (`shown`: escaped as every viewer shows them), and the summary.

    {"meta": {...}, "summary": {...}, "tokens": {id: text}, "requests": [...], "steps": [...]}
    step: {"s": step, "r": request, "al": accept_len, "c": committed, "f": finish_reason,
           "n": [[token, parent, depth, fate, q, score, p], ...] (root first, bonus last),
           "levels": draft levels, "kv": the record's kv, "t": phase ms, "ad": adaptive or absent}
Node fates are indices into steptree.FATES. A trace without a summary record (a run that did not
finish) gets its metrics counted from its steps, as the run counts them, marked so.
"""
from __future__ import annotations

from spectrace.core.metrics import SpecMetrics
from spectrace.core.trace import MALFORMED, TraceError, malformed
from spectrace.core.trace_reader import TraceFile
from spectrace.viz.steptree import FATES, step_tree
from spectrace.viz.tokens import shown
from spectrace.viz.tui.panels import phases_of

META_FIELDS = ("algo", "resolved_algorithm", "num_steps", "topk", "num_draft_tokens", "acceptance", "temperature",
               "backend", "device", "dtype", "trace_level", "batch", "max_new_tokens", "target_model", "draft_model")


def _round(x):
    return None if x is None else round(float(x), 5)


def compact_step(rec: dict, token_text, algo: str) -> dict:
    nodes = step_tree(rec, token_text)
    levels = sum(p.startswith("DRAFT") for p in phases_of(rec, algo))
    out = {"s": rec["step"], "r": rec["request"], "al": rec["accept_len"],
           "c": list(rec.get("committed_tokens", rec["accept_tokens"])), "f": rec.get("finish_reason"),
           "nd": len(rec["correct_drafts"]),
           "n": [[n.token, -1 if n.parent is None else n.parent, n.depth, FATES.index(n.fate), _round(n.q),
                  _round(n.score), _round(n.p)] for n in nodes],
           "levels": levels, "kv": rec["kv"], "t": rec.get("timing", {})}
    if rec.get("adaptive"):
        out["ad"] = rec["adaptive"]
    return out


def derived_metrics(trace: TraceFile, cfg: dict) -> dict:
    """The summary record's metrics, from the records a trace holds (core/metrics.py counts them
    as the run did); no wall time, so no tokens/s."""
    drafted = cfg.get("algo") != "none"
    depth = max([int(cfg.get("num_steps") or 0)] + [max(trace.step(i)["draft"]["depths"], default=0)
                                                    for i in range(len(trace)) if trace.step(i)["draft"]])
    metrics = SpecMetrics(depth if drafted else 0, int(cfg.get("num_draft_tokens") or 1))
    for p in trace.prefills:
        metrics.observe_prefill(p["request"])
    for i in range(len(trace)):
        metrics.observe_step(trace.step(i))
    return {**metrics.summary(0.0), "tokens_per_s": None}


def report_data(trace: TraceFile) -> dict:
    cfg = trace.header.get("config", {})
    if not isinstance(cfg, dict):
        raise TraceError(f"trace {trace.path}: the header's config is not an object")
    algo = str(cfg.get("algo", "?"))
    used: set[int] = set()
    steps = []
    for i in range(len(trace)):
        rec = trace.step(i)
        try:
            steps.append(compact_step(rec, trace.token_text, algo))
        except MALFORMED as e:
            raise malformed(trace.path, trace.index[i].where, e) from None
        used.update(n[0] for n in steps[-1]["n"])
        used.update(steps[-1]["c"])
    requests = {}
    for p in trace.prefills:
        requests[p["request"]] = {"id": p["request"], "first": p.get("first_token"), "prompt_len": p.get("prompt_len"),
                                  "prompt": None, "finish": p.get("finish_reason")}
    summary = trace.summary
    for r in (summary or {}).get("requests", []):
        if r.get("request") in requests and isinstance(r.get("prompt_text"), str):
            requests[r["request"]]["prompt"] = shown(r["prompt_text"])
    for s in steps:
        requests.setdefault(s["r"], {"id": s["r"], "first": None, "prompt_len": None, "prompt": None})
        requests[s["r"]]["finish"] = s["f"] or requests[s["r"]].get("finish")
    used.update(r["first"] for r in requests.values() if isinstance(r["first"], int))
    m = summary.get("metrics", {}) if summary is not None else derived_metrics(trace, cfg)
    shown_summary = {k: m.get(k) for k in ("completion_tokens", "verify_ct", "tokens_per_s", "accept_length",
                                            "accept_rate", "accept_len_histogram", "num_correct_drafts")}
    shown_summary["per_position"] = (m.get("vllm") or {}).get("per_position_acceptance_rate", [])
    shown_summary["derived"] = summary is None
    meta = {k: cfg.get(k) for k in META_FIELDS if k in cfg}
    meta["path"] = str(trace.path)
    meta = {k: shown(v) if isinstance(v, str) else v for k, v in meta.items()}
    notices = list(trace.notices)
    rejudged = trace.header.get("rejudged")
    if isinstance(rejudged, dict):  # spectrace rejudge: what the verdicts are, as the walkthrough says
        notices.append(f"re-judged from {rejudged.get('from')}: {rejudged.get('step_local')}")
    return {"meta": meta, "summary": shown_summary, "notices": [shown(n) for n in notices],
            "tokens": {str(t): shown(trace.token_text(t)) for t in sorted(used)},
            "fates": list(FATES), "requests": [requests[k] for k in sorted(requests)], "steps": steps}

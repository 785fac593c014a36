"""The walkthrough's KV panel: what the step's phase did to the KV cache, from a trace record's
`kv` (docs/trace-format.md): sequence lengths, the tail of req_to_token, the phase's KV events."""
from __future__ import annotations

from rich.text import Text

from spectrace.viz.tui.panels import after


def _span(xs: list[int]) -> str:
    if not xs:
        return "-"
    return " ".join(str(x) for x in xs) if len(xs) <= 10 else " ".join(map(str, xs[:8])) + f" … ({len(xs)})"


PHASE_EVENTS = {"DRAFT": ("draft",), "VERIFY": ("verify",), "ACCEPT": ("verify",), "COMMIT": ("commit", "finish"),
                "EXTEND": ("extend",)}
PHASE_WHAT = {"DRAFT": "draft KV scratch, [topk][step], released after drafting",
              "VERIFY": "target KV of the verify rows", "ACCEPT": "target KV of the verify rows",
              "COMMIT": "target KV: keep the accepted path, release the rest", "EXTEND": "draft KV (DRAFT_EXTEND)"}
SHOWN_FIELDS = ("pool", "op", "req", "phase", "positions", "slots", "from_slots", "to_slots", "tokens")


def kv_panel(rec: dict, phase: str) -> Text:
    """Sequence lengths, the tail of `req_to_token`, and the KV events of this phase (the trace
    tags each event with the phase that caused it)."""
    kv = rec["kv"]
    kind = phase.split()[0]
    shown = [e for e in kv["events"] if e.get("phase") in PHASE_EVENTS[kind]]
    seq_before, seq_after = kv["target_seq_len"]
    t = Text()
    t.append(f"{kv['style']}", style="bold")
    t.append(f"  target seq_len {seq_before}" + (f" -> {seq_after}" if after(phase, "COMMIT") else ""))
    if kv.get("draft_seq_len"):
        d0, d1 = kv["draft_seq_len"]
        t.append(f"  draft {d0}" + (f" -> {d1}" if phase == "EXTEND" else ""))
    elif rec.get("draft") is not None:  # FROZEN_KV_MTP reads the target's; n-gram needs none
        t.append("  no draft KV" + ("" if rec["draft"].get("proposer") else " (reads the target's)"))
    t.append("\n")
    if kv["style"] == "vllm" and after(phase, "COMMIT"):
        n = len(rec["verify"]["tokens"])
        rejected = seq_before + n - seq_after
        t.append(f"num_computed_tokens = {seq_before} + {n} verified - {rejected} rejected = {seq_after}\n",
                 style="yellow")
    tail = kv["req_to_token_tail"] if after(phase, "COMMIT") else kv.get("req_to_token_tail_before")
    if tail:
        t.append(f"req_to_token[{rec['request']}, {tail['start']}:] ", style="bold")
        t.append(_span(tail["slots"]) + "\n")
    t.append(PHASE_WHAT[kind] + "\n", style="dim")
    for e in shown:
        t.append(f"{e['pool']:<6} {e['op']:<8}", style="bold")
        if e["op"] == "move":
            t.append(f" slots {_span(e['from_slots'])} -> {_span(e['to_slots'])}")
        else:
            for name, label in (("positions", "pos"), ("slots", "slots")):
                if name in e:
                    t.append(f" {label} {_span(e[name])}")
        extra = {k: v for k, v in e.items() if k not in SHOWN_FIELDS}
        if extra:
            t.append(" " + " ".join(f"{k}={_span(v) if isinstance(v, list) else v}" for k, v in extra.items()),
                     style="dim")
        t.append("\n")
    return t

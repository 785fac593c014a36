"""Trace format v1: JSON Lines, one record per line, flushed as it is written.

    {"kind": "header", "schema": "spectrace.trace/1", "config": {...}, "models": {...}, "tokens": {...}}
    {"kind": "prefill", "request": r, ...}                      one per request
    {"kind": "step", "step": s, "request": r, "correct_drafts": [...], "bonus_token": t,
     "accept_tokens": [...], "accept_len": n, "draft": {...}, "verify": {...}, "accept": {...},
     "kv": {...}, "timing": {...}, "tokens": {...}}            one per decode step per request
    {"kind": "summary", "metrics": {...}, "requests": [...]}   last, when the run finished

A run killed mid-way leaves every line it wrote; a torn last line is reported and skipped.
Token strings travel with the trace: each record's "tokens" maps ids first mentioned there to
their text, so a viewer needs neither tokenizer nor model. Reading needs no torch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

SCHEMA = "spectrace.trace/1"
SCHEMA_PREFIX = "spectrace.trace/"
STEP_FIELDS = {"step": int, "request": int, "correct_drafts": list, "bonus_token": int,
               "accept_tokens": list, "accept_len": int, "draft": (dict, type(None)),
               "verify": dict, "accept": dict, "kv": dict, "timing": dict}


class TraceError(Exception):
    """The trace cannot be read; the message says why in one line."""


class TraceWriter:
    """Writes one JSON object per line and flushes it, so readers see every finished step."""

    def __init__(self, path: str | Path, token_text: Callable[[int], str]):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "w", encoding="utf-8")
        except OSError as e:
            raise TraceError(f"cannot write trace {self.path}: {e.strerror}") from None
        self._token_text = token_text
        self._seen: set[int] = set()

    def _new_tokens(self, ids: Iterable[int]) -> dict[str, str]:
        new = sorted({int(i) for i in ids} - self._seen)
        self._seen.update(new)
        return {str(i): self._token_text(i) for i in new}

    def write(self, record: dict, token_ids: Iterable[int] = ()) -> None:
        record = dict(record)
        record["tokens"] = self._new_tokens(token_ids)
        self._f.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


@dataclass
class Trace:
    header: dict
    prefills: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    summary: dict | None = None
    tokens: dict[int, str] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)  # e.g. a torn last line, an unfinished run

    def token_text(self, token_id: int) -> str:
        return self.tokens.get(token_id, f"<{token_id}>")


def _check_step(rec: dict, lineno: int) -> None:
    for name, typ in STEP_FIELDS.items():
        if name not in rec:
            raise TraceError(f"line {lineno}: step record lacks field {name!r}")
        if not isinstance(rec[name], typ) or isinstance(rec[name], bool):
            raise TraceError(f"line {lineno}: step field {name!r} has the wrong type")
    if rec["accept_len"] != len(rec["correct_drafts"]) + 1:
        raise TraceError(f"line {lineno}: accept_len != len(correct_drafts) + 1")
    if rec["accept_tokens"] != rec["correct_drafts"] + [rec["bonus_token"]]:
        raise TraceError(f"line {lineno}: accept_tokens != correct_drafts + [bonus_token]")


def read_trace(path: str | Path) -> Trace:
    """Read and validate a trace; raise TraceError with a one-line reason if it is unusable."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"no trace file at {path}") from None
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError(f"{path} is not a spectrace trace (not UTF-8 text)") from None
    lines = text.split("\n")
    complete = text.endswith("\n")
    if complete:
        lines.pop()  # the empty string after the final newline
    if not lines or not lines[0].strip():
        raise TraceError(f"trace {path} is empty")
    records = []
    for i, line in enumerate(lines, start=1):
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError
        except ValueError:
            if i == len(lines) and i > 1 and not complete:
                torn = f"trace ends in a torn line (line {i}); read up to the last complete record"
                records.append(("torn", torn))
                break
            if i == 1:
                raise TraceError(f"{path} is not a spectrace trace (line 1 is not a JSON header)") from None
            raise TraceError(f"trace {path} is corrupted at line {i} (not a JSON object)") from None
        records.append((i, rec))

    _, header = records[0]
    schema = header.get("schema")
    if header.get("kind") != "header" or not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise TraceError(f"{path} is not a spectrace trace (no spectrace.trace header)")
    if schema != SCHEMA:
        raise TraceError(f"trace schema {schema} is not readable by this spectrace, which reads {SCHEMA}")
    trace = Trace(header=header)
    trace.tokens.update({int(k): v for k, v in header.get("tokens", {}).items()})
    for lineno, rec in records[1:]:
        if lineno == "torn":
            trace.notices.append(rec)
            continue
        kind = rec.get("kind")
        trace.tokens.update({int(k): v for k, v in rec.get("tokens", {}).items()})
        if kind == "step":
            _check_step(rec, lineno)
            trace.steps.append(rec)
        elif kind == "prefill":
            trace.prefills.append(rec)
        elif kind == "summary":
            trace.summary = rec
        else:
            raise TraceError(f"trace {path} line {lineno}: unknown record kind {kind!r}")
    if trace.summary is None:
        trace.notices.append("the run did not finish: no summary record")
    return trace

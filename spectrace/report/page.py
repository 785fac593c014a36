"""The report page: one HTML file with its data, style and script inline, nothing fetched.

The data travels as a `<script type="application/json">` element, which no browser runs; inside it
`<`, `>` and `&` are JSON escapes, so no token text can close the element or open another. The
Content-Security-Policy allows exactly the page's script (by its SHA-256), inline styles and
nothing from anywhere else: a string that slipped through would still run nothing.
"""
from __future__ import annotations

import base64
import hashlib
import html
import json
import os
from importlib.resources import files
from pathlib import Path

from spectrace.core.trace import finite
from spectrace.errors import SpectraceError

_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def inert_json(data) -> str:
    """JSON that can sit inside a <script> element: no `<`, `>` or `&` left to end it; a number
    that is not finite (a hand-edited trace's NaN) is null, as the trace writer writes it."""
    text = json.dumps(finite(data), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return "".join(_ESCAPES.get(ch, ch) for ch in text)


def _asset(name: str) -> str:
    return (files("spectrace.report") / "assets" / name).read_text(encoding="utf-8")


def page(data: dict, title: str) -> str:
    script, style = _asset("report.js"), _asset("report.css")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    csp = f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; img-src data:"
    title = html.escape(title)  # text of <title>: no markup
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{title}</title>\n<style>{style}</style></head>\n<body>\n"
            f'<script type="application/json" id="trace-data">{inert_json(data)}</script>\n'
            f"<script>{script}</script>\n</body></html>\n")


def write_page(text: str, out: Path) -> None:
    """Written beside OUT and renamed over it: a reader never sees half a page."""
    part = out.with_name(out.name + ".part")
    try:
        part.write_text(text, encoding="utf-8")
        os.replace(part, out)
    except OSError as e:
        part.unlink(missing_ok=True)
        raise SpectraceError(f"cannot write {out}: {e.strerror}") from None


def write_report(trace_path, out) -> Path:
    """`spectrace report TRACE -o OUT`: the page of the trace at TRACE (a fast run's frames
    included, as every command reads them)."""
    from spectrace.traces import open_trace
    from spectrace.report.data import report_data

    out = Path(out)
    trace = open_trace(trace_path)
    data = report_data(trace)
    write_page(page(data, f"spectrace · {data['meta'].get('algo', '?')} · {Path(trace_path).name}"), out)
    return out

"""Token text is untrusted: traces are shared files and a token can decode to anything (the embedded
tokenizer alone has 31 tokens that are C0 control characters). `shown` is the one way token and
prompt text reaches a screen or a file meant for people (walkthrough panels, `render` labels, the
`--no-tui` summary); the trace itself keeps the exact text.

    printable characters      as they are (any script; the ASCII space too)
    a line break              `newline` (↵ by default; the stream panel and summaries keep a real one)
    C0, DEL and C1 controls   \\x1b, \\x07, \\x85 ...: never sent to a terminal, never written into SVG
    bidi overrides, isolates  \\u202e, \\u2066 ...: they would reorder what follows them on the line
    other non-printing        \\u00a0, \\u2028, \\ud800 (unpaired surrogates, as JSON allows) ...
    a backslash, a literal ↵  \\\\ and \\u21b5, so no two different texts look the same

Where a token is a label (tree nodes, figures, top-k tables, the stream), `limit` shortens it:
a 100 KB token would flood the tree panel and make a figure hundreds of thousands of points wide.
Shortened labels say how much is left out; the walkthrough's inspector shows the whole text.
"""
from __future__ import annotations

BIDI_CONTROLS = frozenset(range(0x202A, 0x202F)) | frozenset(range(0x2066, 0x206A))
LABEL_LIMIT = 40  # characters of a token label, after escaping


def _escape(ch: str) -> str:
    o = ord(ch)
    if o < 0x20 or 0x7F <= o <= 0x9F:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}"


def shown(text: str, newline: str = "↵", limit: int | None = None) -> str:
    """`text` as people may safely see it: every character printable (or the line break given as
    `newline`), and different texts always shown differently. With `limit`, it stops once that
    many characters are shown and adds `…(+N chars)`, N the text's characters left out."""
    out, size = [], 0
    for i, ch in enumerate(text):
        if limit is not None and size >= limit:
            return "".join(out) + f"…(+{len(text) - i} chars)"
        if ch == "\n":
            out.append(newline)
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "↵" or ord(ch) in BIDI_CONTROLS or not ch.isprintable():
            out.append(_escape(ch))
        else:
            out.append(ch)
        size += len(out[-1])
    return "".join(out)

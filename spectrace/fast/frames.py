"""Step frames: what a fast run keeps of each step while it decodes, beside its trace.

Building a step's JSON records costs the host about half a millisecond a request, more than a
whole decode step of the embedded pair, so a run that records a trace does not build them: each
step it appends one frame to TRACE.frames, the step's tensors as they came off the device (one
packed copy) with a small JSON head, and readers build the records from the frames when they read
them (fast/records.py: FrameSteps), as profilers record raw events and format them later. A run
killed at any point leaves every whole frame.

    spectrace.frames/1\\n                                     the file's first line
    per frame: <u64 head bytes><u64 blob bytes> head blob   head: UTF-8 JSON; blob: raw tensors

The first frame's head is the recorder's context (fast/step_record.py: RecordContext); every
later one is a step's, its "packs" naming where each tensor lies in the blob (`Pack`). A frame is
written whole and flushed, so a torn last frame is one that never finished: readers stop before it.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import os
import stat
import struct
from pathlib import Path
from typing import Iterator

import torch

from spectrace.core.trace import TraceError

MAGIC = b"spectrace.frames/1\n"
_LENGTHS = struct.Struct("<QQ")


class Pack:
    """Tensors as one byte buffer, `flat` (each viewed as bytes and concatenated: one kernel on a
    GPU, widest elements first, so each starts at a multiple of its element size without padding),
    and the layout that reads them back: {name: [offset, bytes, dtype, shape] or None}, which a
    frame names by `key`. `to_host` copies the bytes into `host` without waiting (pinned memory);
    the caller reads them once the step's event has passed. Made inside a CUDA graph, `flat` is
    rewritten by every replay, its layout and key stay, and its copies take turns in two pinned
    buffers: a step's are read before the step after next is launched."""
    _keys = itertools.count()

    def __init__(self, tensors: dict):
        self.layout, chunks, at = {name: None for name, t in tensors.items() if t is None}, [], 0
        present = [(name, t) for name, t in tensors.items() if t is not None]
        for name, t in sorted(present, key=lambda item: -item[1].element_size()):
            size = t.numel() * t.element_size()
            self.layout[name] = [at, size, str(t.dtype).removeprefix("torch."), list(t.shape)]
            chunks.append(t.contiguous().view(-1).view(torch.uint8))
            at += size
        self.flat = torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.uint8)
        self.host, self.key, self.ring = self.flat, next(self._keys), []
        self.views = None  # host's tensors by name, when host is a ring buffer (made once for it)

    def to_host(self) -> Pack:
        """This pack with `host` a copy of `flat` on its way to the host (on a CPU: flat itself)."""
        landed = copy.copy(self)
        if self.flat.is_cuda:
            if not self.ring:
                for _ in range(2):
                    buffer = torch.empty(self.flat.shape, dtype=torch.uint8, pin_memory=True)
                    self.ring.append((buffer, unpack(buffer, self.layout)))
            self.ring.reverse()
            landed.host, landed.views = self.ring[0]
            landed.host.copy_(self.flat, non_blocking=True)
        return landed

    def tensors(self) -> dict:
        return self.views if self.views is not None else unpack(self.host, self.layout)

    def view(self, name: str) -> torch.Tensor:
        """One tensor of `host`, by its name."""
        return (self.views[name] if self.views is not None
                else unpack(self.host, {name: self.layout[name]})[name])


def unpack(buffer: torch.Tensor, layout: dict) -> dict:
    """A Pack's tensors, as views of `buffer` (uint8) by its layout."""
    return {name: None if at is None else
            buffer[at[0]:at[0] + at[1]].view(getattr(torch, at[2])).view(at[3])
            for name, at in layout.items()}


def split(obj) -> tuple[dict, dict]:
    """A dataclass of tensors and JSON values (a host DraftTree, a request's Randoms) as its JSON
    fields and its tensors; `join` puts it back together."""
    fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    tensors = {k: v for k, v in fields.items() if isinstance(v, torch.Tensor)}
    return {k: v for k, v in fields.items() if k not in tensors}, tensors


def join(cls, fields: dict, tensors: dict):
    return cls(**fields, **tensors)


class FrameWriter:
    """Appends frames to a sidecar, each in one system call (os.writev: no copy, no buffer in
    this process), so a frame is in the kernel's hands, whole, once `write` returns: a run killed
    after it (SIGKILL included) keeps it."""

    def __init__(self, path: Path):
        self.path = path
        try:
            if path.exists() and not path.is_file():  # a FIFO's open would wait for a reader
                raise TraceError(f"cannot write {path}: it is not a "
                                 f"file, and a trace's frames are one")
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            self._writev([MAGIC])
        except OSError as e:
            raise TraceError(f"cannot write {path}: {e.strerror}") from None

    def write(self, head: dict, *blobs: torch.Tensor) -> None:
        """One frame: `head` and the bytes of blobs (uint8 tensors on the host), back to back."""
        text = json.dumps(head, separators=(",", ":")).encode("utf-8")
        data = [b.numpy().data for b in blobs if b.numel()]
        try:
            self._writev([_LENGTHS.pack(len(text), sum(b.numel() for b in blobs)), text, *data])
        # a full disk: the frames so far stay readable, a torn last one is skipped
        except OSError as e:
            raise TraceError(f"cannot write {self.path}: {e.strerror}") from None

    def _writev(self, parts: list) -> None:
        """All of parts, in order (a regular file takes them in one call but where the disk
        fills)."""
        parts = [memoryview(p).cast("B") for p in parts]
        while parts:
            done = os.writev(self._fd, parts)
            while parts and done >= len(parts[0]):
                done -= len(parts.pop(0))
            if parts:
                parts[0] = parts[0][done:]

    def close(self) -> None:
        os.close(self._fd)


def frame_heads(path: Path) -> Iterator[tuple[dict, int, int]]:
    """Each whole frame's head, and where its blob lies (offset, bytes), reading no blob: a
    trace's index of its steps. A file that is not a sidecar yields nothing; a torn last frame
    ends the frames."""
    if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the open, a device never end
        return
    with open(path, "rb") as f:
        # what a frame may claim: lengths past it are a torn frame
        size = os.fstat(f.fileno()).st_size
        if f.read(len(MAGIC)) != MAGIC:
            return
        while len(lengths := f.read(_LENGTHS.size)) == _LENGTHS.size:
            head_size, blob_size = _LENGTHS.unpack(lengths)
            if f.tell() + head_size + blob_size > size:  # read nothing that is not there
                return
            head = f.read(head_size)
            try:
                head = json.loads(head)
            except ValueError:
                return
            yield head, f.tell(), blob_size
            f.seek(blob_size, os.SEEK_CUR)


def read_blob(path: Path, offset: int, size: int) -> torch.Tensor:
    """A frame's blob (uint8, on the host, in a buffer of its own: its tensors' views are
    aligned)."""
    with open(path, "rb") as f:
        f.seek(offset)
        blob = bytearray(f.read(size))
    if len(blob) < size:
        raise TraceError(f"{path}: a frame's blob ends early")
    return torch.frombuffer(blob, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)


def read_frames(path: Path) -> Iterator[tuple[dict, torch.Tensor]]:
    """Each whole frame of a sidecar: its head and its blob (uint8, on the host)."""
    for head, offset, size in frame_heads(path):
        yield head, read_blob(path, offset, size)

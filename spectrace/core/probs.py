"""--record-probs: the sidecar that makes a trace's steps re-judgeable (`spectrace rejudge`).

One safetensors file beside the trace (TRACE.probs.safetensors; never pickle) holds, for every
decode step and request that verified drafts:

    s{step}.r{request}.logits   (n, V) float32  the target's logits after each node, before
                                               temperature, top-k and top-p (a re-judge may pick
                                               another temperature)
    s{step}.r{request}.q        (n-1, V) float32  the draft's distribution at each node's parent:
                                               what the node was sampled from, or chosen from by
                                               top-k; absent for drafters without one (n-gram,
                                               DFLASH, Medusa's static tree)
    s{step}.r{request}.{field}  the random numbers the walk read, acceptance.Randoms' fields
                                (coins, coin_final, bonus_noise, uniforms, inv_q), as drawn

The trace's header names the file and its sha256. The header is written before the first step
and the sidecar after the last, so the header first carries a fixed-width placeholder that is
overwritten in place once the file is saved (`seal`): the trace stays readable line by line the
whole time, and a trace whose run was killed before saving says so instead of naming a wrong file.
"""
from __future__ import annotations

import hashlib
from dataclasses import fields
from pathlib import Path

import torch

from spectrace.core.acceptance import Randoms
from spectrace.core.trace import TraceError
from spectrace.errors import SpectraceError

SCHEMA = "spectrace.probs/1"
UNSEALED = "0" * 64  # the header's sha256 until the sidecar is saved
RANDOM_FIELDS = [f.name for f in fields(Randoms)]


def sidecar_path(trace_path: str | Path) -> Path:
    trace_path = Path(trace_path)
    return trace_path.with_name(trace_path.stem + ".probs.safetensors")


def key(step: int, request: int, name: str) -> str:
    return f"s{step}.r{request}.{name}"


class ProbsRecorder:
    """Collects each verified step's distributions and random numbers on the host; `save` writes
    them at the end of the run (or when it is interrupted)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.tensors: dict[str, torch.Tensor] = {}

    def add(self, step: int, request: int, logits: torch.Tensor, q: torch.Tensor | None,
            randoms: Randoms) -> None:
        """Copies taken before the walk: walks write into q and the kernels' buffers."""
        self.tensors[key(step, request, "logits")] = logits.detach().float().cpu().clone()
        if q is not None:
            self.tensors[key(step, request, "q")] = q.detach().float().cpu().clone()
        for name in RANDOM_FIELDS:
            value = getattr(randoms, name)
            # a 0-d coin is kept as (1,): safetensors' scalars vary by version
            if value is not None:
                self.tensors[key(step, request, name)] = value.detach().cpu().reshape(-1).clone()

    def save(self) -> str:
        """Write the sidecar; returns its sha256 for the trace's header."""
        from safetensors import SafetensorError
        from safetensors.torch import save_file

        try:
            save_file(self.tensors, str(self.path), metadata={"schema": SCHEMA})
        except (OSError, SafetensorError) as e:  # a full disk: safetensors says so as its own error
            self.path.unlink(missing_ok=True)  # no half a sidecar for rejudge to trip on
            why = (e.strerror if isinstance(e, OSError)
                   else str(e).rsplit(": ", 1)[-1].split(" (os error")[0])
            raise TraceError(f"cannot write {self.path}: {why} (the trace holds the steps; rejudge "
                             f"needs " "the sidecar)") from None
        return sha256(self.path)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def seal(trace_path: Path, digest: str) -> None:
    """Overwrite the header's placeholder with the sidecar's sha256, in place (same width)."""
    with open(trace_path, "r+b") as f:
        # the key and its quotes: a prompt's text cannot hold them unescaped, so only the field
        # matches
        needle = f'"sha256": "{UNSEALED}"'.encode()
        at = f.readline().find(needle)
        if at < 0:
            raise SpectraceError(f"{trace_path}: the header has no sidecar hash to seal")
        f.seek(at)
        f.write(f'"sha256": "{digest}"'.encode())


class RecordedProbs:
    """A trace's sidecar, read back and checked against the header's hash."""

    def __init__(self, trace_path: str | Path, header: dict):
        info = header.get("probs")
        if not isinstance(info, dict) or not isinstance(info.get("file"), str):
            raise SpectraceError(f"{trace_path} holds no recorded distributions: record the run "
                                 f"with " "`spectrace run ... --record-probs`")
        # beside the trace, wherever it moved
        path = Path(trace_path).with_name(Path(info["file"]).name)
        if info.get("sha256") == UNSEALED:
            raise SpectraceError(f"{trace_path}: its run stopped before "
                                 f"saving the distributions ({path.name})")
        if not path.is_file():
            raise SpectraceError(f"{trace_path} names the sidecar "
                                 f"{path.name}, which is not beside it")
        if sha256(path) != info.get("sha256"):
            raise SpectraceError(f"{path} is not the sidecar {trace_path} "
                                 f"was recorded with (sha256 differs)")
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            self.tensors = load_file(str(path))
        except (SafetensorError, OSError) as e:
            raise SpectraceError(f"cannot read {path}: {e}") from None
        self.path = path

    def logits(self, step: int, request: int) -> torch.Tensor:
        name = key(step, request, "logits")
        if name not in self.tensors:
            raise SpectraceError(f"{self.path} lacks step {step} of request {request}")
        return self.tensors[name]

    def q(self, step: int, request: int) -> torch.Tensor | None:
        return self.tensors.get(key(step, request, "q"))

    def randoms(self, step: int, request: int) -> Randoms:
        """The random numbers the recorded walk read, shaped as its rule drew them."""
        values = {}
        for name in RANDOM_FIELDS:
            t = self.tensors.get(key(step, request, name))
            if t is not None:
                values[name] = t.reshape(()) if name == "coin_final" else t
        return Randoms(**values)

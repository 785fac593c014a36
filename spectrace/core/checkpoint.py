"""A Hugging Face checkpoint directory, read tensor by tensor straight to where the model runs.

    read_checkpoint(path)    (config.json, Weights): every tensor's name, shape and stored dtype
                             from the weight files' headers; no tensor data is read yet
    check_keys               the checkpoint's names and shapes are exactly the model's (one line if
                             not)
    building(dtype, device)  modules built on the run's device in the run's dtype, weights unfilled
    load_weights             each tensor read onto the model's device and cast there into its
                             parameter, one at a time, with a progress callback

So an 8B checkpoint in bfloat16 never has a float32 copy, nor a whole copy, in host memory: the
peak is the model on its device plus one tensor in flight (safetensors' `safe_open(device=...)`
stages each tensor alone; a `pytorch_model.bin` is memory-mapped and read weights-only).
Weight files: `model.safetensors`, sharded safetensors with `model.safetensors.index.json`, or
`pytorch_model.bin` (SafeAILab ships its EAGLE heads so).
"""
from __future__ import annotations

import hashlib
import json
import pickle
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

from spectrace.core.config import read_config_json
from spectrace.errors import SpectraceError, first_line

# safetensors' dtype names
SAFE_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
               "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
               "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
FULL_HASH_LIMIT = 1 << 30  # bytes of weights up to which a trace's model identity hashes every byte
Progress = Callable[[int, int], None]  # (bytes loaded, bytes in all)


@dataclass(frozen=True)
class Stored:
    """One tensor of a checkpoint, not yet read: where it lies and what it is."""
    file: Path
    key: str  # its name in the file (a loader may file it under another name)
    shape: tuple[int, ...]
    dtype: torch.dtype
    tensor: torch.Tensor | None = None  # a memory-mapped pytorch_model.bin's tensor

    def nbytes(self, dtype: torch.dtype) -> int:
        """Bytes on the device once loaded in `dtype` (integer and bool tensors keep theirs)."""
        size = dtype.itemsize if self.dtype.is_floating_point else self.dtype.itemsize
        return size * int(torch.Size(self.shape).numel())


Weights = dict[str, Stored]  # module name -> stored tensor


def weight_files(path: Path) -> list[Path]:
    """The directory's weight files, in the order the checkpoint lists them: regular files inside
    it (a FIFO would hang the read; an index naming ../ would read another directory's)."""
    if (path / "model.safetensors").exists():
        files = [path / "model.safetensors"]
    elif (path / "model.safetensors.index.json").is_file():
        try:
            index = (path / "model.safetensors.index.json").read_text(encoding="utf-8")
            shards = json.loads(index)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SpectraceError(f"cannot load model from {path}: "
                                 f"model.safetensors.index.json: {first_line(e)}") from None
        if not isinstance(shards, dict) or not all(isinstance(s, str) and s == Path(s).name
                                                   and s not in ("", "..")
                                                   for s in shards.values()):
            raise SpectraceError(f"cannot load model from {path}: model.safetensors.index.json's "
                                 f"weight_map " "must name files in its own directory")
        files = [path / shard for shard in sorted(set(shards.values()))]
    elif (path / "pytorch_model.bin").exists():
        files = [path / "pytorch_model.bin"]
    else:
        raise SpectraceError(f"{path} holds no model.safetensors, "
                             f"model.safetensors.index.json or pytorch_model.bin")
    for file in files:
        if file.exists() and not file.is_file():
            raise SpectraceError(f"cannot load model from {path}: {file.name} is not a "
                                 "regular file")
    return files


def read_weight_file(file: Path) -> Weights:
    """Every tensor a weight file stores, by its name there (headers only)."""
    if file.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(file, framework="pt") as f:
            return {k: Stored(file, k, tuple(f.get_slice(k).get_shape()),
                              SAFE_DTYPES[f.get_slice(k).get_dtype()])
                    for k in f.keys()}
    try:  # a zip-format torch file maps lazily; an old-format one is read whole
        try:
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:
            state = torch.load(file, map_location="cpu", weights_only=True)
    # weights_only met something other than tensors: code, or objects
    except pickle.UnpicklingError:
        raise ValueError(f"{file.name} is not a plain state dict of tensors (loading it would run "
                         "code or build objects; weights_only refuses it)") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError("not a state dict of tensors")
    return {k: Stored(file, k, tuple(v.shape), v.dtype, v) for k, v in state.items()}


def read_checkpoint(path: str | Path) -> tuple[dict, Weights]:
    """(config.json as a dict, every stored tensor by name) of a HF directory, with one-line
    errors."""
    from safetensors import SafetensorError

    path = Path(path)
    raw = read_config_json(path)
    weights: Weights = {}
    try:
        for file in weight_files(path):
            weights.update(read_weight_file(file))
    # unreadable, truncated, not weights
    except (OSError, ValueError, KeyError, SafetensorError, RuntimeError) as e:
        raise SpectraceError(f"cannot load model from {path}: {first_line(e)}") from None
    return raw, {k: v for k, v in weights.items() if not k.endswith("rotary_emb.inv_freq")}


def check_keys(model: nn.Module, weights: Weights, path, what: str, optional=()) -> None:
    """The checkpoint's keys must be exactly the model's (keys in `optional` may be absent), each
    with the shape the config gives."""
    expected = model.state_dict()
    missing = sorted(expected.keys() - weights.keys() - set(optional))
    unexpected = sorted(weights.keys() - expected.keys())
    if missing or unexpected:
        raise SpectraceError(f"checkpoint {path} is not a {what}: missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}")
    for k, v in weights.items():
        if expected[k].is_floating_point() and not v.dtype.is_floating_point:
            raise SpectraceError(f"checkpoint {path}: {k} is stored as "
                                 f"{str(v.dtype)[6:]} (a quantised checkpoint?); "
                                 f"spectrace loads float16, bfloat16 or float32 weights")
        if tuple(v.shape) != tuple(expected[k].shape):
            raise SpectraceError(f"checkpoint {path} does not match its config.json: {k} is "
                                 f"{tuple(v.shape)}, the config makes it "
                                 f"{tuple(expected[k].shape)}")


@contextmanager
def skip_weight_init():
    """Build modules without filling their weights, which the checkpoint replaces anyway: the
    nn.init fills become no-ops while inside (transformers' `no_init_weights` does the same).
    Cheaper than building on the meta device, whose Python-level ops import torch._dynamo
    (about two seconds of a first run)."""
    names = ("uniform_", "normal_", "kaiming_uniform_", "zeros_", "ones_")
    saved = {name: getattr(nn.init, name) for name in names}
    for name in names:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fill in saved.items():
            setattr(nn.init, name, fill)


@contextmanager
def building(dtype: torch.dtype, device):
    """Modules built inside get their parameters on `device` in `dtype`, unfilled: no float32 or
    host copy of a model that runs in bfloat16 on a GPU."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with skip_weight_init():
            if torch.device(device).type == "cpu":
                yield
            else:
                with torch.device(device):
                    yield
    finally:
        torch.set_default_dtype(saved)


def _fill(param: torch.Tensor, stored: torch.Tensor, name: str, path) -> None:
    """param <- stored, refusing a weight that is NaN or infinite anywhere (a corrupted file would
    otherwise decode garbage without a word)."""
    param.copy_(stored)
    if param.is_floating_point() and not bool(torch.isfinite(param).all()):
        raise SpectraceError(f"checkpoint {path}: {name} holds NaN or infinite values")


@torch.no_grad()
def load_weights(model: nn.Module, weights: Weights, path,
                 progress: Progress | None = None) -> None:
    """Every stored tensor into the model's parameter or buffer of its name (keys checked first,
    check_keys): read onto the parameter's device in the stored dtype, then cast there."""
    from safetensors import SafetensorError, safe_open

    params = model.state_dict(keep_vars=True)
    total = sum(s.nbytes(params[k].dtype) for k, s in weights.items())
    done = 0
    by_file: dict[Path, list[tuple[str, Stored]]] = {}
    for name, s in weights.items():
        by_file.setdefault(s.file, []).append((name, s))
    try:
        for file, items in by_file.items():
            device = str(params[items[0][0]].device)
            if file.suffix == ".safetensors":
                with safe_open(file, framework="pt", device=device) as f:
                    for name, s in items:
                        _fill(params[name], f.get_tensor(s.key), name, path)
                        done += s.nbytes(params[name].dtype)
                        if progress:
                            progress(done, total)
            else:
                for name, s in items:
                    _fill(params[name], s.tensor, name, path)
                    done += s.nbytes(params[name].dtype)
            if progress:
                progress(done, total)
    except (OSError, SafetensorError, RuntimeError) as e:
        raise SpectraceError(f"cannot load model from {path}: {first_line(e)}") from None


def finish_loading(build: Callable[[], nn.Module], weights: Weights, target: nn.Module, path,
                   what: str, share_embedding: bool = False, optional=()) -> nn.Module:
    """The tail of every drafter loader: the model built on the target's device in its dtype, keys
    checked strictly, weights loaded. share_embedding: `embed_tokens.weight` may be absent, and then
    the target's embedding is the drafter's, shared (SGLang's `set_embed`; EAGLE's own loader reads
    the target's too). optional: other names that may be absent (their values are the loader's)."""
    p = target.lm_head.weight
    with building(p.dtype, p.device):
        model = build()
    check_keys(model, weights, path, what,
               optional=[*optional, *(["embed_tokens.weight"] if share_embedding else [])])
    if share_embedding and "embed_tokens.weight" not in weights:
        model.embed_tokens = target.model.embed_tokens
    load_weights(model, weights, path)
    return model.eval()


def weights_digest(path: Path) -> str:
    """Short SHA-256 of a checkpoint's weights: the model identity a trace records. Over every
    byte up to FULL_HASH_LIMIT; past it (a real model: 16 GB would cost seconds to hash), over each
    file's name, size and safetensors header (every tensor's name, dtype, shape and offsets)."""
    files = sorted(Path(path).glob("*.safetensors")) + sorted(Path(path).glob("*.bin"))
    h = hashlib.sha256()
    if sum(f.stat().st_size for f in files) <= FULL_HASH_LIMIT:
        for f in files:
            h.update(f.read_bytes())
        return h.hexdigest()[:16]
    for f in files:
        h.update(f"{f.name}:{f.stat().st_size}:".encode())
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little") if f.suffix == ".safetensors" else 1 << 20
            h.update(fh.read(min(n, 1 << 26)))
    return h.hexdigest()[:16]

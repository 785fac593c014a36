"""A run's models (the application layer): found by directory or hub name, checked to fit the device
before a byte is read, loaded with a progress bar, the drafter in its checkpoint's format.

Memory follows SGLang's `--mem-fraction-static`: the static memory (weights, then the KV caches)
may fill that fraction of the device, less what other programs already hold on it:
    room = free now - (1 - fraction) * total
checked once for the weights (their sizes read from the files' headers, in the run's dtype)
before loading, and once for the KV caches after it. On a CPU, free is the kernel's
MemAvailable and total its MemTotal.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch

from spectrace.algos import ALGOS
from spectrace.core.checkpoint import read_weight_file, weight_files, weights_digest
from spectrace.core.drafters.medusa import MedusaHeads
from spectrace.core.model import CausalLM, load_model
from spectrace.errors import SpectraceError
from spectrace.loading.formats import FORMATS
from spectrace.loading.hub import model_dir
from spectrace.loading.tokenizer import Tokenizer

Say = Callable[[str], None]


def find_model(name: str, flag: str) -> str:
    """The model directory `name` gives: a directory, or a hub name from the local cache."""
    path = model_dir(name, flag)
    if not Path(path).is_dir():
        what = "a file, not a model directory" if Path(path).exists() else "no such directory"
        raise SpectraceError(f"{flag} {name}: {what}")
    if not (Path(path) / "config.json").is_file():
        raise SpectraceError(f"{flag} {name}: not a Hugging Face model directory (no config.json)")
    return path


def _meminfo(field: str) -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def room(device: str, fraction: float) -> int:
    """Bytes the run may still take on `device`: free now, less (1 - fraction) of the total."""
    if device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info(torch.device(device))
    else:
        try:
            free, total = _meminfo("MemAvailable"), _meminfo("MemTotal")
        except (OSError, StopIteration, ValueError):
            free = total = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(free - (1 - fraction) * total)


def check_fits(need: int, device: str, fraction: float, what: str) -> None:
    """One line when `need` bytes do not fit in the room `--mem-fraction-static` leaves."""
    have = room(device, fraction)
    if need > have:
        raise SpectraceError(f"{what} would need {need / 2**30:.1f} GiB on {device}, where "
                             f"{max(have, 0) / 2**30:.1f} GiB is free within --mem-fraction-static {fraction}")


def weight_bytes(path: str, dtype: torch.dtype) -> int:
    """Bytes a checkpoint's weights take once loaded in `dtype`, from its files' headers alone."""
    try:
        files = weight_files(Path(path))
    except SpectraceError:  # Medusa's medusa_lm_head.safetensors
        files = [f for f in sorted(Path(path).glob("*.safetensors")) if f.is_file()]
    try:
        return sum(s.nbytes(dtype) for f in files for s in read_weight_file(f).values())
    except Exception:  # noqa: BLE001 -- an unreadable file: its loader says what is wrong with it
        return 0


def progress_bar(say: Say | None, what: str) -> Callable[[int, int], None] | None:
    """load_model's progress callback drawing `what`'s bar on the status line, a step a percent."""
    if say is None:
        return None
    shown = [-1]

    def report(done: int, total: int) -> None:
        percent = done * 100 // max(total, 1)
        if percent != shown[0]:
            shown[0] = percent
            bar = "#" * (percent // 5) + "." * (20 - percent // 5)
            say(f"loading {what}: [{bar}] {percent:3d}% of {total / 2**30:.2f} GiB")
    return report


def load_drafter_model(algo: str, path: str, target: CausalLM, tok: Tokenizer, dtype, device):
    """The draft LM (standalone) or the draft head that reads target features (the others), on the
    target's device in its dtype, by its checkpoint format's loader (formats.py)."""
    return FORMATS[ALGOS[algo].checkpoint].load(path, target, tok, dtype, device)


def load_models(target_path: str, draft_path: str | None, algo: str, tok: Tokenizer, dtype: torch.dtype, device: str,
                backend: str, fraction: float, say: Say | None = None, loaded: dict | None = None):
    """(target, drafter model or None) of a run, each checked to fit before it loads. loaded: models
    kept from earlier runs of the process, by where they load from and how they run (the fast
    engine fuses a model's layers in place, so a backend keeps its own)."""
    loaded = {} if loaded is None else loaded
    key = (target_path, dtype, device, backend)
    draft_key = (*key, ALGOS[algo].checkpoint, draft_path)
    need = (weight_bytes(target_path, dtype) if key not in loaded else 0) + \
        (weight_bytes(draft_path, dtype) if draft_path and draft_key not in loaded else 0)
    check_fits(need, device, fraction, f"the weights in {str(dtype)[6:]}")
    if key not in loaded:
        if say:
            say("loading the target")
        loaded[key] = load_model(target_path, dtype, device, progress_bar(say, "the target"))
    if draft_path and draft_key not in loaded:
        if say:
            say("loading the draft model")
        loaded[draft_key] = load_drafter_model(algo, draft_path, loaded[key], tok, dtype, device)
    return loaded[key], loaded[draft_key] if draft_path else None


def drop_drafters(loaded: dict) -> None:
    """Forget the drafter models a `loaded` cache of load_models keeps; its targets stay."""
    for key in [k for k in loaded if len(k) > 4]:  # a drafter's key extends its target's (load_models)
        del loaded[key]


def model_identity(path: str, model, name: str | None = None) -> dict:
    """What a trace records of a model: its directory (and the hub name it was asked by), weights'
    digest, class and shape."""
    ident = {"path": str(path), "weights_sha256": weights_digest(Path(path)), "class": type(model).__name__,
             "params": sum(p.numel() for p in model.parameters()), "dtype": str(next(model.parameters()).dtype)}
    if name is not None and name != str(path):
        ident["hub_name"] = name
    if isinstance(model, MedusaHeads):  # no transformer layers: heads over the target's hidden state
        return {**ident, "model_type": "medusa", "heads": model.num_heads, "layers_per_head": model.num_layers}
    c = model.config
    return {**ident, "model_type": c.model_type, "layers": len(model.layers), "hidden_size": c.hidden_size,
            "vocab_size": c.vocab_size}

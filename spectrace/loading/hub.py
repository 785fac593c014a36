"""`--target-model ORG/NAME`: a hub name resolved from the local Hugging Face cache, never over the
network (the application layer).

huggingface_hub lays a downloaded repository out as `<cache>/models--ORG--NAME/` with
`refs/main` naming a commit and `snapshots/<commit>/` holding its files; `snapshot_download(...,
local_files_only=True)` reads that and nothing else. The cache is `HF_HUB_CACHE`, else
`$HF_HOME/hub`, else `~/.cache/huggingface/hub`, as every tool of the hub reads it. A name not
there gets one line: where it looked, and the command that downloads it.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from spectrace.errors import SpectraceError

REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # ORG/NAME, as the hub spells repository ids


def hub_cache() -> Path:
    """The cache directory, read from the environment at each call (huggingface_hub's constants
    are read once, when it is first imported)."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")).expanduser()


def model_dir(name: str, flag: str) -> str:
    """The directory of --target-model / --draft-model `name`: itself if it exists, else the
    cached snapshot of the hub repository it names (local files only: no network call)."""
    if Path(name).exists() or not REPO_ID.fullmatch(name) or ".." in name:
        return name  # a path (the run checks it is a model directory)
    from huggingface_hub import errors, snapshot_download

    incomplete = getattr(errors, "IncompleteSnapshotError", ())  # huggingface_hub 1.22 and later
    cache = hub_cache()
    try:
        return snapshot_download(name, cache_dir=cache, local_files_only=True)
    except incomplete:
        raise SpectraceError(f"{flag} {name}: only part of it is in the Hugging Face cache at {cache}; "
                             f"finish the download with: hf download {name}") from None
    except (FileNotFoundError, ValueError):
        raise SpectraceError(f"{flag} {name}: no such directory, and not in the Hugging Face cache at {cache}; "
                             f"download it with: hf download {name}") from None

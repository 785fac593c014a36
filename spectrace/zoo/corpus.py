"""The pinned training corpus of the embedded models: CPython's standard library as source code.

The corpus is a list of files pinned by relative path and SHA-256 in `corpus_manifest.tsv`, taken
from CPython 3.11.7's `Lib/` directory (`test/` packages included; `site-packages`, `idlelib`,
files over 512 KB and files that are not UTF-8 left out). Another Python version ships other
files, so training elsewhere points `--stdlib` at a copy of 3.11.7's `Lib/` (the source tarball
has one, or `python -m spectrace.zoo.corpus pack` makes one here) and every hash is checked.

    python -m spectrace.zoo.corpus manifest --stdlib DIR   # (re)write the manifest from DIR
    python -m spectrace.zoo.corpus pack --stdlib DIR --out corpus/Lib   # copy the pinned files
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

MANIFEST = Path(__file__).with_name("corpus_manifest.tsv")
MAX_FILE_BYTES = 512 * 1024
HELD_OUT_EVERY = 20  # ~5% of files, chosen by a hash of the path so the split never moves
EXCLUDED_DIRS = {"site-packages", "idlelib", "__pycache__"}


class CorpusError(Exception):
    pass


@dataclass(frozen=True)
class CorpusFile:
    path: str  # relative to Lib/, with forward slashes
    sha256: str
    split: str  # "train" or "heldout"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split_of(path: str) -> str:
    """Held-out files are picked by a hash of the path, never of the content or an RNG."""
    return "heldout" if int(_sha256(path.encode())[:8], 16) % HELD_OUT_EVERY == 0 else "train"


def scan(stdlib: Path) -> list[CorpusFile]:
    """Every eligible .py file under `stdlib`, sorted by path."""
    files = []
    for p in sorted(stdlib.rglob("*.py")):
        rel = p.relative_to(stdlib).as_posix()
        if EXCLUDED_DIRS & set(rel.split("/")[:-1]):
            continue
        data = p.read_bytes()
        if len(data) > MAX_FILE_BYTES:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        files.append(CorpusFile(rel, _sha256(data), split_of(rel)))
    return files


def write_manifest(files: list[CorpusFile], path: Path | None = None) -> None:
    lines = ["path\tsha256\tsplit"] + [f"{f.path}\t{f.sha256}\t{f.split}" for f in files]
    (path or MANIFEST).write_text("\n".join(lines) + "\n")


def read_manifest(path: Path | None = None) -> list[CorpusFile]:
    rows = (path or MANIFEST).read_text().splitlines()[1:]
    return [CorpusFile(*row.split("\t")) for row in rows]


def load(stdlib: Path, manifest: Path | None = None) -> dict[str, list[str]]:
    """Texts of the pinned files by split; raises CorpusError unless every hash matches."""
    stdlib = Path(stdlib)
    if not stdlib.is_dir():
        raise CorpusError(f"--stdlib {stdlib} is not a directory")
    texts: dict[str, list[str]] = {"train": [], "heldout": []}
    bad = []
    for f in read_manifest(manifest):
        p = stdlib / f.path
        data = p.read_bytes() if p.is_file() else b""
        if _sha256(data) != f.sha256:
            bad.append(f.path)
            continue
        texts[f.split].append(data.decode("utf-8"))
    if bad:
        raise CorpusError(
            f"{len(bad)} pinned files are missing or differ under {stdlib} (first: {bad[0]}); "
            "point --stdlib at CPython 3.11.7's Lib/ directory"
        )
    return texts


def pack(stdlib: Path, out: Path, manifest: Path | None = None) -> int:
    """Copy the pinned files (after checking them) to `out`, e.g. to carry to another machine."""
    load(stdlib, manifest)
    files = read_manifest(manifest)
    for f in files:
        dst = out / f.path
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(stdlib) / f.path, dst)
    return len(files)


def default_stdlib() -> Path:
    import sysconfig

    return Path(sysconfig.get_paths()["stdlib"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spectrace.zoo.corpus")
    ap.add_argument("command", choices=["manifest", "check", "pack"])
    ap.add_argument("--stdlib", type=Path, default=default_stdlib())
    ap.add_argument("--out", type=Path, default=Path("corpus/Lib"))
    args = ap.parse_args(argv)
    try:
        if args.command == "manifest":
            files = scan(args.stdlib)
            write_manifest(files)
            print(f"wrote {MANIFEST} ({len(files)} files)")
        elif args.command == "check":
            texts = load(args.stdlib)
            n = {k: len(v) for k, v in texts.items()}
            mb = sum(len(t) for v in texts.values() for t in v) / 1e6
            print(f"corpus ok: {n['train']} train files, {n['heldout']} held-out files, {mb:.1f} MB")
        else:
            n = pack(args.stdlib, args.out)
            print(f"copied {n} pinned files to {args.out}")
    except CorpusError as e:
        print(f"corpus: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

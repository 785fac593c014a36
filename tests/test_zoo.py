"""The embedded-model scripts: corpus pinning and a seconds-long training smoke."""
import hashlib

import pytest
import torch

from spectrace.core.batch import ForwardBatch
from spectrace.core.model import load_model
from spectrace.zoo import corpus, train


def _mini_stdlib(tmp_path):
    lib = tmp_path / "Lib"
    (lib / "pkg").mkdir(parents=True)
    (lib / "a.py").write_text("def a():\n    return 1\n" * 50)
    (lib / "pkg" / "b.py").write_text("class B:\n    x = 2\n" * 50)
    (lib / "site-packages").mkdir()
    (lib / "site-packages" / "c.py").write_text("skipped = True\n")
    return lib


def test_manifest_pins_files_by_hash(tmp_path):
    lib = _mini_stdlib(tmp_path)
    files = corpus.scan(lib)
    assert [f.path for f in files] == ["a.py", "pkg/b.py"]
    assert files[0].sha256 == hashlib.sha256((lib / "a.py").read_bytes()).hexdigest()
    manifest = tmp_path / "m.tsv"
    corpus.write_manifest(files, manifest)
    texts = corpus.load(lib, manifest)
    assert sum(map(len, texts.values())) == 2
    (lib / "a.py").write_text("changed\n")
    with pytest.raises(corpus.CorpusError, match="1 pinned files are missing or differ .*first: a.py"):
        corpus.load(lib, manifest)


def test_training_smoke_writes_a_loadable_checkpoint(tmp_path, monkeypatch):
    lib = _mini_stdlib(tmp_path)
    files = corpus.scan(lib)
    files = [corpus.CorpusFile(f.path, f.sha256, s) for f, s in zip(files, ["train", "heldout"])]
    manifest = tmp_path / "m.tsv"
    corpus.write_manifest(files, manifest)
    monkeypatch.setattr(corpus, "MANIFEST", manifest)
    out = tmp_path / "model"
    assert train.main(["--model", "target", "--stdlib", str(lib), "--out", str(out), "--smoke",
                       "--steps", "3", "--batch", "2", "--seq-len", "32", "--eval-every", "3",
                       "--device", "cpu"]) == 0
    model = load_model(out)
    kv = model.new_kv_cache("target", "sglang", 8, 1, 8)
    logits = model(ForwardBatch.build(kv, [(0, 0, [1, 2, 3])]), kv).logits
    assert logits.shape == (3, model.config.vocab_size) and torch.isfinite(logits).all()
    assert (out / "README.md").is_file()


def test_head_training_smoke_writes_loadable_heads(tmp_path, monkeypatch, target):
    from spectrace.loading.formats import FORMATS
    from spectrace.zoo import train_eagle

    lib = _mini_stdlib(tmp_path)
    files = [corpus.CorpusFile(f.path, f.sha256, s) for f, s in zip(corpus.scan(lib), ["train", "heldout"])]
    manifest = tmp_path / "m.tsv"
    corpus.write_manifest(files, manifest)
    monkeypatch.setattr(corpus, "MANIFEST", manifest)
    for kind in train_eagle.KINDS:
        out = tmp_path / kind
        assert train_eagle.main(["--kind", kind, "--stdlib", str(lib), "--out", str(out), "--smoke", "--steps", "2",
                                 "--batch", "2", "--seq-len", "32", "--eval-every", "2", "--device", "cpu",
                                 "--draft-vocab", "64"]) == 0
        head = FORMATS[kind].load(out, target, None, torch.float32, "cpu")
        assert (out / "README.md").is_file() and sum(p.numel() for p in head.parameters()) > 0


def test_the_run_reads_the_tokenizer_as_transformers_does(tokenizer):
    """spectrace.run reads tokenizer.json with the `tokenizers` library: the same ids and text
    as transformers' AutoTokenizer, on the held-out prompts and on every single token."""
    from spectrace.run import load_tokenizer
    from spectrace.zoo import TARGET_DIR
    from spectrace.zoo.prompts import HELD_OUT_PROMPTS, REPEATING_PROMPTS

    tok = load_tokenizer(str(TARGET_DIR))
    for text in HELD_OUT_PROMPTS + REPEATING_PROMPTS + ["x", "  \n\t\u00e9\u4e2d <|endoftext|>"]:
        assert tok.encode(text) == tokenizer.encode(text, add_special_tokens=False)
        assert tok.decode(tok.encode(text)) == tokenizer.decode(tokenizer.encode(text, add_special_tokens=False))
    assert all(tok.decode([i]) == tokenizer.decode([i]) for i in range(len(tok.vocab)))
    assert tok.vocab == tokenizer.get_vocab() and tok.eos_token_id == tokenizer.eos_token_id

"""Byte-level BPE tokenizer of the embedded models, trained on the pinned corpus's train split.

    python -m spectrace.zoo.tokenizer --stdlib DIR    # writes spectrace/zoo/tokenizer/
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spectrace.zoo import corpus

TOKENIZER_DIR = Path(__file__).with_name("tokenizer")
EOS = "<|endoftext|>"  # separates files in training; generation stops on it
VOCAB_SIZE = 4096


def train(texts: list[str], vocab_size: int = VOCAB_SIZE):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],  # id 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save(tok, out: Path) -> None:
    """Saved as a transformers fast tokenizer so `AutoTokenizer.from_pretrained(out)` loads it."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS)
    fast.save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spectrace.zoo.tokenizer")
    ap.add_argument("--stdlib", type=Path, default=corpus.default_stdlib())
    ap.add_argument("--out", type=Path, default=TOKENIZER_DIR)
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = ap.parse_args(argv)
    try:
        texts = corpus.load(args.stdlib)["train"]
    except corpus.CorpusError as e:
        print(f"tokenizer: error: {e}", file=sys.stderr)
        return 2
    save(train(texts, args.vocab_size), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

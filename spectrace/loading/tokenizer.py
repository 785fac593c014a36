"""The target's tokenizer as a run uses it (the application layer): prompts as the model expects
them, output text, and each token's piece as people can read it.

    encode(text)   the prompt as SGLang's /generate and vLLM's generate() tokenize text: with the
                   special tokens the tokenizer adds itself (Llama 3's <|begin_of_text|>)
    chat(text)     a checkpoint with a chat template: the text as one user turn through it, with
                   the assistant's header after (SGLang's chat endpoint; `--raw-prompt` skips it)
    piece(id)      one token's text; byte-level BPE pieces that are part of a UTF-8 character
                   (emoji, CJK) read as their bytes, `<0xE4><0xB8>`, where decoding alone gives '\ufffd'

A plain `tokenizer.json` is read with the `tokenizers` library, which transformers' fast
tokenizers wrap (fast to load); a tokenizer with Python-side behaviour of its own (a
`tokenizer_class` other than the generic one), and every chat template, go through
transformers' AutoTokenizer, from local files only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Callable

from spectrace.errors import SpectraceError, first_line

GENERIC_TOKENIZERS = (None, "PreTrainedTokenizerFast", "TokenizersBackend")


@cache
def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (`bytes_to_unicode`) read backwards: the character that
    stands for each byte in a byte-level BPE vocabulary -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def readable(data: bytes) -> str:
    """UTF-8 text with every byte that is not part of a whole character written <0xNN>."""
    text = data.decode("utf-8", errors="surrogateescape")
    return "".join(f"<0x{ord(c) - 0xDC00:02X}>" if 0xDC80 <= ord(c) <= 0xDCFF else c for c in text)


@dataclass
class Tokenizer:
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    vocab: dict[str, int]
    eos_token_id: int | None
    id_to_token: Callable[[int], str | None]
    path: Path

    @property
    def has_chat_template(self) -> bool:
        """transformers' rule: chat_template.jinja first, else tokenizer_config.json's chat_template."""
        if (self.path / "chat_template.jinja").is_file():
            return True
        conf = self.path / "tokenizer_config.json"
        return conf.is_file() and bool(json.loads(conf.read_text(encoding="utf-8")).get("chat_template"))

    @cached_property
    def templating(self):
        """transformers' tokenizer of the directory: the one that renders its chat template."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.path, local_files_only=True)

    def chat(self, text: str) -> list[int]:
        """`text` as one user turn of the chat template, the assistant's turn opened after it."""
        try:
            ids = self.templating.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                      tokenize=True, return_dict=False)
        except Exception as e:  # noqa: BLE001 -- a template is a program: it may raise anything
            raise SpectraceError(f"the chat template of {self.path} fails: {first_line(e)}"
                                 " (--raw-prompt sends the text as it is)") from None
        return list(ids)

    def piece(self, token_id: int) -> str:
        """The token's text; a byte-level piece that decodes to no whole character, as its bytes."""
        text = self.decode([token_id])
        if "\ufffd" not in text:
            return text
        stored, chars = self.id_to_token(token_id), byte_decoder()
        if stored and all(c in chars for c in stored):
            return readable(bytes(chars[c] for c in stored))
        return stored or text  # SentencePiece's byte tokens are named <0xNN> already


def load_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    conf_file = path / "tokenizer_config.json"
    try:
        conf = json.loads(conf_file.read_text(encoding="utf-8")) if conf_file.is_file() else {}
        if (path / "tokenizer.json").is_file() and conf.get("tokenizer_class") in GENERIC_TOKENIZERS:
            from tokenizers import Tokenizer as Fast

            fast = Fast.from_file(str(path / "tokenizer.json"))
            eos = conf.get("eos_token")
            eos = eos.get("content") if isinstance(eos, dict) else eos
            return Tokenizer(lambda text: fast.encode(text, add_special_tokens=True).ids,
                             lambda ids: fast.decode(ids, skip_special_tokens=False), fast.get_vocab(),
                             fast.token_to_id(eos) if eos else None, fast.id_to_token, path)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        return Tokenizer(lambda text: tok.encode(text, add_special_tokens=True), tok.decode, tok.get_vocab(),
                         tok.eos_token_id, tok.convert_ids_to_tokens, path)
    except Exception as e:  # noqa: BLE001 -- the tokenizers library raises plain Exception on a bad file
        raise SpectraceError(f"no usable tokenizer in {path}: {first_line(e)}") from None

"""A Hugging Face tokenizer directory for any model relaykv serves (docs/benchmarking.md).

Third-party clients (`vllm bench serve --tokenizer DIR`, SGLang's `bench_serving.py
--tokenizer DIR`, anything calling `transformers.AutoTokenizer.from_pretrained(DIR)`) need
a tokenizer on disk, offline. `export_tokenizer` writes one that encodes exactly as the
server does:

* `tokenizer.json`: the model's `tokenizers` tokenizer (from tokenizer.json or built from
  GGUF metadata) with a post-processor that adds BOS where relaykv's encoder adds it; for
  tiny-hybrid's byte tokenizer an equivalent BPE with byte fallback and no merges (ids 0
  `<pad>`, 1 `<s>`, 2 `</s>`, byte b = b + 3).
* `tokenizer_config.json`: `PreTrainedTokenizerFast`, the BOS / EOS / pad strings, the
  context length and the chat template the server renders (the model's own, Gemma-3's, or
  the plain fallback written as a template), so `apply_chat_template` gives the server's
  prompt text.

Text that spells a special token (`<s>`) is that special token for transformers; relaykv's
byte tokenizer encodes it as bytes. Nothing else differs (tests compare both encoders).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, processors
from tokenizers.models import BPE

from relaykv.model.text.chat_template import FALLBACK_TEMPLATE, ChatFormatter

STAMP = "relaykv_export.json"  # what was exported from, to reuse an up-to-date directory
# Bumped when what an export writes changes, so cached exports are rewritten
# (2: tiny-hybrid's bytes 0x80-0xFF are special, see byte_tokenizer_json).
EXPORT_FORMAT = 2


class ExportError(ValueError):
    """This model's tokenizer cannot be written as a Hugging Face directory."""


@dataclass(frozen=True, slots=True)
class TokenizerExport:
    """What the server knows about its tokenizer, enough to write the directory."""

    tokenizer: Any  # relaykv's tokenizer: ByteTokenizer or HFTokenizer (`.model`)
    chat: ChatFormatter
    model_max_length: int
    source: str


HIGH_BYTES = tuple(f"<0x{b:02X}>" for b in range(0x80, 0x100))


def byte_tokenizer_json() -> Tokenizer:
    """tiny-hybrid's ByteTokenizer as a `tokenizers` tokenizer (same ids, BOS added)."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": b + 3 for b in range(256)})
    tok = Tokenizer(BPE(vocab, [], byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    # Bytes 0x80-0xFF are listed as special too. Alone they are not text (every one decodes
    # to U+FFFD, 3 bytes when encoded again), and benchmark clients draw random prompt ids
    # from the vocabulary minus the special ids, then send the decoded text: vLLM's `random`
    # and `prefix_repetition`, SGLang's `random`. Excluded, every drawn id is an ASCII byte,
    # which survives decode + encode, so prompts have exactly the asked length. Encoding is
    # unchanged (byte fallback still yields these ids for non-ASCII text); decoding needs
    # `skip_special_tokens=False` to keep non-ASCII characters (docs/benchmarking.md).
    names = ["<pad>", "<s>", "</s>", *HIGH_BYTES]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in names])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)]
    )
    return tok


def _token(tok: Tokenizer, token_id: int | None) -> str | None:
    return None if token_id is None else tok.id_to_token(token_id)


def build(export: TokenizerExport) -> tuple[Tokenizer, dict[str, Any]]:
    """(tokenizer.json content, tokenizer_config.json content)."""
    source = export.tokenizer
    if hasattr(source, "model") and isinstance(source.model, Tokenizer):
        tok = Tokenizer.from_str(source.model.to_str())
        bos_id = getattr(source, "bos_token_id", None)
        if getattr(source, "add_bos", False) and bos_id is not None:
            bos = tok.id_to_token(bos_id)
            tok.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, bos_id)]
            )
        eos_ids = list(source.eos_token_ids)
        pad, extra = None, []
    elif type(source).__name__ == "ByteTokenizer":
        tok, bos_id, eos_ids, pad = byte_tokenizer_json(), 1, [2], "<pad>"
        extra = list(HIGH_BYTES)  # transformers' all_special_ids: see byte_tokenizer_json
    else:
        raise ExportError(f"no Hugging Face form for tokenizer {type(source).__name__}")
    chat_source = export.chat.source
    template = chat_source.template if chat_source is not None else FALLBACK_TEMPLATE
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": _token(tok, bos_id),
        "eos_token": _token(tok, eos_ids[0] if eos_ids else None),
        "pad_token": pad,
        "model_max_length": export.model_max_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": template,
        "extra_special_tokens": extra or None,
        "relaykv_source": export.source,
    }
    return tok, {k: v for k, v in config.items() if v is not None}


def export_tokenizer(export: TokenizerExport, out: str | Path) -> Path:
    """Write tokenizer.json + tokenizer_config.json (+ special_tokens_map.json) under `out`."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    tok, config = build(export)
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False))
    specials = {k: config[k] for k in ("bos_token", "eos_token", "pad_token") if k in config}
    (root / "special_tokens_map.json").write_text(json.dumps(specials, indent=1))
    return root


def cached_export(export: TokenizerExport, root: Path, key: dict[str, Any]) -> Path:
    """`export_tokenizer` into `root` unless it already holds an export for `key`."""
    stamp = root / STAMP
    try:
        if json.loads(stamp.read_text()) == key and (root / "tokenizer.json").is_file():
            return root
    except (OSError, ValueError):
        pass
    export_tokenizer(export, root)
    stamp.write_text(json.dumps(key))
    return root

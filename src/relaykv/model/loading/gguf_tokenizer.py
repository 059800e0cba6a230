"""Build a `tokenizers` tokenizer from GGUF metadata (no tokenizer.json in a GGUF file).

* `gpt2` vocabularies (SmolLM2): byte-level BPE from the stored tokens and merges.
* `llama` vocabularies (SentencePiece, Gemma-3): BPE with byte fallback. The file stores
  no merges, so they are derived from the vocabulary: every split of a token into two
  tokens is a merge, ranked by the merged token's priority (for Gemma the order of the
  vocabulary, whose scores do not follow the merge order; otherwise the score).
Control tokens (token type 3: `<bos>`, `<start_of_turn>`, `<end_of_turn>`) become special
added tokens, which decoding skips. User-defined tokens (type 4) become added tokens that are
NOT special: in Gemma they are text (`\n` id 107, `\n\n`, runs of spaces and tabs), and
marking them special made decoding drop every newline (docs/serving.md "Gemma-3-270M chat").
This is what transformers' GGUF converter does too.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from relaykv.model.loading.tokenizer import HFTokenizer

_CONTROL, _USER_DEFINED = 3, 4


def _spm_merges(tokens: list[str], rank: dict[str, float]) -> list[tuple[str, str]]:
    """Merges implied by a SentencePiece vocabulary, best first."""
    index = {t: i for i, t in enumerate(tokens)}
    found = []
    for token, priority in rank.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in index and right in index:
                found.append((priority, index[left], index[right], left, right))
    found.sort(key=lambda m: (m[0], len(m[3]), len(m[4]), m[1], m[2]))
    return [(m[3], m[4]) for m in found]


def _added(tokens: list[str], types: list[int] | None) -> list[AddedToken]:
    """Control tokens as special added tokens, user-defined ones as plain added tokens."""
    if not types:
        return []
    return [
        AddedToken(tokens[i], special=t == _CONTROL, normalized=False)
        for i, t in enumerate(types)
        if t in (_CONTROL, _USER_DEFINED)
    ]


def build_gguf_tokenizer(meta: dict[str, Any], architecture: str) -> HFTokenizer:
    """A tokenizer from `tokenizer.ggml.*` metadata values (already decoded to Python)."""
    return wrap_gguf_tokenizer(build_gguf_model(meta, architecture), meta)


def wrap_gguf_tokenizer(model: Tokenizer, meta: dict[str, Any]) -> HFTokenizer:
    """The runtime tokenizer around `model` with the metadata's BOS and EOS."""
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return HFTokenizer(
        model,
        [int(eos)] if eos is not None else [],
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    )


def build_gguf_model(meta: dict[str, Any], architecture: str) -> Tokenizer:
    """The `tokenizers` model the metadata describes (the slow part: merges for `llama`)."""
    kind = meta.get("tokenizer.ggml.model")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types = meta.get("tokenizer.ggml.token_type")
    if kind == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        model = BPE({t: i for i, t in enumerate(tokens)}, merges)
        tok = Tokenizer(model)
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if meta.get("tokenizer.ggml.pre") == "smollm":
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), byte_level]
            )
        else:
            tok.pre_tokenizer = byte_level
        tok.decoder = decoders.ByteLevel()
    elif kind == "llama":
        gemma = architecture.startswith("gemma")
        # Gemma files spell whitespace-only tokens with real spaces; the normalizer turns
        # spaces into U+2581, so spell them that way too.
        tokens = ["\u2581" * len(t) if t and not t.strip(" ") else t for t in tokens]
        if gemma:
            rank = {t: float(i) for i, t in enumerate(tokens)}
        else:
            scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
            rank = {t: -float(s) for t, s in zip(tokens, scores, strict=True)}
        unk_id = meta.get("tokenizer.ggml.unknown_token_id")
        unk = tokens[unk_id] if unk_id is not None else None
        model = BPE(
            {t: i for i, t in enumerate(tokens)},
            _spm_merges(tokens, rank),
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
        tok = Tokenizer(model)
        steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        if gemma or not meta.get("tokenizer.ggml.add_space_prefix", True):
            tok.normalizer = normalizers.Replace(" ", "\u2581")
        else:
            tok.normalizer = normalizers.Sequence(
                [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
            )
            steps.append(decoders.Strip(" ", 1, 0))
        tok.decoder = decoders.Sequence(steps)
    else:
        raise ValueError(f"unsupported GGUF tokenizer model {kind!r} (supported: gpt2, llama)")
    added = _added(tokens, types)
    tok.add_special_tokens([t for t in added if t.special])
    tok.add_tokens([t for t in added if not t.special])
    return tok

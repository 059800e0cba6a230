"""Chat prompts: the model's own chat template when it has one, a plain fallback otherwise.

Where templates live (as Hugging Face and llama.cpp store them):
* a model directory: `chat_template.jinja`, else `tokenizer_config.json` `chat_template`
  (a string, or a list of `{"name", "template"}` of which `default` is used); the BOS and
  EOS strings come from that file's `bos_token` / `eos_token` (a string or `{"content"}`);
* a GGUF file: metadata `tokenizer.chat_template`, BOS/EOS strings from
  `tokenizer.ggml.tokens` at `tokenizer.ggml.bos_token_id` / `eos_token_id`;
* neither, for a family relaykv knows (Gemma-3: the packaged GGUF has none): the family's
  documented template (`relaykv.model.text.builtin_chat_templates`), with its end-of-turn token.

Templates are rendered with jinja2's immutable sandbox (trim_blocks, lstrip_blocks,
`raise_exception`, `strftime_now`, as transformers does). A template that emits the BOS
string itself is rendered without it and exactly one BOS id is put in front, so encoders that
add BOS do not double it.

Fallback (no template, e.g. tiny-hybrid, or jinja2 missing): one line per message,
`{role}: {content}`, then `assistant:` when a generation prompt is asked for, e.g.
`"system: Be brief.\nuser: Hi\nassistant:"`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ChatTemplateError(ValueError):
    """The template refused the messages (its `raise_exception`) or failed to render."""


@dataclass(frozen=True, slots=True)
class TemplateSource:
    template: str
    bos_token: str | None = None
    eos_token: str | None = None
    origin: str = ""
    stop_tokens: tuple[str, ...] = ()  # token texts that end a turn besides EOS


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _builtin(
    architecture: Any, bos: str | None, eos: str | None, where: str
) -> TemplateSource | None:
    from relaykv.model.text.builtin_chat_templates import BUILTIN

    found = BUILTIN.get(str(architecture))
    if found is None:
        return None
    template, stops = found
    origin = f"{architecture}'s documented template ({where} carries none)"
    return TemplateSource(template, bos, eos, origin, stops)


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def _from_hf_dir(root: Path) -> TemplateSource | None:
    config_file = root / "tokenizer_config.json"
    config = _json(config_file)
    template: Any = None
    origin = ""
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        template, origin = jinja_file.read_text(), str(jinja_file)
    elif config.get("chat_template"):
        template, origin = config["chat_template"], f"{config_file} chat_template"
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
    bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
    if not isinstance(template, str) or not template:
        model_type = _json(root / "config.json").get("model_type")
        return _builtin(model_type, bos or "<bos>", eos, str(root))
    return TemplateSource(template, bos, eos, origin)


def _from_gguf(path: Path) -> TemplateSource | None:
    # relaykv's own header reader: `gguf.GGUFReader` takes ~15 s over Gemma's 262k-token
    # vocabulary, and this ran at every engine start (model/loading/gguf_header.py).
    from relaykv.model.loading.gguf_header import GGUFHeader

    meta = GGUFHeader(path).metadata
    tokens = meta.get("tokenizer.ggml.tokens")

    def token(key: str) -> str | None:
        index = meta.get(key)
        if not isinstance(tokens, list) or not isinstance(index, int):
            return None
        return str(tokens[index]) if 0 <= index < len(tokens) else None

    bos, eos = token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")
    template = meta.get("tokenizer.chat_template")
    if template is None:
        return _builtin(meta.get("general.architecture"), bos, eos, str(path))
    return TemplateSource(str(template), bos, eos, f"{path} tokenizer.chat_template")


def find_chat_template(source: str | Path) -> TemplateSource | None:
    """The chat template stored with a model directory or GGUF file (None: none found)."""
    path = Path(source)
    if path.is_dir():
        return _from_hf_dir(path)
    if path.is_file() and path.suffix == ".gguf":
        return _from_gguf(path)
    return None


def message_text(content: Any) -> str:
    """A message's text: a string, or the `text` parts of a content list joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ChatTemplateError(f"only text content parts are supported, got {kind!r}")
        parts.append(str(part.get("text", "")))
    return "\n".join(parts)


# The fallback as a chat template (what `relaykv tokenizer export` writes for models without
# one): the same text as `fallback_prompt`, after the BOS string the encoder adds anyway.
FALLBACK_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}"
    "{% elif m['content'] %}{% for p in m['content'] %}"
    "{% if not loop.first %}{{ '\\n' }}{% endif %}{{ p['text'] }}{% endfor %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}"
    "{% if messages %}{{ '\\n' }}{% endif %}assistant:{% endif %}"
)


def fallback_prompt(messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    lines = [f"{m['role']}: {message_text(m.get('content'))}" for m in messages]
    if add_generation_prompt:
        lines.append("assistant:")
    return "\n".join(lines)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatFormatter:
    """Messages -> prompt text -> token ids for one model."""

    def __init__(
        self,
        tokenizer: TextTokenizer | None,
        source: TemplateSource | None = None,
        bos_token_id: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.source = source
        self.bos_token_id = bos_token_id
        self._compiled: Any = None
        if source is not None:
            try:
                from jinja2.ext import loopcontrols
                from jinja2.sandbox import ImmutableSandboxedEnvironment
            except ImportError:
                log.warning("jinja2 is not installed: using the plain chat fallback")
                self.source = None
            else:
                env = ImmutableSandboxedEnvironment(
                    trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
                )
                env.globals["raise_exception"] = _raise_exception
                env.globals["strftime_now"] = _strftime_now
                self._compiled = env.from_string(source.template)

    @property
    def description(self) -> str:
        if self.source is None:
            return "plain fallback ('role: content' lines, then 'assistant:')"
        return f"template from {self.source.origin}"

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        extra: dict[str, Any] | None = None,
    ) -> str:
        if self._compiled is None:
            return fallback_prompt(messages, add_generation_prompt)
        assert self.source is not None
        normalized = [{**m, "content": message_text(m.get("content"))} for m in messages]
        variables = {
            **(extra or {}),
            "messages": normalized,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.source.bos_token or "",
            "eos_token": self.source.eos_token or "",
        }
        try:
            return self._compiled.render(**variables)
        except ChatTemplateError:
            raise
        except Exception as exc:  # a template bug or unexpected messages: the request's fault
            raise ChatTemplateError(f"the chat template failed: {exc}") from exc

    def encode(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        extra: dict[str, Any] | None = None,
    ) -> list[int]:
        if self.tokenizer is None:
            raise ChatTemplateError("this model has no tokenizer; chat needs one")
        text = self.render(messages, add_generation_prompt, extra)
        bos = self.source.bos_token if self.source is not None else None
        if bos and text.startswith(bos):
            ids = self.tokenizer.encode(text[len(bos) :])
            if self.bos_token_id is not None and (not ids or ids[0] != self.bos_token_id):
                ids = [self.bos_token_id, *ids]
            return ids
        return self.tokenizer.encode(text)

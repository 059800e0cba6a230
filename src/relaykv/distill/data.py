"""Building a recipe's corpus shard by shard (resumable; progress on stderr)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from relaykv.distill.corpus import Shard, load_shard, save_shard
from relaykv.distill.generate import (
    continue_batch,
    generated_shard,
    greedy_picker,
    sampling_picker,
)
from relaykv.distill.labels import ShortlistHead
from relaykv.distill.loop_text import loop_windows
from relaykv.distill.prefill import text_shard
from relaykv.distill.prompts import OPENERS
from relaykv.distill.recipes import Recipe
from relaykv.distill.text_corpus import text_windows
from relaykv.model import LoadedModel
from relaykv.model.loading.tokenizer import Tokenizer


class PromptSource:
    """A recipe's generation prompts, deterministic: prompt i < `num_prompts` is an opener
    (random ids for `random` recipes) followed by a tail the target samples (temperature
    1, top-p 0.95, seeded per shard); the next `doc_prompts` are the first
    `doc_prompt_min`..`doc_prompt_tokens` tokens (a seeded length each) of seeded
    offline-text windows (`text_corpus`), used as they are."""

    def __init__(self, recipe: Recipe, loaded: LoadedModel) -> None:
        self.recipe, self.loaded = recipe, loaded
        self._docs: list[list[int]] | None = None
        self._doc_lens: list[int] = []

    @property
    def total(self) -> int:
        return self.recipe.num_prompts + self.recipe.doc_prompts

    def shard(self, index: int) -> list[list[int]]:
        """The prompts of shard `index`, openers' tails already sampled."""
        recipe, loaded = self.recipe, self.loaded
        first = index * recipe.shard_prompts
        ids = range(first, min(first + recipe.shard_prompts, self.total))
        openers = [i for i in ids if i < recipe.num_prompts]
        prompts: list[list[int]] = []
        if openers and recipe.prompt_source == "random":
            gen = torch.Generator().manual_seed(recipe.seed + index)
            vocab = loaded.config.vocab_size
            prompts = torch.randint(
                3, vocab, (len(openers), recipe.prompt_tokens), generator=gen
            ).tolist()
        elif openers:
            tokenizer = self._tokenizer()
            texts = [tokenizer.encode(OPENERS[i % len(OPENERS)]) for i in openers]
            pick = sampling_picker(loaded.model, recipe.seed * 100_003 + index)
            prompts = continue_batch(loaded.model, texts, recipe.prompt_tokens, pick).sequences
        docs = [i - recipe.num_prompts for i in ids if i >= recipe.num_prompts]
        if docs:
            if self._docs is None:
                self._docs = text_windows(
                    self._tokenizer(), recipe.doc_prompts, recipe.doc_prompt_tokens, DOC_SEED
                )
                low = recipe.doc_prompt_min or recipe.doc_prompt_tokens
                gen = torch.Generator().manual_seed(DOC_SEED + 1)
                size = (len(self._docs),)
                self._doc_lens = torch.randint(
                    low, recipe.doc_prompt_tokens + 1, size, generator=gen
                ).tolist()
            prompts += [self._docs[j][: self._doc_lens[j]] for j in docs if j < len(self._docs)]
        return prompts

    def _tokenizer(self) -> Tokenizer:
        if self.loaded.tokenizer is None:
            raise ValueError(f"{self.recipe.model}: natural prompts need a tokenizer")
        return self.loaded.tokenizer


DOC_SEED = 4_242  # offline-text prompt windows: a sample apart from the teacher-forced one


def num_shards(recipe: Recipe) -> int:
    return -(-(recipe.num_prompts + recipe.doc_prompts) // recipe.shard_prompts)


def build_corpus(
    recipe: Recipe, loaded: LoadedModel, data_dir: Path, progress: bool = True
) -> list[Path]:
    """Write every missing shard of `recipe` into `data_dir`; returns all shard paths
    (generated text first, then teacher-forced offline text)."""
    return [
        *build_generated(recipe, loaded, data_dir, progress),
        *build_text(recipe, loaded, data_dir, progress),
    ]


def build_generated(
    recipe: Recipe,
    loaded: LoadedModel,
    data_dir: Path,
    progress: bool = True,
    part: tuple[int, int] = (0, 1),
) -> list[Path]:
    """Write the missing generated shards; `part=(k, m)`: only shards i with i % m == k
    (so m single-threaded processes can share the work); returns every shard's path."""
    data_dir.mkdir(parents=True, exist_ok=True)
    paths = [data_dir / f"shard-{i:04d}.safetensors" for i in range(num_shards(recipe))]
    source = PromptSource(recipe, loaded)
    total = source.total * recipe.gen_len
    done = sum(
        min(recipe.shard_prompts, source.total - i * recipe.shard_prompts) * recipe.gen_len
        for i, p in enumerate(paths)
        if p.is_file()
    )
    with tqdm(
        total=total,
        initial=done,
        desc=f"{recipe.model}: generating training text",
        unit="tok",
        file=sys.stderr,
        disable=not progress,
    ) as bar:
        head = ShortlistHead(loaded.model)
        for i, path in enumerate(paths):
            if path.is_file() or i % part[1] != part[0]:
                continue
            prompts = source.shard(i)
            continued = continue_batch(
                loaded.model,
                prompts,
                recipe.gen_len,
                greedy_picker(head.top),
                loaded.eos_token_ids,
                on_step=bar.update,
            )
            candidates = max(recipe.candidates, 1)
            shard = generated_shard(loaded.model, prompts, continued, candidates, head)
            save_shard(shard, path)
    return paths


def build_text(
    recipe: Recipe, loaded: LoadedModel, data_dir: Path, progress: bool = True
) -> list[Path]:
    """The recipe's teacher-forced shards: offline text (`text-NNNN`), then loop windows
    (`loop-NNNN`, `loop_text`), each `shard_windows` windows."""
    n, length = recipe.text_windows, recipe.text_len
    loops = recipe.loop_windows
    kinds = (
        TeacherForced(
            "text", "offline text", n, 0, lambda tok: text_windows(tok, n, length, recipe.seed)
        ),
        # Loop windows are sampled with the generated sequences (the target's own loops).
        TeacherForced(
            "loop", "offline loops", loops, 1, lambda tok: loop_windows(tok, loops, length)
        ),
    )
    return [
        path for kind in kinds for path in _teacher_forced(recipe, loaded, data_dir, kind, progress)
    ]


@dataclasses.dataclass(frozen=True, slots=True)
class TeacherForced:
    """One kind of teacher-forced shard: file prefix, progress label, windows wanted, the
    prompt length recorded for them (`prefill.text_shard`) and how to make the windows."""

    prefix: str
    label: str
    count: int
    prompt_len: int
    windows: Callable[[Tokenizer], list[list[int]]]


def _teacher_forced(
    recipe: Recipe,
    loaded: LoadedModel,
    data_dir: Path,
    kind: TeacherForced,
    progress: bool,
) -> list[Path]:
    if kind.count == 0:
        return []
    count = -(-kind.count // recipe.shard_windows)
    paths = [data_dir / f"{kind.prefix}-{i:04d}.safetensors" for i in range(count)]
    missing = [i for i, p in enumerate(paths) if not p.is_file()]
    if not missing:
        return paths
    if loaded.tokenizer is None:
        raise ValueError(f"{recipe.model}: offline text needs a tokenizer")
    windows = kind.windows(loaded.tokenizer)
    paths = paths[: -(-len(windows) // recipe.shard_windows)]  # the sources may hold fewer
    data_dir.mkdir(parents=True, exist_ok=True)
    done = sum(recipe.shard_windows for i in range(len(paths)) if i not in missing)
    with tqdm(
        total=len(windows) * recipe.text_len,
        initial=min(done, len(windows)) * recipe.text_len,
        desc=f"{recipe.model}: teacher-forcing {kind.label}",
        unit="tok",
        file=sys.stderr,
        disable=not progress,
    ) as bar:
        for i, path in enumerate(paths):
            if path.is_file():
                continue
            chunk = windows[i * recipe.shard_windows : (i + 1) * recipe.shard_windows]
            candidates = max(recipe.candidates, 1)
            shard = text_shard(loaded.model, chunk, candidates, bar.update, kind.prompt_len)
            save_shard(shard, path)
    return paths


def split_validation(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """(training shards, validation shards): the last teacher-forced text shard is held
    out, so the draft's top-1 agreement can be compared on seen and unseen text."""
    text = [p for p in paths if p.name.startswith("text-")]
    if len(text) < 2:
        return paths, []
    return [p for p in paths if p != text[-1]], [text[-1]]


def load_corpus(paths: list[Path]) -> list[Shard]:
    return [load_shard(p) for p in paths]

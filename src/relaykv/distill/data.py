"""Building a recipe's corpus shard by shard (resumable; progress on stderr)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tqdm import tqdm

from relaykv.distill.corpus import Shard, collect_shard, load_shard, sample_openers, save_shard
from relaykv.distill.prefill import text_shard
from relaykv.distill.prompts import OPENERS
from relaykv.distill.recipes import Recipe
from relaykv.distill.text_corpus import text_windows
from relaykv.model import LoadedModel


def shard_prompts(
    recipe: Recipe, loaded: LoadedModel, index: int
) -> tuple[list[list[int]], list[int]]:
    """Prompt ids (before sampling) and seeds of shard `index`; deterministic."""
    first = index * recipe.shard_prompts
    ids = range(first, min(first + recipe.shard_prompts, recipe.num_prompts))
    if recipe.prompt_source == "random":
        gen = torch.Generator().manual_seed(recipe.seed + index)
        vocab = loaded.config.vocab_size
        rows = torch.randint(3, vocab, (len(ids), recipe.prompt_tokens), generator=gen)
        return rows.tolist(), list(ids)
    tokenizer = loaded.tokenizer
    if tokenizer is None:
        raise ValueError(f"{recipe.model}: the openers recipe needs a tokenizer")
    prompts = [tokenizer.encode(OPENERS[i % len(OPENERS)]) for i in ids]
    return prompts, [recipe.seed * 100_003 + i for i in ids]


def num_shards(recipe: Recipe) -> int:
    return -(-recipe.num_prompts // recipe.shard_prompts)


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
    recipe: Recipe, loaded: LoadedModel, data_dir: Path, progress: bool = True
) -> list[Path]:
    data_dir.mkdir(parents=True, exist_ok=True)
    paths = [data_dir / f"shard-{i:04d}.safetensors" for i in range(num_shards(recipe))]
    total = recipe.num_prompts * recipe.gen_len
    done = sum(
        min(recipe.shard_prompts, recipe.num_prompts - i * recipe.shard_prompts) * recipe.gen_len
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
        for i, path in enumerate(paths):
            if path.is_file():
                continue
            prompts, seeds = shard_prompts(recipe, loaded, i)
            if recipe.prompt_source == "openers":
                prompts = sample_openers(loaded.model, prompts, recipe.prompt_tokens, seeds)
            shard = collect_shard(
                loaded.model,
                prompts,
                recipe.gen_len,
                loaded.eos_token_ids,
                concurrency=recipe.shard_prompts,
                on_step=bar.update,
                candidates=max(recipe.candidates, 1),
            )
            save_shard(shard, path)
    return paths


def build_text(
    recipe: Recipe, loaded: LoadedModel, data_dir: Path, progress: bool = True
) -> list[Path]:
    """The recipe's teacher-forced shards (`text-NNNN`), each `shard_windows` windows."""
    if recipe.text_windows == 0:
        return []
    count = -(-recipe.text_windows // recipe.shard_windows)
    paths = [data_dir / f"text-{i:04d}.safetensors" for i in range(count)]
    missing = [i for i, p in enumerate(paths) if not p.is_file()]
    if not missing:
        return paths
    if loaded.tokenizer is None:
        raise ValueError(f"{recipe.model}: offline text needs a tokenizer")
    windows = text_windows(loaded.tokenizer, recipe.text_windows, recipe.text_len, recipe.seed)
    paths = paths[: -(-len(windows) // recipe.shard_windows)]  # the sources may hold fewer
    data_dir.mkdir(parents=True, exist_ok=True)
    done = sum(recipe.shard_windows for i in range(len(paths)) if i not in missing)
    with tqdm(
        total=len(windows) * recipe.text_len,
        initial=min(done, len(windows)) * recipe.text_len,
        desc=f"{recipe.model}: teacher-forcing offline text",
        unit="tok",
        file=sys.stderr,
        disable=not progress,
    ) as bar:
        for i, path in enumerate(paths):
            if path.is_file():
                continue
            chunk = windows[i * recipe.shard_windows : (i + 1) * recipe.shard_windows]
            shard = text_shard(loaded.model, chunk, max(recipe.candidates, 1), bar.update)
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

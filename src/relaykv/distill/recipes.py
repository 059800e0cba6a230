"""Distillation recipes: what text each model's draft learns from and how it is trained.

A recipe fixes the data (prompt source, how many, how long the greedy continuations are),
the draft's shape (the draft layer's KV shape must be the target's: it shares a KV group
with the target's full-attention layers; query heads and MLP width are free, and smaller
ones keep a shipped checkpoint small) and the optimisation (steps are bounded by a token
budget). docs/model.md ("Distilling a draft") lists the recipes and their results.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Recipe:
    model: str
    prompt_source: str  # "openers": prompts.OPENERS + sampled tokens; "random": random ids
    num_prompts: int
    prompt_tokens: int  # sampled tokens after each opener, or random prompt length
    gen_len: int  # greedy tokens generated after each prompt
    shard_prompts: int  # prompts per data shard (one engine run)
    draft_heads: int | None  # query heads of the draft layer (None: the target's)
    draft_intermediate: int | None  # MLP width of the draft layer (None: the target's)
    token_budget: int  # training positions seen before stopping
    batch_sequences: int  # sequences per optimiser step
    lr: float
    seed: int = 7
    # Natural prompts from offline text (`text_corpus`): `doc_prompts` windows' first
    # `doc_prompt_tokens` tokens, continued greedily for `gen_len` like the openers.
    doc_prompts: int = 0
    doc_prompt_tokens: int = 32
    doc_prompt_min: int = 0  # > 0: each doc prompt keeps a seeded min..max-token prefix
    # Teacher-forced offline text (`text_corpus`): windows of `text_len` tokens, written
    # `shard_windows` per shard; 0 windows: generated text only.
    text_windows: int = 0
    text_len: int = 256
    shard_windows: int = 32
    # Loop windows (`loop_text`): text whose tail repeats a span, teacher-forced like the
    # text windows and sampled with the generated sequences (`generated_share`).
    loop_windows: int = 0
    # Cross-entropy: over the full vocabulary (0), or over the union of the batch's
    # recorded top-`candidates` tokens (large vocabularies: hard negatives only).
    candidates: int = 0
    ce_weight: float = 1.0  # loss = smooth L1 on the hidden state + ce_weight * CE
    unroll_weight: float = 0.0  # > 0: also train a pass fed with the draft's own outputs
    # > 0: each batch draws this share of its sequences from the generated ones (the
    # serving distribution, a small part of the corpus), the rest from the text windows.
    generated_share: float = 0.0
    max_len: int = 0  # > 0: training cuts every sequence to this many tokens
    checkpoint_every: int = 50  # optimiser steps between resumable checkpoints


RECIPES: dict[str, Recipe] = {
    # The embedded model: seconds on 2 cores (its shipped draft was built with this).
    "tiny-hybrid": Recipe(
        model="tiny-hybrid",
        prompt_source="random",
        num_prompts=48,
        prompt_tokens=16,
        gen_len=80,
        shard_prompts=48,
        draft_heads=None,
        draft_intermediate=None,
        token_budget=120 * 16 * 94,
        batch_sequences=16,
        lr=3e-3,
    ),
    # Gemma-3-270M: teacher-forced windows of offline documentation and of loops (the
    # target's own argmax as labels) plus its greedy continuations of varied openers and
    # offline-text prompts; half of each batch is generated text or loops. A restricted
    # vocabulary keeps the 262k-entry LM head out of the loss. The shipped draft's recipe
    # (docs/model.md lists the earlier ones and their results).
    "gemma3-270m": Recipe(
        model="gemma3-270m",
        prompt_source="openers",
        num_prompts=384,
        prompt_tokens=8,
        gen_len=128,
        shard_prompts=128,
        draft_heads=2,
        draft_intermediate=1024,
        token_budget=7_000_000,
        batch_sequences=8,
        lr=1e-3,
        doc_prompts=640,
        doc_prompt_tokens=32,
        doc_prompt_min=8,
        text_windows=1536,
        text_len=256,
        shard_windows=32,
        loop_windows=512,
        candidates=8,
        ce_weight=1.0,
        unroll_weight=0.5,
        generated_share=0.5,
        max_len=160,
        checkpoint_every=50,
    ),
}

"""Training an EAGLE-1 draft on a recorded corpus (resumable, bounded by a token budget).

At position p the draft sees `(embed(token p+1), hidden p)` and is trained to output the
target's hidden p+1 (smooth L1: its output is fed back when drafting several tokens) and to
make the LM head predict the target's own choice after p+1 (`labels[p + 1]`, cross-entropy),
where that choice is the next greedy token: in generated shards past the prompt (prompt
tokens were sampled or random), everywhere in teacher-forced text shards. Adam with a short
warm-up and a linear decay to 10 %; sequences are drawn in a seeded order.

Large vocabularies (`Recipe.candidates` > 0): the cross-entropy ranges over the union of
the batch's recorded top-C tokens (`labels.label_hidden`), i.e. the target's own hard
negatives, a few thousand head rows instead of 262k; the hidden-state loss keeps the
draft's output on the target's manifold, so other tokens stay as unlikely as the target
makes them. `Recipe.unroll_weight` > 0 adds a second pass fed with the draft's own outputs
(as drafting K > 1 tokens is), so later drafts are trained on what they will see.

State (draft, optimiser, step) is saved every `checkpoint_every` steps to `state.pt`
(replaced atomically): a rerun continues from there.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from relaykv.distill.corpus import Shard
from relaykv.distill.recipes import Recipe
from relaykv.model import CausalLM, EagleDraft
from relaykv.model.eagle import draft_config_for, init_draft_weights
from relaykv.model.forward_context import DenseContext


@dataclass(slots=True)
class Batchable:
    """The corpus as padded tensors: tokens `[N, L]` (0 padded), hidden `[N, L - 1, H]`,
    the target's choices `labels [N, L - 1]` / `cands [N, L - 1, C]`, and `loss_ce
    [N, L - 2]` / `loss_reg [N, L - 2]` masks over positions p."""

    tokens: torch.Tensor
    hidden: torch.Tensor
    labels: torch.Tensor
    cands: torch.Tensor
    loss_ce: torch.Tensor
    loss_reg: torch.Tensor

    @property
    def positions(self) -> int:
        return int(self.loss_reg.sum())


def stack_corpus(shards: list[Shard]) -> Batchable:
    length = max(int(s.lengths.max()) for s in shards)
    c = min(s.cands.shape[-1] for s in shards)
    rows, hiddens, labels, cands, ce, reg = [], [], [], [], [], []
    for shard in shards:
        n, width = shard.tokens.shape
        tokens = torch.zeros(n, length, dtype=torch.long)
        tokens[:, :width] = shard.tokens.clamp(min=0)
        hidden = torch.zeros(n, length - 1, shard.hidden.shape[-1])
        hidden[:, : width - 1] = shard.hidden
        label = torch.zeros(n, length - 1, dtype=torch.long)
        label[:, : width - 1] = shard.labels.clamp(min=0)
        cand = torch.zeros(n, length - 1, c, dtype=torch.long)
        cand[:, : width - 1] = shard.cands[..., :c].clamp(min=0)
        p = torch.arange(length - 2)
        valid = p[None, :] + 2 < shard.lengths[:, None]  # token p+2 exists
        ce.append(valid & (p[None, :] + 2 >= shard.prompt_lens[:, None]))
        reg.append(valid)
        rows.append(tokens)
        hiddens.append(hidden)
        labels.append(label)
        cands.append(cand)
    return Batchable(
        torch.cat(rows),
        torch.cat(hiddens),
        torch.cat(labels),
        torch.cat(cands),
        torch.cat(ce),
        torch.cat(reg),
    )


def new_draft(target: CausalLM, recipe: Recipe) -> EagleDraft:
    """A freshly initialised draft of the recipe's shape (seeded)."""
    config = draft_config_for(target.config)
    changes: dict[str, int] = {}
    if recipe.draft_heads is not None:
        changes["num_heads"] = recipe.draft_heads
    if recipe.draft_intermediate is not None:
        changes["intermediate_size"] = recipe.draft_intermediate
    config = config.with_updates(**changes) if changes else config
    torch.manual_seed(recipe.seed)
    draft = EagleDraft(config, fc_bias=True)
    init_draft_weights(draft, recipe.seed)
    return draft


def train_draft(
    target: CausalLM,
    recipe: Recipe,
    data: Batchable,
    state_path: Path,
    token_budget: int | None = None,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
) -> EagleDraft:
    """Train (or continue training) the recipe's draft; returns it in eval mode.

    `on_step(step)` runs after each optimiser step (and after its checkpoint, if any)."""
    budget = recipe.token_budget if token_budget is None else token_budget
    n, length = data.tokens.shape
    per_step = recipe.batch_sequences * data.positions / n
    steps = max(1, math.ceil(budget / per_step))
    draft = new_draft(target, recipe)
    opt = torch.optim.Adam(draft.parameters(), lr=recipe.lr)
    step = 0
    if state_path.is_file():
        state = torch.load(state_path, weights_only=True)
        draft.load_state_dict(state["draft"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
    head = target.head_weight().detach().float()
    draft.build_rotaries()
    span = length - 2
    order = torch.Generator().manual_seed(recipe.seed + 1)
    for _ in range(step):  # the same sequence order after a resume
        torch.randperm(n, generator=order)
    warmup = min(20, steps // 10 + 1)
    draft.train()
    bar = tqdm(
        total=steps,
        initial=step,
        desc=f"{recipe.model}: training the draft",
        unit="step",
        file=sys.stderr,
        disable=not progress,
    )
    while step < steps:
        pick = torch.randperm(n, generator=order)[: recipe.batch_sequences]
        lr = recipe.lr * min((step + 1) / warmup, 1.0 - 0.9 * step / steps)
        for group in opt.param_groups:
            group["lr"] = lr
        with torch.no_grad():
            embeds = target.embed(data.tokens[pick, 1 : span + 1].flatten()).float()
        hidden_in = data.hidden[pick, :span]
        out, ce, reg = _losses(draft, recipe, data, pick, embeds, hidden_in.flatten(0, 1), head)
        loss = reg + recipe.ce_weight * ce
        if recipe.unroll_weight > 0:
            # The second pass sees the first pass's outputs as its hidden input (position
            # p gets the draft's estimate of hidden p), as drafting k > 1 tokens does.
            fed = torch.cat([hidden_in[:, :1], out.view(len(pick), span, -1)[:, :-1]], dim=1)
            _, ce2, reg2 = _losses(draft, recipe, data, pick, embeds, fed.flatten(0, 1), head)
            loss = loss + recipe.unroll_weight * (reg2 + recipe.ce_weight * ce2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        bar.update()
        bar.set_postfix(ce=f"{ce.item():.3f}", reg=f"{reg.item():.3f}")
        if step % recipe.checkpoint_every == 0 or step == steps:
            _save_state(state_path, draft, opt, step)
        if on_step is not None:
            on_step(step)
    bar.close()
    return draft.eval()


def _losses(
    draft: EagleDraft,
    recipe: Recipe,
    data: Batchable,
    pick: torch.Tensor,
    embeds: torch.Tensor,
    hidden_in: torch.Tensor,
    head: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, cross-entropy, smooth L1) of one pass of the draft over picked sequences."""
    b, span = len(pick), data.loss_ce.shape[1]
    out = draft(embeds, hidden_in, DenseContext(draft.rotaries, b, span, torch.float32))
    ce_mask = data.loss_ce[pick].flatten()
    reg_mask = data.loss_reg[pick].flatten()
    labels = data.labels[pick, 1 : span + 1].flatten()[ce_mask]
    rows = head
    if recipe.candidates:
        vocab = torch.unique(data.cands[pick, 1 : span + 1].flatten(0, 1)[ce_mask])
        rows, labels = head[vocab], torch.searchsorted(vocab, labels)
    logits = F.linear(draft.head_input(out[ce_mask]), rows)
    ce = F.cross_entropy(logits, labels) if len(labels) else out.sum() * 0
    target_hidden = data.hidden[pick, 1 : span + 1].flatten(0, 1)
    reg = F.smooth_l1_loss(out[reg_mask], target_hidden[reg_mask])
    return out, ce, reg


def _save_state(
    path: Path,
    draft: EagleDraft,
    opt: torch.optim.Optimizer,
    step: int,
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    state = {"draft": draft.state_dict(), "opt": opt.state_dict(), "step": step}
    torch.save(state, scratch)
    os.replace(scratch, path)

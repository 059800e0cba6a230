"""The target's own next-token choices at every recorded position (labels for the draft).

`label_hidden` turns final-norm hidden states into the target's greedy token (argmax of
its logits, exactly as `CausalLM.logits` computes them: the LM head, then the soft-cap,
which is monotone and so never changes an argmax) and its top `C` candidates, the hard
negatives the draft's restricted-vocabulary cross-entropy ranges over (docs/model.md,
"Distilling a draft").

For a 262k-entry vocabulary the full float32 head is most of the cost, so candidates are
first ranked with a bfloat16 head (about 5x faster on CPUs with bf16 dot products) and
the top `SHORTLIST` are rescored in float32: labels are exact whenever the float32 argmax
is in bfloat16's top 16 (every position of a 1,024-token check on Gemma-3-270M was).
Small vocabularies are scored in float32 directly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from relaykv.model import CausalLM

SHORTLIST = 16
ROWS_PER_CHUNK = 256  # bounds the [rows, vocab] logits buffer (128 MiB for 262k in bf16)
SMALL_VOCAB = 4096


@torch.no_grad()
def label_hidden(
    target: CausalLM, hidden: torch.Tensor, candidates: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels `[N]`, candidates `[N, C]`) for hidden `[N, H]`; candidates[:, 0] == labels,
    the rest in decreasing float32 logit order."""
    head = target.head_weight().detach()
    vocab = head.shape[0]
    c = min(candidates, vocab)
    short = min(max(SHORTLIST, c), vocab)
    head32 = head.float()
    head16 = head.to(torch.bfloat16) if vocab > SMALL_VOCAB else None
    out = torch.empty(hidden.shape[0], c, dtype=torch.long)
    for first in range(0, hidden.shape[0], ROWS_PER_CHUNK):
        rows = hidden[first : first + ROWS_PER_CHUNK].float()
        if head16 is None:
            out[first : first + len(rows)] = F.linear(rows, head32).topk(c, dim=-1).indices
            continue
        shortlist = F.linear(rows.to(torch.bfloat16), head16).topk(short, dim=-1).indices
        exact = torch.einsum("nd,nkd->nk", rows, head32[shortlist])
        order = exact.topk(c, dim=-1).indices
        out[first : first + len(rows)] = shortlist.gather(1, order)
    return out[:, 0].clone(), out

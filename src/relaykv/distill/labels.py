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
Small vocabularies are scored in float32 directly. `ShortlistHead.greedy_logits` gives the
engine the same ranking while the corpus is generated (`corpus.collect_shard`): logits that
are the float32 ones on the shortlist and -inf elsewhere, so greedy decoding picks the
same token as over the full head, at the bfloat16 head's cost.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from relaykv.model import CausalLM

SHORTLIST = 16
ROWS_PER_CHUNK = 256  # bounds the [rows, vocab] logits buffer (128 MiB for 262k in bf16)
SMALL_VOCAB = 4096


class ShortlistHead:
    """The target's LM head in float32 and (large vocabularies) a bfloat16 copy, made once."""

    def __init__(self, target: CausalLM) -> None:
        self.target = target
        head = target.head_weight().detach()
        self.head32 = head.float()
        self.head16 = head.to(torch.bfloat16) if head.shape[0] > SMALL_VOCAB else None

    @property
    def vocab(self) -> int:
        return self.head32.shape[0]

    @torch.no_grad()
    def top(self, hidden: torch.Tensor, candidates: int) -> torch.Tensor:
        """`[N, C]` token ids in decreasing float32 logit order (column 0: the argmax)."""
        c = min(candidates, self.vocab)
        out = torch.empty(hidden.shape[0], c, dtype=torch.long)
        for first in range(0, hidden.shape[0], ROWS_PER_CHUNK):
            ids, exact = self._scored(hidden[first : first + ROWS_PER_CHUNK].float(), c)
            out[first : first + len(ids)] = ids.gather(1, exact.topk(c, dim=-1).indices)
        return out

    @torch.no_grad()
    def greedy_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 `[N, vocab]`: the exact (uncapped) logits of each row's shortlist, -inf
        elsewhere; its argmax is `top(hidden, 1)`. For greedy sampling only."""
        rows = hidden.float()
        if self.head16 is None:
            return self._capped(F.linear(rows, self.head32))
        out = torch.full((len(rows), self.vocab), float("-inf"))
        for first in range(0, len(rows), ROWS_PER_CHUNK):
            ids, exact = self._scored(rows[first : first + ROWS_PER_CHUNK], SHORTLIST)
            out[first : first + len(ids)].scatter_(1, ids, exact)
        return out

    def _capped(self, logits: torch.Tensor) -> torch.Tensor:
        """`CausalLM.logits`'s soft-cap (computed here: the runner's `logits` may be ours)."""
        cap = self.target.config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    def _scored(self, rows: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(candidate ids `[n, S]`, their float32 logits `[n, S]`) for float32 rows."""
        if self.head16 is None:
            exact = F.linear(rows, self.head32)
            return torch.arange(self.vocab).expand(len(rows), -1), exact
        short = min(max(SHORTLIST, c), self.vocab)
        ids = F.linear(rows.to(torch.bfloat16), self.head16).topk(short, dim=-1).indices
        return ids, torch.einsum("nd,nkd->nk", rows, self.head32[ids])


@torch.no_grad()
def label_hidden(
    target: CausalLM, hidden: torch.Tensor, candidates: int, head: ShortlistHead | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels `[N]`, candidates `[N, C]`) for hidden `[N, H]`; candidates[:, 0] == labels,
    the rest in decreasing float32 logit order."""
    top = (head or ShortlistHead(target)).top(hidden, candidates)
    return top[:, 0].clone(), top

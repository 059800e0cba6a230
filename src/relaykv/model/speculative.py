"""Verification of draft tokens against the target's logits.

Row j of `logits` is the target's distribution for the token after the j-th computed
position of the verification window: row 0 follows the sequence's last real token, row
j (j >= 1) follows draft j. With d drafts there are d + 1 rows.

* Greedy: accept drafts while each equals the target's argmax; the first mismatch is
  replaced by the argmax, and if all match the argmax of row d is the bonus token.
* Temperature > 0: speculative (rejection) sampling. Drafts are proposed greedily (the
  draft's argmax, as vLLM's EAGLE does), i.e. from a point-mass distribution q = 1{x = d};
  draft j is accepted with probability min(1, p(d)/q(d)) = p(d); on rejection the token is
  drawn from norm(max(0, p - q)) = p with d removed; if all drafts pass, a bonus token is
  drawn from row d. By the standard argument (Leviathan et al. 2023, Chen et al. 2023) each
  emitted token is distributed exactly as p, whatever q is, so sampling is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from relaykv.common.messages.steps import SamplingParams
from relaykv.model.sampling import GeneratorSource, probabilities, sample_from


def verify(
    logits: torch.Tensor,
    drafts: Sequence[int],
    params: SamplingParams,
    first_index: int,
    generators: GeneratorSource,
) -> tuple[list[int], int]:
    """(new tokens, accepted drafts) for one sequence; `first_index` = index of token 0."""
    d = len(drafts)
    if logits.shape[0] != d + 1:
        raise ValueError(f"need {d + 1} logit rows for {d} drafts, got {logits.shape[0]}")
    if params.greedy:
        best = torch.argmax(logits, dim=-1).tolist()
        accepted = 0
        while accepted < d and drafts[accepted] == best[accepted]:
            accepted += 1
        return best[: accepted + 1], accepted
    tokens: list[int] = []
    for j, draft in enumerate(drafts):
        probs = probabilities(logits[j], params)
        gen = generators.for_token(params, first_index + j)
        u = float(torch.rand((), generator=gen, device=generators.device))
        if u < float(probs[draft]):
            tokens.append(int(draft))
            continue
        residual = probs.clone()
        residual[draft] = 0.0
        # p(d) < 1 here (u < 1 always accepts a sure token), so the residual has mass.
        tokens.append(sample_from(residual / residual.sum(), gen))
        return tokens, j
    gen = generators.for_token(params, first_index + d)
    tokens.append(sample_from(probabilities(logits[d], params), gen))
    return tokens, d

"""Time the real model runner on given step shapes (what `relaykv sim calibrate` fits on).

    echo '{"model": "tiny-hybrid", "speculative_tokens": 2, "repeats": 3,
           "steps": [[[0, 512, 0, 0]], [[1024, 1, 2, 1], [2048, 1, 2, 1]]]}' |
        python -m relaykv.model.step_timing

`"draft"` is `"shipped"` (the default: the draft the model ships, what `relaykv serve
--speculative-tokens K` loads) or `"random"`; `"threads"` the torch threads (default: torch's
own, one per core or `$OMP_NUM_THREADS`, what `relaykv serve` uses without `--torch-threads`).
The output also reports the `threads` and `draft` it timed with.

Each step is a list of sequences `[start, new, drafts, propose]`: `new` tokens computed
from position `start` with `drafts` draft tokens to verify after them; every sequence
samples, as the last chunk of a prompt or a decode step does, and with a draft proposes
the next step's tokens when `propose` is 1 (0: a prefill engine's hand-over step). Block
tables are fresh distinct blocks covering each sequence's positions, so the runner does
the same work as in serving (paged attention over `start + new` positions). Prints one
JSON object: `seconds`, the fastest of `repeats` timed runs of each step (after one
warm-up run of it: other processes on a shared machine only ever add time), and the
draft's `acceptance_rate` on greedy decoding after a random prompt. It lives in the model
layer because only the model layer may load a model; the simulator starts it as a
subprocess and fits its cost model on the output.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch

from relaykv.common.messages.steps import SequenceWork, StepBatch

DRAFTS = ("shipped", "random")


def _runner(model: str, k: int, num_blocks: int, draft_name: str = "shipped") -> Any:
    """The runner with `relaykv serve`'s draft for `--speculative-tokens k`: the draft the
    model ships (`shipped`, relaykv serve's default) or `random` (`--draft-model random`)."""
    from relaykv.model import ModelRunner, default_draft, load_model, random_draft

    if draft_name not in DRAFTS:
        raise ValueError(f"draft must be one of {DRAFTS}, got {draft_name!r}")
    loaded = load_model(model)
    draft = None
    if k:
        if draft_name == "shipped":  # NoDefaultDraft names the models that ship one
            draft = default_draft(model, loaded.config, loaded.model.dtype)
        else:
            draft = random_draft(loaded.config, seed=0, dtype=loaded.model.dtype)
    runner = ModelRunner(loaded.model, num_blocks=num_blocks, draft=draft, num_speculative_tokens=k)
    return runner, loaded.config.vocab_size


def _batch(
    step: list[list[int]], num_groups: int, block_size: int, k: int, vocab: int
) -> StepBatch:
    works = []
    next_block = 1
    for i, (start, new, drafts, propose) in enumerate(step):
        span = start + new + drafts + k
        n_blocks = -(-span // block_size)
        tables = []
        for _ in range(num_groups):
            tables.append(list(range(next_block, next_block + n_blocks)))
            next_block += n_blocks
        tokens = [(start + j * 31 + i) % vocab for j in range(new)]
        works.append(
            SequenceWork(
                f"s{i}",
                tokens,
                start,
                tables,
                sample=True,
                draft_token_ids=[(7 + j) % vocab for j in range(drafts)],
                propose=bool(propose),
            )
        )
    return StepBatch(works)


def time_steps(spec: dict[str, Any]) -> list[float]:
    k = int(spec.get("speculative_tokens", 0))
    steps = spec["steps"]
    repeats = int(spec.get("repeats", 3))
    need = 2
    for step in steps:
        per_step = sum(-(-(s + n + d + k) // 16) for s, n, d, _ in step)
        need = max(need, per_step * 8 + 2)  # up to 8 groups (page-balanced geometries)
    runner, vocab = _runner(spec["model"], k, need, spec.get("draft", "shipped"))
    geo = runner.geometry
    block = geo.groups[0].block_size
    batches = [_batch(step, geo.num_groups, block, k, vocab) for step in steps]
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    out = []
    for batch in batches:
        runner.execute(batch)  # warm-up: first touch of its pages and shapes
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            runner.execute(batch)
            times.append(time.perf_counter() - t0)
        # The fastest run: other processes on a shared machine only ever add time.
        out.append(min(times))
    return out


def acceptance_rate(
    model: str, k: int, prompt_len: int = 256, steps: int = 48, draft: str = "shipped"
) -> float:
    """Accepted / proposed drafts of greedy decoding after a random prompt (the draft's
    acceptance on random-token prompts, what the synthetic datasets send)."""
    if not k:
        return 0.0
    span = prompt_len + steps * (k + 1) + k + 1
    runner, vocab = _runner(model, k, (span // 16 + 2) * 8 + 2, draft)
    geo = runner.geometry
    n_blocks = -(-span // geo.groups[0].block_size)
    tables = [list(range(1 + g * n_blocks, 1 + (g + 1) * n_blocks)) for g in range(geo.num_groups)]
    prompt = [(i * 7919 + 13) % vocab for i in range(prompt_len)]
    out = runner.execute(StepBatch([SequenceWork("a", prompt, 0, tables, sample=True)]))
    seq = out.sequences[0]
    pos, last, drafts = prompt_len, seq.token_ids[-1], seq.draft_token_ids
    proposed = accepted = 0
    for _ in range(steps):
        work = SequenceWork("a", [last], pos, tables, sample=True, draft_token_ids=drafts)
        seq = runner.execute(StepBatch([work])).sequences[0]
        proposed += seq.num_draft_tokens
        accepted += seq.num_accepted_tokens
        pos += 1 + seq.num_accepted_tokens
        last, drafts = seq.token_ids[-1], seq.draft_token_ids
    return accepted / proposed if proposed else 0.0


def main() -> int:
    spec = json.loads(sys.stdin.read())
    seconds = time_steps(spec)
    k = int(spec.get("speculative_tokens", 0))
    draft = spec.get("draft", "shipped")
    out = {
        "seconds": seconds,
        "acceptance_rate": acceptance_rate(spec["model"], k, draft=draft),
        "threads": torch.get_num_threads(),
        "draft": draft if k else None,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

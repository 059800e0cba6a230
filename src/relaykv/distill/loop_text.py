"""Loop windows: offline text whose tail repeats one of its spans, for teaching copying.

A small target's greedy text loops ("Write a short poem about the sea." again and again,
", baking powder" forty times): once a loop starts, every next token is in the context,
and a draft that copies from its own KV accepts nearly all of them. Generated text has
loops but is slow to make on CPU (a token per sequence per forward); a loop window costs
a teacher-forced forward like any text window (`prefill.text_shard`): a window of
offline text (`text_corpus`) is cut after a seeded 8-120 tokens and continued by a
span of 3-40 tokens repeated to the window's length, half the time the span just
before the cut, half the time the one after it. The labels are the target's own argmax
as everywhere else, so where the target does not follow the loop the draft does not
either (docs/model.md, "Distilling a draft").
"""

from __future__ import annotations

import random

from relaykv.distill.text_corpus import text_windows
from relaykv.model.loading.tokenizer import Tokenizer

LOOP_WINDOW_SEED = 9_001  # a window sample apart from the teacher-forced text's
LOOP_SPAN_SEED = 5
SPAN_LENGTHS = (3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40)
FIRST_CUT, LAST_CUT = 8, 120


def loop_windows(tokenizer: Tokenizer, count: int, length: int) -> list[list[int]]:
    """`count` windows of exactly `length` ids: text, then a span of it repeated."""
    rng = random.Random(LOOP_SPAN_SEED)
    windows = []
    for text in text_windows(tokenizer, count, length, LOOP_WINDOW_SEED):
        cut = rng.randint(FIRST_CUT, min(LAST_CUT, length // 2))
        span = rng.choice(SPAN_LENGTHS)
        before = rng.random() < 0.5
        # The span before the cut (never the BOS) or the one after it.
        repeated = text[max(1, cut - span) : cut] if before else text[cut : cut + span]
        body = text[:cut] + repeated * (length // len(repeated) + 1)
        windows.append(body[:length])
    return windows

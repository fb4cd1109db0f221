"""Where a model's reply falls into a loop: one passage written again and again until its token limit.

The embedded model at a nonzero temperature sometimes does this (in two of four runs of the shop benchmark one
rollout repeated a sentence for 1,024 tokens, 30 to 39 s of a two-core run); nothing after the first copy can
change the answer's score, so the gateway streams the embedded model's replies and cuts them there
(core/models/openai_http.py).
"""

from __future__ import annotations

COPIES = 3  # consecutive copies of one passage that make a loop
MIN_PASSAGE = 20  # characters: a shorter passage thrice (a table rule, "1. 2. 3.") is not yet a loop
SHORT_RUN = 240  # characters of an unbroken run of a shorter passage ("0, 0, 0, ...") that are one
MAX_PASSAGE = 600  # characters: a longer passage is not looked for


def loop_cut(text: str) -> int | None:
    """The length of `text` to keep when it ends in a loop (COPIES copies of a passage of MIN_PASSAGE to
    MAX_PASSAGE characters, or SHORT_RUN characters of a shorter one): up to the end of the loop's first copy,
    at its last sentence end when it has one. None when it does not end in one."""
    n = len(text)
    for period in range(1, min(MAX_PASSAGE, n // COPIES) + 1):
        if text[-1] != text[-1 - period]:
            continue
        span = period * COPIES if period >= MIN_PASSAGE else max(period * COPIES, SHORT_RUN)
        if span > n or text[n - span + period:] != text[n - span:n - period]:
            continue
        start = n - span
        while start > 0 and text[start - 1] == text[start - 1 + period]:
            start -= 1
        end = max(text.rfind(mark, start, start + period) for mark in ".!?\n")
        return end + 1 if end >= start else start + period
    return None

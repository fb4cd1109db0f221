"""How many worked examples a `top_k` library may hold before retrieval stops showing a query its own (issue 44).

With `top_k` selection each message is shown its k most similar entries (BM25, core.domain.selection), so a larger
library costs no prompt length; what a larger library risks is retrieval: more entries, more near-misses that
outrank the right one. This measures it on the shop-policies demo, with no model call: a library of the first n
train messages' worked examples (each the message and its reference written as a reply, as the default path's
template writes it: several examples per policy once n passes 8, the hardest case for retrieval), and for each of
the 16 held-out messages whether the examples shown it (top 3) state every fact of its reference
(core.domain.coverage: a code counts by its letters). The cap for `top_k` (core.domain.library.MAX_EXAMPLES_TOP_K)
is the largest size at which this stays as right as at the whole-library cap (6).

    PYTHONPATH=. .venv/bin/python bench/retrieval_cap.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.domain.coverage import needs_of, needs_stated  # noqa: E402
from core.domain.library import EXAMPLE  # noqa: E402
from core.domain.reference_answers import example_text, reference_parts, template_reply  # noqa: E402
from core.domain.selection import DEFAULT_K, Selection, select_entries  # noqa: E402

SIZES = (4, 6, 8, 12, 16, 20, 24, 28)


def main() -> None:
    rows = [json.loads(line) for line in (ROOT / "data/demo/policy_messages.jsonl").read_text().splitlines() if line]
    train = [r for r in rows if r["split"] == "train"]
    test = [r for r in rows if r["split"] == "test"]
    made = [{"id": f"E{i + 1}", "kind": EXAMPLE,
             "text": example_text(r["query"], template_reply(reference_parts("facts", r["reference"])))}
            for i, r in enumerate(train)]
    selection = Selection.build("top_k", DEFAULT_K)
    print(f"top_k {DEFAULT_K}; {len(test)} held-out messages; library = the first n train messages' examples")
    print("| examples | policies with an example | held-out messages shown every fact of their reference |")
    print("| --- | --- | --- |")
    for n in SIZES:
        library = made[:n]
        universe = frozenset().union(*(needs_of("facts", r["reference"]) for r in train))
        policies = len(frozenset().union(*(needs_of("facts", r["reference"]) for r in train[:n])))
        right = 0
        for row in test:
            needs = needs_of("facts", row["reference"])
            shown = select_entries(library, row["query"], selection)
            stated = frozenset().union(*(needs_stated(e["text"], universe) for e in shown))
            right += needs <= stated
        print(f"| {n} | {policies} | {right} of {len(test)} |")


if __name__ == "__main__":
    main()

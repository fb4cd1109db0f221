"""Where in the prompt the most similar worked example goes: first, or last, next to the query (issue 44).

Under `top_k` each message is shown its k most similar entries (core.domain.selection). This takes a library the
default path learned (the newest version in a database of `learning_effect.py --db`, e.g. its
`/tmp/le.default.db`), copies the database once per variant, and evaluates the library on the **development**
messages: the validation split and the train messages that are not themselves an example of it, never the test
split the learning benchmark reports. Variants (comma-separated, `+` combines):

- `last`: the studio's order, the most similar entry last (core.domain.selection.scored_entries);
- `first`: the ranking as it is, the most similar entry first (the order before 2026-11-28);
- `intro`: a task examples intro that tells the agent to state the policy facts of an example on the same policy;
- `reply`: each example written "Customer: ... Reply: ..." instead of "Problem: ... Answer: ...";
- `k1`: only the most similar entry.

    PYTHONPATH=. .venv/bin/python bench/example_order.py /tmp/le.default.db --variants first,last --k 2

It calls the embedded model (one evaluation per variant and split); the figures are the mean reward per message.
`--splits test` measures a library on its held-out test split instead: only to check that a choice made on the
development messages of one data set does not hurt another (the arithmetic set), never to make the choice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TASK = "learning effect benchmark"  # bench/learning_effect.py's task
INTRO = ("Worked examples of similar messages, each answered correctly. When an example is about the same policy as "
         "the customer's message, state that policy's facts (numbers, names, formats) in your reply as the example "
         "does, with the customer's own details:")
PARTS = {"last", "first", "intro", "reply", "k1"}


def prepare(source: Path, target: Path, parts: set[str]) -> tuple[int, list[dict]]:
    """A copy of the database with the variant's changes to the newest version, its library and its task."""
    shutil.copy(source, target)
    with sqlite3.connect(target) as db:
        version_id, stored = db.execute("select id, experiences from libraryversion order by id desc limit 1").fetchone()
        experiences = json.loads(stored)
        if "reply" in parts:
            for entry in experiences:
                entry["text"] = entry["text"].replace("Problem: ", "Customer: ", 1).replace(" Answer: ", " Reply: ", 1)
        db.execute("update libraryversion set experiences = ? where id = ?", (json.dumps(experiences), version_id))
        if "k1" in parts:
            db.execute("update library set selection_k = 1")
        if "intro" in parts:
            db.execute("update task set examples_intro = ?", (INTRO,))
        number = db.execute("select number from libraryversion where id = ?", (version_id,)).fetchone()[0]
    return number, experiences


def measure(database: Path, number: int, experiences: list[dict], k: int,
            splits: tuple[str, ...] = ("train", "validation")) -> dict[int, float]:
    """Mean reward per development message (a message that is itself an example of the library is left out)."""
    from core.grpo.evaluation import create_evaluation, execute_evaluation_async
    from storage.db import make_engine

    engine = make_engine(f"sqlite:///{database}")
    texts = " ".join(entry["text"] for entry in experiences)
    rewards: dict[int, list[float]] = {}
    for split in splits:
        evaluation_id = create_evaluation(engine, TASK, str(number), split=split, k=k)
        asyncio.run(execute_evaluation_async(engine, evaluation_id))
        with sqlite3.connect(database) as db:
            rows = db.execute("select s.id, s.query, r.reward from rollout r join sample s on s.id = r.sample_id "
                              "where r.evaluation_id = ?", (evaluation_id,)).fetchall()
        for sample_id, query, reward in rows:
            if " ".join(query.split())[:60] not in texts:
                rewards.setdefault(sample_id, []).append(reward or 0.0)
    engine.dispose()
    return {sample_id: sum(values) / len(values) for sample_id, values in rewards.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("database", type=Path, help="a default arm's database from learning_effect.py --db")
    parser.add_argument("--variants", default="first,last")
    parser.add_argument("--k", type=int, default=2, help="samples per message")
    parser.add_argument("--splits", default="train,validation", help="comma-separated; test only to check that "
                        "nothing got worse on another data set")
    options = parser.parse_args(argv)
    import core.domain.selection as selection
    import core.grpo.rollouts as rollouts

    prompt_order = selection.select_entries
    work = Path(tempfile.mkdtemp(prefix="example_order."))
    print(f"library: the newest version in {options.database}; k={options.k}; splits {options.splits} (a message "
          "that is itself an example left out)")
    for variant in options.variants.split(","):
        parts = set(variant.split("+"))
        if parts - PARTS:
            parser.error(f"unknown variant part(s) {sorted(parts - PARTS)}; known: {sorted(PARTS)}")
        rollouts.select_entries = (prompt_order if "first" not in parts else
                                   lambda entries, query, chosen: [e for e, _s in selection.ranked_entries(
                                       entries, query, chosen)])
        number, experiences = prepare(options.database, work / f"{variant}.db", parts)
        means = measure(work / f"{variant}.db", number, experiences, options.k, tuple(options.splits.split(",")))
        print(f"{variant:<22} {len(means)} messages  mean reward {sum(means.values()) / max(1, len(means)):.3f}")
    rollouts.select_entries = prompt_order


if __name__ == "__main__":
    main()

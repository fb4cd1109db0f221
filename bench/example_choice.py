"""Which worked example a message is shown, and how it reads, on the shop's development messages (issue 52 item 3).

The agent copied a wrong example's facts: the repair example was the most similar to a return question by BM25
over the whole example, other customer's story included, and it was shown last. This builds, on a fresh copy of the
shop-policies task (learning_effect.py's, 16 train and 8 validation messages), the library the default path keeps
from the 16 train messages when every group learns from its reference: one worked example per need (the first
message of each set of facts that no other message's set contains, as core.domain.coverage keeps them; 7), each
written by the template (core.domain.reference_answers.template_reply). It then evaluates that library, top_k 3,
on the **development** messages only (the 8 validation messages and the train messages that are not themselves an
example; never the test split) under each variant (comma-separated, `+` combines):

- `old`: the examples as the template wrote them before issue 52 ("Price match within 10 days.", the ticket code
  without how it is formed) and the ranking over the whole example's text;
- `reply`: the examples as the template writes them now (core.domain.reference_answers.fact_sentence);
- `rank`: the ranking now: an example matched by what it teaches, its answer weighted over its problem
  (core.domain.selection.ranking_text);
- `intro`: the examples' intro saying they are other people's messages, and to use the one that asks what the
  message asks (core.domain.prompts.EXAMPLES_INTRO's candidate, set as the task's intro);
- `k2`, `k1`: each message shown its 2 (or 1) most similar examples instead of 3 (the default selection when this
  was measured; 2 is the default now, core.domain.selection.DEFAULT_K);
- `first`: the most similar example shown first instead of last, next to the message;
- `clear`: the most similar example shown alone where its BM25 score is at least `--clear-ratio` (2) times the
  second's, else as the selection says (stop 58: two shop misses copied the other example's fact).

    PYTHONPATH=. .venv/bin/python bench/example_choice.py --variants old,reply+rank,reply+rank+intro

It calls the embedded model (two evaluations per variant), as a command-line job (every core when it starts the
model server itself). `--offline` prints, with no model call, how often the example shown last states a policy of
the message, per ranking.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARTS = {"old", "reply", "rank", "intro", "k1", "k2", "first", "clear"}
INTRO = ("Worked examples: other people's messages, each answered correctly. Use the example that asks what your "
         "message asks and state its facts; ignore the others:")


def old_reply(parts) -> str:
    """The template before issue 52: a joining label's fragment as it stands, a code without how it is formed."""
    from core.domain.reference_answers import _ASIDE, _CODE, _JOINING, _sentence

    sentences = []
    for part in parts:
        label = " ".join(_ASIDE.sub("", part.label).split()).rstrip(":")
        words = label.split()
        if words and words[-1].lower() in _JOINING:
            sentences.append(_sentence(f"{label[:1].upper()}{label[1:]} {part.text}"))
        elif _CODE.fullmatch(part.text):
            sentences.append(_sentence(f"Your {label} is {part.text}"))
        else:
            sentences.append(_sentence(f"The {label} is {part.text}"))
    return " ".join(sentences)


def library_rows(train: list[dict]) -> list[dict]:
    """The train messages the default path's examples come from: the first of each set of needs that no other
    message's set contains (an example whose need another example's includes is replaced or refused)."""
    from core.domain.coverage import needs_of

    sets = [(row, needs_of("facts", row["answer"])) for row in train]
    kept, seen = [], []
    for row, needs in sets:
        if any(needs < other for _row, other in sets) or needs in seen:
            continue
        seen.append(needs)
        kept.append(row)
    return kept


def build(database: Path, parts: set[str]) -> tuple[str, list[dict]]:
    """The task, the library of examples (written as the variant says) and its selection, top_k 3."""
    import bench.learning_effect as le
    from core.domain.library import EXAMPLE, entry
    from core.domain.reference_answers import example_text, reference_parts, template_reply
    from core.records.library.selection import set_selection
    from core.records.library.versions import create_version
    from core.records.tasks.lookup import ensure_library, get_task
    from storage.db import make_engine, session_scope

    options = le.parse_args(["--dataset", "policy", "--train-limit", "16", "--validation-size", "8", "--db",
                             str(database)])
    train, test, _notes = le.policy_records()
    engine = make_engine(f"sqlite:///{database}")
    le.create_task(engine, options, train, test)
    write = template_reply if "reply" in parts else old_reply
    experiences = [entry(f"E{i + 1}", example_text(row["query"], write(reference_parts("facts", row["answer"]))),
                         EXAMPLE) for i, row in enumerate(library_rows(train[:16]))]
    set_selection(engine, le.TASK, "default", "top_k", 1 if "k1" in parts else 2 if "k2" in parts else 3, "cli")
    with session_scope(engine) as session:
        task = get_task(session, le.TASK)
        if "intro" in parts:
            task.examples_intro = INTRO
            session.add(task)
        version = create_version(session, ensure_library(session, task), experiences, parent_id=None,
                                 source="import", created_by="cli", note="bench/example_choice.py")
        number = version.number
    engine.dispose()
    return str(number), experiences


def offline() -> None:
    """How often the example shown last (the most similar) states a policy of the message, per ranking: no model."""
    import bench.learning_effect as le
    import core.domain.selection as selection
    from core.domain.coverage import needs_of, needs_stated
    from core.domain.library import EXAMPLE, entry
    from core.domain.reference_answers import example_text, reference_parts, template_reply

    train = le.policy_records()[0]
    rows = library_rows(train[:16])
    library = [entry(f"E{i + 1}", example_text(r["query"], template_reply(reference_parts("facts", r["answer"]))),
                     EXAMPLE) for i, r in enumerate(rows)]
    universe = frozenset().union(*(needs_of("facts", r["answer"]) for r in train))
    development = [r for r in train[:24] if r not in rows]
    chosen = selection.Selection.build("top_k", 3)
    for name, text in (("whole text", lambda e: str(e.get("text") or "")), ("now", selection.ranking_text)):
        selection.ranking_text, kept = text, selection.ranking_text
        right = 0
        for row in development:
            needs = needs_of("facts", row["answer"])
            last = selection.select_entries(library, row["query"], chosen)[-1]
            policies = [n for n in needs if n.code_prefix is None] or list(needs)
            right += any(n in needs_stated(last["text"], universe) for n in policies)
        selection.ranking_text = kept
        print(f"ranking {name:<11} the example shown last states a policy of the message: {right} of "
              f"{len(development)}")


def clear_or(shown, ratio: float):
    """`shown`, except that a message whose top example scores `ratio` times the second's sees that one alone."""
    from core.domain import selection

    def select(entries, query, chosen):
        ranked = selection.ranked_entries(entries, query, chosen)
        if len(ranked) >= 2 and ranked[0][1] is not None and ranked[0][1] >= ratio * max(ranked[1][1] or 0.0, 1e-9):
            return [ranked[0][0]]
        return shown(entries, query, chosen)
    return select


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="old,reply+rank")
    parser.add_argument("--k", type=int, default=2, help="samples per message")
    parser.add_argument("--offline", action="store_true", help="only the ranking, no model call")
    parser.add_argument("--clear-ratio", type=float, default=2.0, help="`clear`: the top score over the second's")
    options = parser.parse_args(argv)
    if options.offline:
        offline()
        return
    import core.domain.selection as selection
    import core.grpo.rollouts as rollouts
    from bench.example_order import measure
    from core.models.model_server import command_line_job

    now, shown = selection.ranking_text, rollouts.select_entries
    work = Path(tempfile.mkdtemp(prefix="example_choice."))
    print(f"library: one template example per need of the shop's first 16 train messages; top_k 3; k={options.k}; "
          "development messages: 8 validation and the train messages that are no example")
    with command_line_job():
        for variant in options.variants.split(","):
            parts = set(variant.split("+"))
            if parts - PARTS:
                parser.error(f"unknown variant part(s) {sorted(parts - PARTS)}; known: {sorted(PARTS)}")
            selection.ranking_text = now if "rank" in parts else (lambda e: str(e.get("text") or ""))
            rollouts.select_entries = (lambda *a, **kw: shown(*a, **kw)[::-1]) if "first" in parts else shown
            if "clear" in parts:
                rollouts.select_entries = clear_or(rollouts.select_entries, options.clear_ratio)
            database = work / f"{re.sub(r'[^a-z0-9]+', '_', variant)}.db"
            number, experiences = build(database, parts)
            means = measure(database, int(number), experiences, options.k)
            print(f"{variant:<22} {len(means)} messages  mean reward {sum(means.values()) / max(1, len(means)):.3f}  "
                  f"{json.dumps({k: round(v, 2) for k, v in sorted(means.items())})}", flush=True)
    selection.ranking_text, rollouts.select_entries = now, shown


if __name__ == "__main__":
    main()

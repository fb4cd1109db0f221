"""How a worked example made from a reference reads (issue 52 item 2), by a rubric a script can apply the same way
every time, with no model: the embedded 0.5B judge cannot tell a good support reply from a bad one (bench/README.md,
`judge.py`), and a person's labels were not to be had in this session.

For each example it checks five things a support lead would ask of a reply:

- `facts`: it states every fact of the message's reference (the task's own reward scores it 1);
- `reply`: it is written to the person (you, your, we, our), not about them or in their voice (I, my);
- `sentences`: every sentence has a verb (one of the common verbs and auxiliaries below), so no sentence is a bare
  label and value such as "Price match within 10 days.";
- `asked`: it answers what was asked: a sentence that states a fact shares a content word with the message's
  question (the sentences that end in "?", else the last one), e.g. "return" for "Can I return it?";
- `no template`: no quiz or form wording ("The answer is", "We can confirm", "Answer:", the raw reference).

    PYTHONPATH=. .venv/bin/python bench/example_reading.py --dataset policy          # the template, old and now
    PYTHONPATH=. .venv/bin/python bench/example_reading.py --db /tmp/le.default.db    # a run's examples
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHECKS = ("facts", "reply", "sentences", "asked", "no template")
# Common verbs and auxiliaries of a support reply; a sentence without any is a fragment.
VERBS = frozenset("""is are was were be been am go goes get gets come comes take takes has have had must can could will
would may might should shall do does did offer offers give gives send sends keep keeps need needs apply applies
expire expires retry retries accept accepts allow allows match matches refund refunds return returns ship ships
cover covers handle handles run runs reach reaches arrive arrives quote stays stay store stores""".split())
STOP = frozenset("""a an the and or but if of to in on at for by with from about into over under after before than
i you we they it this that these those my your our their me us them is are was were be been am do does did can could
will would may might should shall have has had what which who whom whose when where why how there here not no yes
any some much many more most so very just also still only too up out as""".split())
TEMPLATE = re.compile(r"\b(the answer is|we can (also )?confirm)\b|\banswer:", re.I)


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s]


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def stem(word: str) -> str:
    """A word's first five letters without a plural s: "logs" and "log", "returned" and "return" meet."""
    return word[:5].removesuffix("s")


def question(query: str) -> str:
    asked = [s for s in sentences(query) if s.endswith("?")]
    return " ".join(asked or sentences(query)[-1:])


def reading(query: str, reference: str, answer: str) -> dict[str, bool]:
    """The five checks of one example's answer against its message and reference."""
    from core.domain.rewards import score_or_error

    said = sentences(answer)
    stating = [s for s in said if score_or_error("facts", s, reference, {"partial": True}).value > 0]
    asked = {w for w in words(question(query)) if w not in STOP and not w.isdigit()}
    stems = {stem(w) for w in asked}
    return {
        "facts": score_or_error("facts", answer, reference, {}).value >= 1.0,
        "reply": bool({"you", "your", "we", "our"} & set(words(answer))) and not {"i", "my"} & set(words(answer)),
        "sentences": all(VERBS & set(words(s)) for s in said),
        "asked": any({stem(w) for w in words(s) if w not in STOP} & stems for s in stating),
        "no template": not TEMPLATE.search(answer) and " ".join(reference.split()) not in answer,
    }


def from_template(dataset: str) -> dict[str, list[tuple[str, str, str]]]:
    """Each train and validation message of a data set with the template's answer, old and now."""
    from bench.example_choice import old_reply
    from core.domain.reference_answers import reference_parts, template_reply

    if dataset == "policy":
        path = ROOT / "data" / "demo" / "policy_messages.jsonl"
    else:
        path = ROOT / "bench" / "fernhill_limits.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [row for row in rows if row["split"] != "test"]
    return {name: [(row["query"], row["reference"], write(reference_parts("facts", row["reference"])))
                   for row in rows] for name, write in (("old template", old_reply), ("template now", template_reply))}


def from_database(database: Path) -> dict[str, list[tuple[str, str, str]]]:
    """The worked examples a run proposed (applied or not), each with its group's message and reference."""
    with sqlite3.connect(database) as db:
        rows = db.execute("select o.text, o.status, s.query, s.reference from operation o join advantage a on "
                          "a.id = json_extract(o.source_advantage_ids, '$[0]') join sample s on s.id = a.sample_id "
                          "where o.text like 'Problem: %' order by o.id").fetchall()
    return {f"{database.name}": [(query, reference, text.split(" Answer: ", 1)[-1]) for text, _status, query, reference
                                 in rows]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=("policy", "fernhill"))
    parser.add_argument("--db", type=Path, help="a learning_effect.py arm's database: its run's examples")
    parser.add_argument("--show", action="store_true", help="print every answer with the checks it fails")
    options = parser.parse_args(argv)
    groups = from_database(options.db) if options.db else from_template(options.dataset or "policy")
    for name, examples in groups.items():
        results = [reading(query, reference, answer) for query, reference, answer in examples]
        totals = "  ".join(f"{check} {sum(r[check] for r in results)}/{len(results)}" for check in CHECKS)
        print(f"{name:<28} {totals}  all five {sum(all(r.values()) for r in results)}/{len(results)}")
        if options.show:
            for (_query, _reference, answer), result in zip(examples, results, strict=True):
                failed = [check for check in CHECKS if not result[check]]
                print(f"    {answer}" + (f"   [fails: {', '.join(failed)}]" if failed else ""))


if __name__ == "__main__":
    main()

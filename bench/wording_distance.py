"""How far a frozen task's test (and validation) messages are worded from its training messages (issue 59, item 4).

A library that helps on held-out messages only because they repeat the training messages' words measures
recall of wording, not learning. So the test messages of bench/alderbank_permits.jsonl are written far from the
training messages of the same need, and this script checks it, with no model: for each test message, the most
content words it shares with any training message of its own need, and the mean and max of that over the split;
the same for validation. Content words are lowercase alphabetic tokens, a plural's "s" dropped, minus bm25s's
English stop words and minus the words of the task's instructions (which every message may echo).

A row's need is its `need` field, else the labels of its reference's facts (the text before ":" of each fact
separated by ";", as in bench/fernhill_limits.jsonl and the shop demo); a message is compared with the training
messages that share a need with it.

    .venv/bin/python bench/wording_distance.py                       # all three task files
    .venv/bin/python bench/wording_distance.py bench/alderbank_permits.jsonl --task bench/alderbank_task.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

from bm25s.stopwords import STOPWORDS_EN_PLUS

ROOT = Path(__file__).resolve().parent.parent
STOP = frozenset(STOPWORDS_EN_PLUS)
_TOKEN = re.compile(r"[^\W\d_]+")  # letters only: "café's" -> "café", "s"
# each task file and its instructions: a frozen task's JSON, or None for the shop demo's (core.records.tasks.demos)
TASK_FILES: dict[Path, Path | None] = {
    ROOT / "bench" / "fernhill_limits.jsonl": ROOT / "bench" / "fernhill_task.json",
    ROOT / "bench" / "alderbank_permits.jsonl": ROOT / "bench" / "alderbank_task.json",
    ROOT / "data" / "demo" / "policy_messages.jsonl": None,
}


def _normal(token: str) -> str:
    """A token with a plural ending dropped ("parties" -> "party", "permits" -> "permit"), so both count once."""
    if len(token) > 4 and token.endswith("ies"):
        return token[:-3] + "y"
    if len(token) > 3 and token.endswith("s") and not token.endswith("ss"):
        return token[:-1]
    return token


def content_words(text: str, ignore: Iterable[str] = ()) -> frozenset[str]:
    """The text's content words: lowercase alphabetic tokens, normalised, minus stop words and `ignore`."""
    ignored = STOP | frozenset(ignore)
    words = (_normal(t) for t in _TOKEN.findall(text.lower()) if t not in STOP)
    return frozenset(w for w in words if w not in ignored)


def instruction_words(instructions: str) -> frozenset[str]:
    """The words of a task's instructions, normalised like a message's (removed from every message)."""
    return content_words(instructions)


def needs(row: dict) -> frozenset[str]:
    """A row's needs: its `need` field, else each reference fact's label (before ":"), else the fact itself."""
    if row.get("need"):
        return frozenset({str(row["need"])})
    facts = [f.strip() for f in str(row.get("reference", "")).split(";") if f.strip()]
    return frozenset(f.split(":", 1)[0].strip() if ":" in f else f for f in facts)


@dataclass(frozen=True)
class Closest:
    """One held-out message and the training message of its need it shares the most content words with."""

    row_id: str
    train_id: str | None
    shared: frozenset[str]


def closest(rows: Sequence[dict], split: str, ignore: Iterable[str] = (), base: str = "train") -> list[Closest]:
    """For each message of `split`, the `base` message of a shared need with the most content words in common."""
    ignored = frozenset(ignore)
    train = [(r, needs(r), content_words(r["query"], ignored)) for r in rows if r.get("split") == base]
    found = []
    for row in (r for r in rows if r.get("split") == split):
        words, own = content_words(row["query"], ignored), needs(row)
        best: Closest = Closest(str(row.get("id")), None, frozenset())
        for other, other_needs, other_words in train:
            common = words & other_words
            if own & other_needs and (best.train_id is None or len(common) > len(best.shared)):
                best = Closest(str(row.get("id")), str(other.get("id")), common)
        found.append(best)
    return found


def check_far(rows: Sequence[dict], max_shared: int = 2, instructions: str = "", split: str = "test") -> list[str]:
    """The messages of `split` that share more than `max_shared` content words (the instructions' words not
    counted) with a training message of their need, each as "id ~ train id: words"; empty when all are far."""
    return [f"{c.row_id} ~ {c.train_id}: {', '.join(sorted(c.shared))}"
            for c in closest(rows, split, instruction_words(instructions)) if len(c.shared) > max_shared]


def read_rows(path: Path) -> list[dict]:
    """The rows of a JSON-lines task file."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_instructions(task: Path | None) -> str:
    """A frozen task's instructions from its JSON, or with None the shop demo's."""
    if task is not None:
        return str(json.loads(task.read_text(encoding="utf-8"))["instructions"])
    sys.path.insert(0, str(ROOT))
    from core.records.tasks.demos import POLICY_INSTRUCTIONS

    return POLICY_INSTRUCTIONS


def report(path: Path, instructions: str) -> list[str]:
    """Lines of figures for one task file: per held-out split, the mean and max shared words and the closest."""
    rows, ignore = read_rows(path), instruction_words(instructions)
    lines = [f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {len(rows)} rows, "
             f"{len({n for r in rows for n in needs(r)})} needs"]
    for split in ("test", "validation"):
        found = [c for c in closest(rows, split, ignore) if c.train_id is not None]
        if not found:
            continue
        counts = [len(c.shared) for c in found]
        worst = max(found, key=lambda c: len(c.shared))
        lines.append(f"  {split} vs train: {len(found)} messages, shared content words mean {mean(counts):.2f}, "
                     f"max {max(counts)} ({worst.row_id} ~ {worst.train_id}: {', '.join(sorted(worst.shared))})")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="task files (JSON lines); default: all three")
    parser.add_argument("--task", type=Path, help="the task JSON with the instructions, for a file not known here")
    options = parser.parse_args(argv)
    files = [p.resolve() for p in options.files] or list(TASK_FILES)
    for path in files:
        if not options.task and path not in TASK_FILES:
            parser.error(f"{path}: give the task JSON with its instructions (--task)")
        task = options.task or TASK_FILES[path]
        print("\n".join(report(path, read_instructions(task))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

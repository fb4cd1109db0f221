"""Which part of learning helps? Train one arm per part with the validation gate on, evaluate every arm on the
same held-out queries, and compare each with the empty library of the same agent mode, query by query.

Two data sets (`--dataset`):

- `arithmetic` (default): a train file and a test file (JSONL, `query`/`answer`, common alternatives mapped;
  by default SVAMP to train, MAWPS MultiArith to test), the arithmetic demo's instructions, reward `math`.
  Reasoning on unseen problems: what the embedded 0.5B agent has not been seen to learn.
- `policy`: the shop-policies demo (data/demo/policy_messages.jsonl; its train and test messages), reward
  `facts`. Knowledge the agent cannot have (the shop's policies are not in its instructions), which a small
  model can use once a lesson supplies it.
- `fernhill`: the second knowledge task (bench/fernhill_limits.jsonl and bench/fernhill_task.json, frozen before
  any tuning, issue 52): developers' questions about a fictional cloud platform's limits, with its own train,
  validation and test splits, reward `facts`. A default chosen on the shop's development messages is checked here.

On a fresh SQLite file this creates one task, its train queries, `validation` queries (the train rows after
the training rows: the gate measures on them) and test queries, then:

1. evaluates the empty library on the test queries in each mode of `--modes` (`direct`, `python`: the agent
   runs its code in the jail), k samples each;
2. trains each arm of `--arms` in the mode `--train-mode`, every run created as `python -m core train` creates
   it (core.grpo.training.create_run_with_defaults): the options' sizes given (epochs, batch size, group size,
   seed, the gate's validation size and k; the gate rule only with `--gate`), and every learning switch a run
   of `train` would leave unset chosen by core.records.runs.defaults for the task's learner, unless the arm
   sets it:
   - `default`: the default path, nothing set beyond the sizes: what a person gets. For the embedded learner:
     worked examples on, a group where every attempt failed learning from its reference, lessons off,
     flagged operations refused before the gate (hold_flagged on), the library's selection `top_k` (2);
   - `default+lessons`: the default path with lessons on (lessons and worked examples);
   - `default-hold`: the default path with hold_flagged off: flagged operations go to the gate like the others;
   - `paper`: lessons only, the paper's defaults (examples and the reference option off; the library shows
     all its entries): the path a capable learner gets, run with this learner;
   - `lessons+reference` (not by default): the paper's lessons, and a group where every attempt failed learns
     from its reference answer as the successful side;
   - `direct` (not by default): experiences asked for directly, without rollouts (the paper's baseline);
   the table says, per row, which switches its run has that the default path's has not;
3. evaluates each arm's final library on the same test queries with the same k and seeds;
4. on `policy`, where the default path ran (`--by-hand`, the default there): `default, by hand`, the default
   path's library with each worked example's answer replaced by the reply a person wrote for the same message
   (`--replies`, bench/policy_replies.jsonl: every train message, each stating its facts as a support agent
   would and scoring 1 with the task's reward), evaluated the same way and compared query by query with the
   empty library and with the default path: the issue's target, the default path's examples doing as well as
   the same examples written by hand.

Each arm runs in its own copy of the database taken after the empty libraries' evaluations, so every arm
starts from the empty library and its runs, libraries and figures are its own. The earlier arms' calls come
with it as response cache (`--share-cache`, the default): a request an earlier arm already made, such as the
first step's answers from the same empty library with the same seeds, is answered as it was and counted in
`cached`, not `calls` (the default size of both data sets, with the arms before the default path: 42 minutes
on 2 cores, 62 without sharing); `--no-share-cache` makes every arm pay for all its calls, so that its wall
time is what it costs alone. The evaluations share common random numbers (the same seed per query and sample
index), so each library is compared with the empty library of its mode query by query
(core.records.evaluation.comparison: paired bootstrap interval, sign test, and the smallest difference these queries
could detect).

Prints one table (entries, Mean@k, Pass@k, difference to the empty library of the same mode with its 95%
interval, sign-test p, smallest detectable difference, model calls, tokens, wall time, and what the arm changes
against the default path), whether the goal is met, the defaults the default path chose with their reasons
(as `train` prints them), a line per trained arm with its gate decisions and groups, and the command line;
`--json PATH` writes the same figures. Loads the embedded model: run it alone, under `flock /tmp/model.lock`
when others may load one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import shlex
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import closing, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: no price list download
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
TASK = "learning effect benchmark"
VALIDATION = "validation"  # core.grpo.gate.VALIDATION_SPLIT: the gate uses the task's validation split when it has one
BY_HAND = "default, by hand"  # the default path's examples, their answers written by a person (--by-hand)
REPLIES = ROOT / "bench" / "policy_replies.jsonl"
FERNHILL_TASK = ROOT / "bench" / "fernhill_task.json"  # frozen (issue 52): never tuned on, never changed
FERNHILL_MESSAGES = ROOT / "bench" / "fernhill_limits.jsonl"
ALDERBANK_TASK = ROOT / "bench" / "alderbank_task.json"  # frozen (issue 59): never tuned on, never changed
ALDERBANK_MESSAGES = ROOT / "bench" / "alderbank_permits.jsonl"
FROZEN = {"fernhill": (FERNHILL_TASK, FERNHILL_MESSAGES), "alderbank": (ALDERBANK_TASK, ALDERBANK_MESSAGES)}
PERSON = "a person's lessons"  # the ceiling: lessons a person who knows the task wrote from its facts (--person)
PERSON_LESSONS = ROOT / "bench" / "person_lessons"  # <dataset>.txt: one lesson a line, imported as a person would
# What a reply that copies the library's own block looks like: an entry's id or a worked example's field.
COPIED_FORMAT = re.compile(r"\[E\d|Problem:")
GOAL = 0.05  # the goal in bench/README.md: a gated library beats the empty library of its mode by 5 points, p < 0.05
MODES = ("direct", "python")

# Field names accepted for the query and the answer, first match wins (case-insensitive). SVAMP's query is
# its Body and Question joined with a space.
QUERY_FIELDS = ("query", "problem", "question", "input")
ANSWER_FIELDS = ("answer", "reference", "target")


@dataclass(frozen=True)
class ArmPlan:
    """What one trained arm sets beyond the sizes; None leaves the switch to the defaults a new run gets for its
    learner (core.records.runs.defaults.chosen_defaults), as `python -m core train` without the switch does."""

    lessons: bool | None = None
    examples: bool | None = None
    reference: bool | None = None  # RunSettings.reference_when_all_fail
    hold_flagged: bool | None = None
    direct: bool = False  # a `direct` run: experiences asked for without rollouts

    def given(self) -> dict:
        """The RunSettings values the arm sets (the CLI's flags it would pass)."""
        values = {"lessons": self.lessons, "examples": self.examples, "reference_when_all_fail": self.reference,
                  "hold_flagged": self.hold_flagged}
        return {name: value for name, value in values.items() if value is not None}


DEFAULT_PATH = "default"
ARMS = {
    DEFAULT_PATH: ArmPlan(),  # the default path: nothing set beyond the sizes
    "default+lessons": ArmPlan(lessons=True),
    "default-hold": ArmPlan(hold_flagged=False),
    "paper": ArmPlan(lessons=True, examples=False, reference=False),  # the paper's defaults: a capable learner's
    "lessons+reference": ArmPlan(lessons=True, examples=False, reference=True),
    "direct": ArmPlan(direct=True),
}
DEFAULT_ARMS = (DEFAULT_PATH, "default+lessons", "default-hold", "paper")
# The learning switches a row is compared on with the default path, as the table names them.
SWITCHES = {"examples": "examples", "lessons": "lessons", "reference_when_all_fail": "reference",
            "hold_flagged": "hold_flagged", "selection": "selection"}

# Sizes per data set, for about 45 minutes for both on 2 CPU cores with the embedded 0.5B model (bench/README.md).
DEFAULTS = {
    "arithmetic": {"train_limit": 4, "test_limit": 12, "epochs": 1, "batch_size": 4, "group_size": 4, "k": 2,
                   "validation_size": 4, "gate_k": 1, "modes": "direct,python"},
    # both knowledge tasks at the sizes `python -m core train` gives (RunSettings' defaults): 16 train messages,
    # 3 epochs of 8, G=5, the gate at k=2 on 8 validation messages
    "policy": {"train_limit": 16, "test_limit": 0, "epochs": 3, "batch_size": 8, "group_size": 5, "k": 2,
               "validation_size": 8, "gate_k": 2, "modes": "direct"},
    "fernhill": {"train_limit": 0, "test_limit": 0, "epochs": 3, "batch_size": 8, "group_size": 5, "k": 2,
                 "validation_size": 8, "gate_k": 2, "modes": "direct"},
    "alderbank": {"train_limit": 0, "test_limit": 0, "epochs": 3, "batch_size": 8, "group_size": 5, "k": 2,
                  "validation_size": 8, "gate_k": 2, "modes": "direct"},
}


@dataclass
class Arm:
    """One row of the table: a library (or an empty one), how it was made and how it scored on the test set."""

    name: str
    mode: str = "direct"  # the agent mode of the task in this arm's database
    library: str | None = None  # None: the empty library, no run
    database: str | None = None  # the SQLite file the arm ran in (its own copy)
    plan: dict | None = None  # ArmPlan as a dict
    gate: str | None = None  # GateRule of its run, as stored with it
    switches: dict = field(default_factory=dict)  # the run's learning switches as stored (SWITCHES' fields)
    changes: list = field(default_factory=list)  # "lessons on", ...: its switches unlike the default path's
    choices: list = field(default_factory=list)  # the defaults chosen for its run, one line each (Choice.line)
    run_id: int | None = None
    run_status: str | None = None
    run_error: str | None = None
    version_id: int | None = None
    experiences: int = 0
    examples: int = 0  # of the experiences, worked examples
    steps: int = 0
    operations_proposed: int = 0
    operations_applied: int = 0
    operations_invalid: int = 0  # refused before the gate: invalid, or flagged with hold_flagged on
    groups: dict = field(default_factory=dict)  # ok / skipped / failed / from_reference -> groups, over the steps
    gate_decisions: dict = field(default_factory=dict)  # decision -> steps
    gate_lines: list = field(default_factory=list)  # one line per step that had a gate
    evaluation_id: int | None = None
    evaluation_status: str | None = None
    evaluation_error: str | None = None
    n: int = 0
    mean_at_k: float | None = None
    pass_at_k: float | None = None
    rollout_errors: int = 0
    reference: str | None = None  # the empty arm this one is compared with
    comparison: dict | None = None  # core.records.evaluation.comparison.Paired as a dict (B = this arm, A = its reference)
    by_hand: bool = False  # BY_HAND: no run; the default path's library with its examples' answers hand-written
    against_default_path: dict | None = None  # for BY_HAND: Paired with A = the default path, B = this arm
    train_calls: dict = field(default_factory=dict)  # storage.queries.call_totals of the run
    eval_calls: dict = field(default_factory=dict)  # ... of the test-set evaluation
    train_s: float = 0.0
    eval_s: float = 0.0
    per_policy: dict = field(default_factory=dict)  # a test reference's need (policy) -> [Mean@k of its queries]
    coverage: str | None = None  # core.domain.coverage's line for the arm's library on the train references
    uncovered_needs: list = field(default_factory=list)  # needs of the train references no example states
    refused_for_space: int = 0  # worked examples refused because the library was full (each the only of its need)
    person: bool = False  # PERSON: no run; a person's lessons imported as a library of their own
    copied_format: int = 0  # test replies that copy the library's block (an "[E1]" id or "Problem:")
    replies: int = 0  # test replies with a text
    shown_needs: int = 0  # test rollouts shown an entry stating each need of their message
    shown_total: int = 0  # test rollouts of a library with a shown_ids list and a message with needs
    shown_per_need: dict = field(default_factory=dict)  # need -> [shown it, rollouts]

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
    from core.domain.datasets import parse_dataset

    if not records:
        return []
    lines = [json.dumps({"id": f"{prefix}-{i}", "query": r["query"], "answer": r["answer"]}, ensure_ascii=False)
             for i, r in enumerate(records, start=1)]
    return parse_dataset("\n".join(lines).encode(), f"{prefix}.jsonl", default_split=split)


def policy_records() -> tuple[list[dict], list[dict], list[str]]:
    """The shop-policies demo's train and test messages as {"query", "answer"} (the answer: its facts)."""
    from core.records.tasks.demo_data import policy_rows

    rows = policy_rows()
    train = [{"query": r.query, "answer": r.reference} for r in rows if r.split == "train"]
    test = [{"query": r.query, "answer": r.reference} for r in rows if r.split == "test"]
    return train, test, [f"policy_messages.jsonl: {len(train)} train and {len(test)} test messages"]


def frozen_records(dataset: str) -> tuple[list[dict], list[dict], list[dict], list[str]]:
    """A frozen knowledge task's train, validation and test messages as {"query", "answer"}, split as its file
    gives them."""
    messages = FROZEN[dataset][1]
    rows = [json.loads(line) for line in messages.read_text(encoding="utf-8").splitlines() if line.strip()]
    split = {name: [{"query": r["query"], "answer": r["reference"]} for r in rows if r["split"] == name]
             for name in ("train", VALIDATION, "test")}
    note = (f"{messages.name}: {len(split['train'])} train, {len(split[VALIDATION])} validation and "
            f"{len(split['test'])} test messages")
    return split["train"], split[VALIDATION], split["test"], [note]


def task_settings(options: argparse.Namespace):
    """The benchmark task's instructions and reward: the arithmetic demo's, or the shop-policies demo's."""
    from core.domain.prompts import PAPER_WORDING
    from core.records.tasks.demos import (
        DEMO_ANSWER_FORMAT,
        DEMO_INSTRUCTIONS,
        POLICY_ANSWER_FORMAT,
        POLICY_INSTRUCTIONS,
    )
    from core.records.tasks.task_io import TaskSettings

    common = {"name": TASK, "agent_mode": "direct", "policy_model": options.model,
              "learner_model": options.learner_model, "judge_model": options.learner_model}
    if options.dataset in FROZEN:
        frozen = json.loads(FROZEN[options.dataset][0].read_text(encoding="utf-8"))
        return TaskSettings(description=frozen["description"], instructions=frozen["instructions"],
                            answer_format=frozen["answer_format"], reward_method=frozen["reward_method"],
                            reward_settings=frozen["reward_settings"], **common)
    if options.dataset == "policy":
        return TaskSettings(description="The shop-policies demo's messages, for bench/learning_effect.py.",
                            instructions=POLICY_INSTRUCTIONS, answer_format=POLICY_ANSWER_FORMAT,
                            reward_method="facts", **common)
    return TaskSettings(description="Train and test files of bench/learning_effect.py.", instructions=DEMO_INSTRUCTIONS,
                        answer_format=DEMO_ANSWER_FORMAT, reward_method="math", library_header=PAPER_WORDING.header,
                        examples_intro=PAPER_WORDING.examples_intro, **common)  # the arithmetic demo's wording


def create_task(engine, options: argparse.Namespace, train: list[dict], test: list[dict],
                validation: list[dict] | None = None) -> dict:
    """The benchmark's task with its train, validation and test queries; returns the query counts per split. The
    validation queries are the first `--validation-size` of `validation` where the data set has its own, else the
    train rows after the training rows."""
    from core.records.tasks.lookup import get_task
    from core.records.tasks.samples import add_samples
    from core.records.tasks.task_io import save_task
    from storage.db import session_scope

    held_out = 0 if validation is not None else options.validation_size
    n_train = len(train) - held_out if options.train_limit is None else options.train_limit
    if n_train < 1:
        raise SystemExit(f"{options.dataset}: {len(train)} train rows: not enough for training and "
                         f"{options.validation_size} validation queries")
    train_part = train[:n_train]
    validation_part = (validation if validation is not None else train[n_train:])[:options.validation_size]
    if len(validation_part) < options.validation_size:
        raise SystemExit(f"{options.dataset}: {len(train)} train rows: not enough for {n_train} training and "
                         f"{options.validation_size} validation queries")
    rows = (sample_rows(train_part, "train", "train") + sample_rows(validation_part, "validation", VALIDATION)
            + sample_rows(test[: options.test_limit], "test", "test"))
    save_task(engine, task_settings(options), actor="cli")
    with session_scope(engine) as session:
        add_samples(session, get_task(session, TASK), rows)
    return dict(Counter(row.split for row in rows))


# ---------------------------------------------------------------- phases


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def set_mode(engine, mode: str) -> None:
    """The task's agent mode in this arm's own database (each arm has its copy)."""
    from core.records.tasks.lookup import get_task
    from storage.db import session_scope

    with session_scope(engine) as session:
        task = get_task(session, TASK)
        task.agent_mode = mode
        session.add(task)


async def evaluate(engine, arm: Arm, options: argparse.Namespace, gateway) -> None:
    """The arm's library (or the empty one) on the test queries, k samples each."""
    from sqlmodel import Session

    from core.grpo.evaluation import create_evaluation, execute_evaluation_async
    from storage import queries
    from storage.tables import Library, LibraryVersion

    with Session(engine) as session:  # create_evaluation takes the version as a person names it: its number
        version = session.get(LibraryVersion, arm.version_id) if arm.version_id is not None else None
        library = session.get(Library, version.library_id).name if version else "default"
    ref = "empty" if version is None else str(version.number)
    arm.evaluation_id = create_evaluation(engine, TASK, ref, split="test", k=options.k, model=options.model,
                                          library_name=library)
    progress(f"{arm.name}: evaluating {arm.experiences} entries on the test queries in {arm.mode} mode "
             f"(evaluation {arm.evaluation_id})")
    started = time.perf_counter()
    ev = await execute_evaluation_async(engine, arm.evaluation_id, gateway=gateway)
    arm.eval_s = time.perf_counter() - started
    arm.evaluation_status, arm.evaluation_error = ev.status, ev.error
    arm.n, arm.mean_at_k, arm.pass_at_k = ev.n or 0, ev.mean_at_k, ev.pass_at_k
    arm.rollout_errors = (ev.metrics or {}).get("errors", 0)
    with Session(engine) as session:
        arm.eval_calls = queries.call_totals(session, evaluation_id=arm.evaluation_id)
    per_policy(engine, arm)
    reply_figures(engine, arm)
    progress(f"{arm.name}: evaluation {ev.status} in {arm.eval_s:.0f} s")


def reply_figures(engine, arm: Arm) -> None:
    """What the test replies show beside their reward (issue 59): how many copy the library's block (an entry's
    "[E1]" id, a worked example's "Problem:") instead of answering, and for a library the retrieval hit rate: the
    rollouts whose shown entries state every need of their message between them, overall and per need."""
    from sqlmodel import Session

    from core.domain.coverage import needs_of, needs_stated
    from core.records.tasks.lookup import get_task
    from storage import queries
    from storage.tables import LibraryVersion

    with Session(engine) as session:
        task = get_task(session, TASK)
        by_id = ({str(e.get("id")): e for e in session.get(LibraryVersion, arm.version_id).experiences}
                 if arm.version_id is not None else {})
        for sample in queries.samples(session, task.id, "test"):
            needs = needs_of(task.reward_method, sample.reference, task.reward_settings)
            for rollout in queries.evaluation_sample_rollouts(session, arm.evaluation_id, sample.id):
                if rollout.response:
                    arm.replies += 1
                    arm.copied_format += bool(COPIED_FORMAT.search(rollout.response))
                if not by_id or not needs or rollout.shown_ids is None:
                    continue
                stated = frozenset().union(*(needs_stated(by_id[i]["text"], needs) for i in rollout.shown_ids
                                             if i in by_id))
                arm.shown_total += 1
                arm.shown_needs += needs <= stated
                for need in needs:
                    counts = arm.shown_per_need.setdefault(need.key, [0, 0])
                    counts[0] += need in stated
                    counts[1] += 1


def per_policy(engine, arm: Arm) -> None:
    """Mean@k per need (a policy: a fact of the references, codes masked, core.domain.coverage) over the test
    queries whose reference holds it, and for a library what it covers of the train references: which train
    references an example retrieval shows them states, and which needs no example states. Tasks whose reward
    counts no facts (arithmetic) have no needs: nothing is recorded."""
    from sqlmodel import Session

    from core.domain.coverage import coverage, needs_of, needs_stated
    from core.domain.library import examples
    from core.records.library.selection import library_selection
    from core.records.tasks.lookup import get_task
    from storage import queries
    from storage.tables import LibraryVersion

    with Session(engine) as session:
        task = get_task(session, TASK)
        for sample in queries.samples(session, task.id, "test"):
            rewards = [r.reward for r in queries.evaluation_sample_rollouts(session, arm.evaluation_id, sample.id)
                       if r.reward is not None]
            for need in needs_of(task.reward_method, sample.reference, task.reward_settings):
                if rewards:
                    arm.per_policy.setdefault(need.key, []).append(sum(rewards) / len(rewards))
        if arm.version_id is None:
            return
        entries = session.get(LibraryVersion, arm.version_id).experiences
        training = queries.samples(session, task.id, "train")  # the messages the run trained on (not validation)
        result = coverage(entries, [(s.external_id, s.query, s.reference) for s in training], task.reward_method,
                          task.reward_settings, library_selection(engine, TASK, arm.library or "default"))
        arm.coverage = result.line()
        wanted = frozenset().union(*(needs_of(task.reward_method, s.reference, task.reward_settings)
                                     for s in training))
        stated = frozenset().union(*(needs_stated(e["text"], wanted) for e in examples(entries)))
        arm.uncovered_needs = sorted(n.key for n in wanted - stated)


def arm_given(arm: Arm, options: argparse.Namespace) -> dict:
    """What an arm's run is given, as `python -m core train` would be: the options' sizes (the models are the
    task's), the gate rule only where `--gate` names one, and the switches the arm's plan sets. Everything else is
    the defaults chosen for the task's learner (create_run_with_defaults)."""
    plan = ArmPlan(**arm.plan)
    given = {"epochs": options.epochs, "batch_size": options.batch_size, "group_size": options.group_size,
             "seed": options.seed, "validation_size": options.validation_size, "gate_k": options.gate_k,
             "gate": options.gate}
    if plan.direct:
        given["direct_count"] = options.direct_count
    return {**{name: value for name, value in given.items() if value is not None}, **plan.given()}


def stored_switches(settings: dict) -> dict:
    """A run's learning switches from its stored settings (the selection as `all` or `top_k N`)."""
    from core.domain.selection import Selection

    selection = Selection.from_dict(settings.get("selection"))
    switches = {name: settings.get(name) for name in SWITCHES if name != "selection"}
    return switches | {"selection": f"top_k {selection.k}" if selection.chooses else str(selection.mode)}


def switch_changes(switches: dict, default: dict) -> list[str]:
    """The switches that differ from the default path's, as the table says them ("lessons on", "selection all")."""
    words = {True: "on", False: "off"}
    return [f"{SWITCHES[name]} {words.get(value, value)}" for name, value in switches.items()
            if name in default and value != default[name]]


def default_path(engine, options: argparse.Namespace) -> tuple[dict, list[str]]:
    """The default path's switches and the lines of the defaults chosen for it, computed (nothing stored) as
    create_run_with_defaults chooses them for a new library given only the sizes: what each arm is compared
    with, whether or not the `default` arm runs."""
    from sqlmodel import Session

    from core.records.runs.defaults import chosen_defaults
    from core.records.tasks.lookup import get_task

    given = arm_given(Arm(DEFAULT_PATH, plan=asdict(ARMS[DEFAULT_PATH])), options)
    with Session(engine) as session:
        settings, choices = chosen_defaults(session, get_task(session, TASK), given, library_name=DEFAULT_PATH)
    return stored_switches(settings.model_dump()), [choice.line() for choice in choices]


async def train(engine, arm: Arm, options: argparse.Namespace, gateway) -> None:
    """The arm's run in a library of its own, from the empty library, with the gate: created as `train` creates
    a run, the defaults for its learner chosen where the arm sets nothing (the library's selection with them)."""
    from sqlmodel import Session

    from core.domain.library import EXAMPLE, kind_of
    from core.grpo.training import create_run_with_defaults, execute_run_async, run_counters
    from core.records.review.gate_verdict import GateVerdict
    from core.records.runs.outcome import refused_for_space
    from storage import queries
    from storage.statuses import RunKind
    from storage.tables import LibraryVersion, Run

    kind = RunKind.DIRECT if arm.plan["direct"] else RunKind.TRAIN
    arm.run_id, choices = create_run_with_defaults(engine, TASK, arm_given(arm, options), library_name=arm.library,
                                                   kind=kind)
    arm.choices = [choice.line() for choice in choices]
    with Session(engine) as session:
        stored = session.get(Run, arm.run_id).settings
    arm.gate, arm.switches = stored.get("gate"), stored_switches(stored)
    progress(f"{arm.name}: run {arm.run_id} started")
    started = time.perf_counter()
    run = await execute_run_async(engine, arm.run_id, gateway=gateway)
    arm.train_s = time.perf_counter() - started
    with Session(engine) as session:
        run = session.get(Run, arm.run_id)
        arm.run_status, arm.run_error, arm.version_id = run.status, run.error, run.current_version_id
        version = session.get(LibraryVersion, run.current_version_id)
        entries = version.experiences if version else []
        arm.experiences, arm.examples = len(entries), sum(1 for e in entries if kind_of(e) == EXAMPLE)
        counters = run_counters(session, run)
        arm.operations_proposed, arm.operations_applied = counters["operations"], counters["operations_applied"]
        arm.operations_invalid = counters["operations_invalid"]
        arm.train_calls = queries.call_totals(session, run_id=arm.run_id)
        steps = queries.steps(session, arm.run_id)
        arm.steps = len(steps)
        for step in steps:
            for key in ("ok", "skipped", "failed", "from_reference"):
                arm.groups[key] = arm.groups.get(key, 0) + (step.stats or {}).get(key, 0)
            arm.refused_for_space += refused_for_space(step)
            if gate := GateVerdict.of(step):
                arm.gate_decisions[gate.decision] = arm.gate_decisions.get(gate.decision, 0) + 1
                arm.gate_lines.append(f"epoch {step.epoch + 1} batch {step.batch_index + 1}: {gate.line}")
    progress(f"{arm.name}: run {run.status} in {arm.train_s:.0f} s, {arm.experiences} entries")


def compare(engine, empty: Arm, arm: Arm, seed: int) -> None:
    from core.records.evaluation.comparison import compare_evaluations
    from storage.statuses import JobStatus

    arm.reference = empty.name
    if JobStatus.COMPLETED == empty.evaluation_status == arm.evaluation_status:
        arm.comparison = compare_evaluations(engine, empty.evaluation_id, arm.evaluation_id, seed=seed).stats.as_dict()


def read_replies(path: Path) -> dict[str, str]:
    """The hand-written replies, by message (its words joined by single spaces)."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {" ".join(row["query"].split()): row["reply"] for row in rows}


def hand_written(experiences: list[dict], replies: dict[str, str]) -> list[dict]:
    """The library with each worked example's answer replaced by the reply a person wrote for its message (ids,
    order and lessons unchanged); stops where a message has no written reply."""
    from core.domain.library import EXAMPLE, kind_of
    from core.domain.reference_answers import example_text

    written, missing = [], []
    for entry in experiences:
        if kind_of(entry) == EXAMPLE:
            problem = entry["text"].removeprefix("Problem: ")
            query = " ".join(re.split(r" (?:Steps|Answer): ", problem, maxsplit=1)[0].split())
            if query in replies:
                entry = {**entry, "text": example_text(query, replies[query])}
            else:
                missing.append(query[:60])
        written.append(entry)
    if missing:
        raise SystemExit(f"--replies has no reply for: {'; '.join(missing)}")
    return written


async def by_hand(base: Path, default: Arm, empty: Arm, options: argparse.Namespace, gateway_for) -> Arm:
    """BY_HAND: in a copy of the default path's database, its library's next version holds the same entries with
    every example's answer written by a person (the same library, so the same entry selection), evaluated like
    every arm and compared with the empty library and with the default path, query by query."""
    from core.domain.library import examples
    from core.records.evaluation.comparison import compare_evaluations
    from core.records.library.versions import create_version
    from storage.db import make_engine, session_scope
    from storage.statuses import JobStatus
    from storage.tables import Library, LibraryVersion

    arm = Arm(BY_HAND, mode=default.mode, library=default.library, plan=default.plan, by_hand=True,
              database=str(arm_database(base, "by-hand")), switches=default.switches, changes=["examples by hand"])
    copy_database(Path(default.database), Path(arm.database))
    engine = make_engine(f"sqlite:///{arm.database}", migrate=False)
    with session_scope(engine) as session:
        default_version = session.get(LibraryVersion, default.version_id)
        experiences = hand_written(default_version.experiences, read_replies(Path(options.replies)))
        version = create_version(session, session.get(Library, default_version.library_id), experiences,
                                 parent_id=default.version_id, source="import", created_by="cli",
                                 note="the default path's examples with their answers written by hand")
        arm.version_id = version.id
    arm.experiences, arm.examples = len(experiences), len(examples(experiences))
    progress(f"{arm.name}: version {arm.version_id}, {arm.examples} examples written by hand")
    await evaluate(engine, arm, options, gateway_for(engine) if gateway_for else None)
    compare(engine, empty, arm, options.seed)
    if JobStatus.COMPLETED == default.evaluation_status == arm.evaluation_status:
        arm.against_default_path = compare_evaluations(engine, default.evaluation_id, arm.evaluation_id,
                                                       seed=options.seed).stats.as_dict()
    engine.dispose()
    return arm


def person_lessons(dataset: str) -> Path:
    return PERSON_LESSONS / f"{dataset}.txt"


async def person(base: Path, empty: Arm, selection: str, options: argparse.Namespace, gateway_for) -> Arm:
    """PERSON: in a copy of the empty library's database, the lessons a person who knows the task wrote from its
    facts (person_lessons), imported into a library of their own as the Library page or `library import` does,
    under the default path's selection (`top_k 2` or `all`), evaluated like every arm and compared with the
    empty library: the ceiling the learned library's gain is read against."""
    from core.domain.library import examples
    from core.records.library.selection import set_selection
    from core.records.library.versions import import_library
    from storage.db import make_engine

    path = person_lessons(options.dataset)
    arm = Arm(PERSON, mode=empty.mode, library="person", person=True, database=str(arm_database(base, "person")),
              changes=[f"lessons by a person ({path.relative_to(ROOT)}), no run"])
    copy_database(Path(empty.database), Path(arm.database))
    engine = make_engine(f"sqlite:///{arm.database}", migrate=False)
    version = import_library(engine, TASK, path.read_text(encoding="utf-8"), path.name, library_name="person")
    mode, _, k = selection.partition(" ")
    set_selection(engine, TASK, "person", mode, int(k) if k else None, "cli")
    arm.version_id, arm.experiences = version.id, len(version.experiences)
    arm.examples = len(examples(version.experiences))
    arm.switches = {"selection": selection}
    progress(f"{arm.name}: version {arm.version_id}, {arm.experiences} lessons from {path.name}, selection {selection}")
    await evaluate(engine, arm, options, gateway_for(engine) if gateway_for else None)
    compare(engine, empty, arm, options.seed)
    engine.dispose()
    return arm


def arm_database(base: Path, library: str) -> Path:
    """Where an arm's copy of the database lives: `bench.db` -> `bench.lessons.db`."""
    safe = library.replace("+", "_")
    return base.with_name(f"{base.stem}.{safe}{base.suffix or '.db'}")


def copy_database(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite file (its WAL included), through SQLite's backup API."""
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


def share_calls(target: Path, earlier: list[Path]) -> int:
    """Put the earlier arms' paid calls into this arm's ledger as response cache only (no run, no evaluation), so
    a request an earlier arm already made (the same messages, model, parameters and seed: its first step's
    answers, their summaries, the gate's measure of the empty library) is answered as it was, not paid again.
    Only the rows the gateway answers from (`reusable_calls`) come in, each cache key once. Returns how many
    rows came in. The arm's own figures still count only its run's and evaluation's calls, its
    cache hits in the `cached` column."""
    from sqlmodel import Session, select

    from core.models.gateway import reusable_calls
    from storage.db import make_engine
    from storage.tables import LLMCall

    added = 0
    engine = make_engine(f"sqlite:///{target}", migrate=False)
    with Session(engine) as session:
        known = set(session.exec(select(LLMCall.cache_key)).all())
        for source in earlier:
            source_engine = make_engine(f"sqlite:///{source}", migrate=False)
            with Session(source_engine) as earlier_session:
                rows = earlier_session.exec(select(LLMCall).where(*reusable_calls())).all()
            source_engine.dispose()
            for row in rows:
                if row.cache_key not in known:
                    known.add(row.cache_key)
                    session.add(LLMCall(**row.model_dump(exclude={"id", "run_id", "evaluation_id"})))
                    added += 1
        session.commit()
    engine.dispose()
    return added


def empty_name(mode: str) -> str:
    return f"empty ({mode})"


def plan_arms(base: Path, options: argparse.Namespace) -> list[Arm]:
    """The empty library in each mode, then the trained arms; each but the first in its own database file. Each
    trained arm's library is named as the arm (the default path's is the task's `default` library, as `train`
    without --library uses)."""
    arms = [Arm(empty_name(mode), mode=mode, database=str(base if i == 0 else arm_database(base, f"empty_{mode}")))
            for i, mode in enumerate(options.modes)]
    for name in options.arms:
        arms.append(Arm(name, mode=options.train_mode, library=name, plan=asdict(ARMS[name]),
                        database=str(arm_database(base, name))))
    return arms


async def run_arms(base: Path, options: argparse.Namespace, gateway_for: Callable | None = None,
                   selection: str = "all") -> list[Arm]:
    """The empty libraries first (the references), then every trained arm.

    Each empty library after the first is evaluated in a copy of the first's database (its agent mode set);
    each trained arm runs in a copy of the empty library's database of its mode, so it starts from the same
    task, queries and reference evaluation, and no other arm's run or library. With `share_cache` the earlier
    trained arms' paid calls are added to its ledger as cache only (share_calls).
    """
    from storage.db import make_engine

    arms = plan_arms(base, options)
    empties = {arm.mode: arm for arm in arms if arm.library is None}
    for index, arm in enumerate(arms):
        if arm.database != str(base):
            source = base if arm.library is None else Path(empties[arm.mode].database)
            copy_database(source, Path(arm.database))
            if options.share_cache and arm.library is not None:
                earlier = [Path(a.database) for a in arms[:index] if a.library is not None]
                progress(f"{arm.name}: {share_calls(Path(arm.database), earlier)} calls of earlier arms shared")
        engine = make_engine(f"sqlite:///{arm.database}", migrate=False)
        set_mode(engine, arm.mode)
        gateway = gateway_for(engine) if gateway_for else None
        if arm.library is not None:
            await train(engine, arm, options, gateway)
        await evaluate(engine, arm, options, gateway)
        if arm.library is not None:
            compare(engine, empties[arm.mode], arm, options.seed)
        engine.dispose()
    default = next((arm for arm in arms if arm.name == DEFAULT_PATH), None)
    if options.by_hand and default is not None and default.version_id is not None:
        arms.append(await by_hand(base, default, empties[default.mode], options, gateway_for))
    if options.person:
        arms.append(await person(base, empties[options.train_mode], selection, options, gateway_for))
    direct, python = empties.get("direct"), empties.get("python")
    if direct and python:  # the python mode's empty library against the direct one's, in python's database
        engine = make_engine(f"sqlite:///{python.database}", migrate=False)
        compare(engine, direct, python, options.seed)
        engine.dispose()
    return arms


def load_models(options: argparse.Namespace) -> None:
    """Load the embedded model(s) before any timing, so the first phase does not pay for it: where the calls go,
    the machine's model server (started if none runs: the benchmark is a command-line job, so on every core, and
    stopped at its end), or this process with TFGRPO_LOCAL_IN_PROCESS."""
    from core.models import gateway, model_server  # noqa: F401  (importing the gateway registers local/...)
    from core.models.local_model import LOCAL_PREFIX, get_server
    from core.settings import get_settings

    for model in dict.fromkeys((options.model, options.learner_model)):
        if model.startswith(LOCAL_PREFIX):
            started = time.perf_counter()
            name = model.removeprefix(LOCAL_PREFIX)
            if get_settings().local_in_process:
                get_server(name)
                where = "in this process"
            else:
                where = model_server.address(name)
                record = model_server.read_record(name)
                where += f", {record.threads if record else '?'} threads"
            progress(f"{model} loaded in {time.perf_counter() - started:.1f} s ({where})")


# ---------------------------------------------------------------- report


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def entries(arm: Arm) -> str:
    return f"{arm.experiences}" + (f" ({arm.examples} ex.)" if arm.examples else "")


def table(arms: list[Arm], k: int) -> str:
    header = ["", "mode", "entries", f"Mean@{k}", f"Pass@{k}", "Δ vs empty [95% CI]", "p (sign test)", "detectable",
              "calls", "cached", "tokens", "wall s", "against the default path"]
    lines = [header]
    for arm in arms:
        c = arm.comparison
        if arm.reference is None:
            delta, p, detectable = "(reference)", "-", "-"
        elif c is None:
            delta, p, detectable = f"- (evaluation {arm.evaluation_status})", "-", "-"
        else:
            delta = f"{c['delta']:+.3f} [{_signed(c['ci_low'])}, {_signed(c['ci_high'])}]"
            p, detectable = f"{c['p_value']:.3g}", _num(c["detectable"])
        failed = arm.evaluation_status != "completed"
        lines.append([arm.name, arm.mode, entries(arm), "failed" if failed else _num(arm.mean_at_k),
                      "failed" if failed else _num(arm.pass_at_k), delta, p, detectable, f"{arm.calls:,}",
                      f"{arm.cached:,}", f"{arm.tokens:,}", f"{arm.wall_s:.0f}", against_default(arm)])
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    out = []
    for number, row in enumerate(lines):
        numbers = zip(row[1:-1], widths[1:-1], strict=True)
        cells = [row[0].ljust(widths[0]), *(cell.rjust(width) for cell, width in numbers), row[-1].ljust(widths[-1])]
        out.append("  ".join(cells).rstrip())
        if number == 0:
            out.append("  ".join("-" * width for width in widths))
    return "\n".join(out)


def against_default(arm: Arm) -> str:
    """The table's last cell: "-" for an empty library, "the default path" for a run with the default path's
    switches, else the switches its run changes ("lessons on")."""
    if arm.library is None:
        return "-"
    return ", ".join(arm.changes) or "the default path"


def default_lines(arms: list[Arm], options: argparse.Namespace, computed: list[str]) -> list[str]:
    """What the default path chose, each with its reason (Choice.line, as `train` prints them): the `default`
    arm's own choices where it ran, else as computed for the task."""
    ran = next((arm for arm in arms if arm.name == DEFAULT_PATH and arm.run_id is not None), None)
    where = "its run's" if ran else "not run here; as chosen for this task"
    return [f"the default path ({where}): a run created as `python -m core train` creates it with only the sizes "
            f"given chose, for the learner {options.learner_model}:",
            *(f"    {line}" for line in (ran.choices if ran else computed))]


def _signed(value: float | None) -> str:
    return "-inf" if value is None else f"{value:+.3f}"


def arm_lines(arm: Arm) -> list[str]:
    """What the run did: status, steps, groups, operations, gate decisions (one indented line per gated step)."""
    if arm.library is None:
        return []
    if arm.by_hand:
        c = arm.against_default_path
        versus = ("not compared (an evaluation did not complete)" if c is None else
                  f"{c['delta']:+.3f} [{_signed(c['ci_low'])}, {_signed(c['ci_high'])}], {c['wins']} wins "
                  f"{c['losses']} losses, p {c['p_value']:.3g}")
        return [f"{arm.name}: version {arm.version_id}, the default path's {arm.examples} examples with the answers "
                f"written by a person ({Path(arm.database).name}); test evaluation {arm.eval_s:.0f} s; against the "
                f"default path, paired (by hand minus default): {versus}"]
    if arm.person:
        return [f"{arm.name}: version {arm.version_id}, {arm.experiences} {arm.changes[0]} "
                f"({Path(arm.database).name}), selection {arm.switches.get('selection')}; "
                f"test evaluation {arm.eval_s:.0f} s"]
    status = arm.run_status + (f" ({arm.run_error})" if arm.run_error else "")
    head = (f"{arm.name}: run {arm.run_id} {status}; version {arm.version_id}, {entries(arm)} entries; "
            f"training {arm.train_s:.0f} s, test evaluation {arm.eval_s:.0f} s")
    if arm.plan["direct"]:
        return [head + "; no rollouts (experiences asked for directly)"]
    g = arm.groups
    head += (f"; {arm.steps} steps; groups: {g.get('ok', 0)} to the learner ({g.get('from_reference', 0)} of them "
             f"all failed, with the reference), {g.get('skipped', 0)} skipped, {g.get('failed', 0)} failed; "
             f"operations applied {arm.operations_applied} of {arm.operations_proposed} ({arm.operations_invalid} "
             f"refused before the gate: invalid{', or flagged' if arm.switches.get('hold_flagged') else ''})")
    if arm.refused_for_space:
        head += f"; {arm.refused_for_space} worked examples refused for space (each example the only one of its need)"
    decisions = ", ".join(f"{decision} {arm.gate_decisions.get(decision, 0)}"
                          for decision in ("passed", "failed", "skipped", "undecided"))
    return [head + f"; gate {arm.gate}: {decisions}", *(f"    {line}" for line in arm.gate_lines)]


def reply_lines(arms: list[Arm]) -> list[str]:
    """Per arm: the test replies that copy the library's block, and for a library the retrieval hit rate, overall
    and per need; then the learned libraries' gain as a share of the person's lessons' gain."""
    lines = ["", "replies that copy the library's block ([E1] or Problem:), and the retrieval hit rate (rollouts "
             "shown an entry stating each need of their message):"]
    for arm in arms:
        line = f"  {arm.name}: copies {arm.copied_format} of {arm.replies} replies"
        if arm.replies:
            line += f" ({arm.copied_format / arm.replies:.1%})"
        if arm.shown_total:
            per_need = "; ".join(f"{need} {shown}/{total}" for need, (shown, total) in sorted(arm.shown_per_need.items()))
            line += (f"; shown every need {arm.shown_needs} of {arm.shown_total} ({arm.shown_needs / arm.shown_total:.1%});"
                     f" per need: {per_need}")
        lines.append(line)
    ceiling = next((a for a in arms if a.person and a.comparison), None)
    if ceiling is not None and ceiling.comparison["delta"] > 0:
        for arm in arms:
            if arm.library is not None and not arm.person and arm.comparison:
                lines.append(f"  {arm.name}: gain {arm.comparison['delta']:+.3f} = "
                             f"{arm.comparison['delta'] / ceiling.comparison['delta']:.0%} of {PERSON}' "
                             f"{ceiling.comparison['delta']:+.3f} (target: at least 80%)")
    elif ceiling is not None:
        lines.append(f"  {PERSON}: gain {ceiling.comparison['delta']:+.3f}, no ceiling to read a share against")
    return lines


def goal_line(arms: list[Arm]) -> str:
    """Whether a gated library beat the empty library of its mode by GOAL with p < 0.05 (bench/README.md)."""
    met = [a.name for a in arms if a.library and a.comparison and a.comparison["delta"] >= GOAL
           and a.comparison["p_value"] < 0.05 and (a.comparison["ci_low"] or -1) > 0]
    if met:
        return f"goal (Δ ≥ +{GOAL:.2f}, p < 0.05, interval above 0): met by {', '.join(met)}"
    return f"goal (Δ ≥ +{GOAL:.2f}, p < 0.05, interval above 0): not met by any arm"


def policy_lines(arms: list[Arm], k: int) -> list[str]:
    """Mean@k per policy (need) and arm, and what each library covers of the train references (facts tasks)."""
    with_figures = [arm for arm in arms if arm.per_policy]
    if not with_figures:
        return []
    needs = sorted({need for arm in with_figures for need in arm.per_policy})
    lines = ["", f"Mean@{k} per policy (test messages whose reference holds it):", "",
             "| policy | messages | " + " | ".join(arm.name for arm in with_figures) + " |",
             "| --- | --- | " + " | ".join("---" for _ in with_figures) + " |"]
    for need in needs:
        scores = [arm.per_policy.get(need) or [] for arm in with_figures]
        count = max(len(s) for s in scores)
        lines.append(f"| {need} | {count} | " + " | ".join(f"{sum(s) / len(s):.3f}" if s else "-" for s in scores)
                     + " |")
    lines.append("")
    for arm in with_figures:
        if arm.coverage:
            missing = (f"; needs of the train references no example states: {', '.join(arm.uncovered_needs)}"
                       if arm.uncovered_needs else "; every need of the train references has an example")
            lines.append(f"{arm.name}: {arm.coverage}{missing}")
    return lines


def report(arms: list[Arm], options: argparse.Namespace, command: str, notes: list[str],
           defaults: list[str]) -> str:
    errors = [f"{a.name}: {a.rollout_errors} test rollouts failed (left out of the figures)"
              for a in arms if a.rollout_errors]
    failed = [f"{a.name}: evaluation {a.evaluation_status}: {a.evaluation_error}" for a in arms
              if a.evaluation_status != "completed"]
    n = arms[0].n
    lines = [f"{options.dataset}: {n} test queries x k={options.k}; policy {options.model}, learner "
             f"{options.learner_model}; Δ = Mean@{options.k} minus the empty library's of the same mode, paired per "
             "query (bootstrap 95% interval, sign test); detectable: the smallest Δ these queries detect (80% power)",
             "", table(arms, options.k), "", goal_line(arms), *reply_lines(arms), *policy_lines(arms, options.k),
             *default_lines(arms, options, defaults),
             *(line for arm in arms for line in arm_lines(arm)), *errors, *failed,
             "calls: model calls made (cached: answered from the ledger, no cost; "
             + ("earlier arms' calls shared" if options.share_cache else "each arm's own calls only")
             + "); tokens: in + out; wall s: training + test evaluation",
             *notes, *([f"databases: {', '.join(str(a.database) for a in arms)}"] if options.db else []),
             f"command: {command}"]
    return "\n".join(lines)


def to_json(arms: list[Arm], options: argparse.Namespace, command: str, splits: dict, notes: list[str],
            defaults: tuple[dict, list[str]]) -> dict:
    rows = []
    for arm in arms:
        row = asdict(arm)
        row.update(calls=arm.calls, cached=arm.cached, tokens=arm.tokens, wall_s=arm.wall_s)
        rows.append(row)
    return {"command": command, "options": vars(options), "queries": splits, "data": notes, "k": options.k,
            "goal": goal_line(arms), "default_path": {"switches": defaults[0], "choices": defaults[1]}, "rows": rows}


# ---------------------------------------------------------------- command line


def _names(text: str, allowed, what: str, parser: argparse.ArgumentParser) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in allowed]
    if unknown or len(set(names)) != len(names):
        parser.error(f"--{what}: {', '.join(unknown) or 'a name given twice'}; choose from {', '.join(allowed)}")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from core.settings import DEFAULT_MODEL
    from storage.statuses import GateRule

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=list(DEFAULTS), default="arithmetic", help="default: %(default)s")
    parser.add_argument("--train", default=str(DATA / "svamp.jsonl"),
                        help="arithmetic: train file, JSONL (default: %(default)s)")
    parser.add_argument("--test", default=str(DATA / "mawps_multiarith.jsonl"),
                        help="arithmetic: test file, JSONL (default: %(default)s)")
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                        help=f"trained arms, comma-separated, from {', '.join(ARMS)} (default: %(default)s)")
    parser.add_argument("--modes", default=None, help="agent modes of the empty libraries (default: direct,python "
                        "for arithmetic, direct for policy and fernhill)")
    parser.add_argument("--train-mode", choices=MODES, default="direct",
                        help="agent mode of the trained arms (default: %(default)s)")
    parser.add_argument("--gate", choices=[rule.value for rule in GateRule], default=None,
                        help="the trained arms' gate rule (default: a run's default, no_worse)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="policy model (default: %(default)s)")
    parser.add_argument("--learner-model", default=None, help="learner model (default: the policy model)")
    for name, help_text in (("epochs", ""), ("batch-size", ""), ("group-size", "G; "),
                            ("k", "samples per test query; "),
                            ("train-limit", "first N train rows to train on (0 = all but the validation rows); "),
                            ("test-limit", "first N test rows (0 = all); "),
                            ("validation-size", "train rows after the training rows that the gate measures on; "),
                            ("gate-k", "samples per validation query for the gate; ")):
        parser.add_argument(f"--{name}", type=int, default=None, help=f"{help_text}default: per data set, see "
                            "bench/README.md")
    parser.add_argument("--direct-count", type=int, default=8,
                        help="experiences the `direct` arm asks for (default: %(default)s)")
    parser.add_argument("--share-cache", action=argparse.BooleanOptionalAction, default=True,
                        help="answer a request an earlier arm already made from its reply, as the studio's cache "
                             "would (--no-share-cache: every arm pays for all its calls, its wall time its own "
                             "alone; default: share)")
    parser.add_argument("--by-hand", action=argparse.BooleanOptionalAction, default=None,
                        help=f"add the row `{BY_HAND}` where the default path ran (default: on for policy)")
    parser.add_argument("--replies", default=str(REPLIES),
                        help="hand-written replies, JSONL with query and reply (default: %(default)s)")
    parser.add_argument("--person", action=argparse.BooleanOptionalAction, default=None,
                        help=f"add the row `{PERSON}`: bench/person_lessons/<dataset>.txt imported and evaluated "
                             "under the default path's selection (default: on where that file exists)")
    parser.add_argument("--seed", type=int, default=0, help="training seed (default: %(default)s)")
    parser.add_argument("--db", default=None, help="new SQLite file to keep (default: a temporary one)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    options = parser.parse_args(argv)
    for name, value in DEFAULTS[options.dataset].items():
        if getattr(options, name) is None:
            setattr(options, name, value)
    options.arms = _names(options.arms, ARMS, "arms", parser)
    options.modes = _names(options.modes, MODES, "modes", parser)
    if options.train_mode not in options.modes:
        options.modes.append(options.train_mode)
    options.learner_model = options.learner_model or options.model
    if options.by_hand is None:
        options.by_hand = options.dataset == "policy"
    if options.person is None:
        options.person = person_lessons(options.dataset).exists()
    elif options.person and not person_lessons(options.dataset).exists():
        parser.error(f"--person: {person_lessons(options.dataset)} does not exist")
    options.train_limit = options.train_limit or None
    options.test_limit = options.test_limit or None
    for name in ("epochs", "batch_size", "group_size", "k", "gate_k", "direct_count"):
        if getattr(options, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if options.validation_size < 0:
        parser.error("--validation-size must be 0 or more")
    if options.db:
        paths = [Path(options.db), *(Path(arm.database) for arm in plan_arms(Path(options.db), options))]
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

    from core.models.model_server import command_line_job, job_threads
    from storage.db import make_engine

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout is disabled" notice, once per thread
    validation = None
    if options.dataset == "policy":
        train, test, notes = policy_records()
    elif options.dataset in FROZEN:
        train, validation, test, notes = frozen_records(options.dataset)
    else:
        (train, train_note), (test, test_note) = read_records(Path(options.train)), read_records(Path(options.test))
        notes = [train_note, test_note]
    with tempfile.TemporaryDirectory() as folder:
        base = Path(options.db) if options.db else Path(folder) / "learning_effect.db"
        engine = make_engine(f"sqlite:///{base}")
        splits = create_task(engine, options, train, test, validation)
        defaults = default_path(engine, options)
        engine.dispose()
        progress(f"cpu_count {os.cpu_count()}  threads of a server it starts {job_threads()}  load {os.getloadavg()[0]:.2f}  "
                 f"database {base if options.db else 'temporary (--db PATH keeps it)'}  queries {splits}")
        with command_line_job() if gateway_for is None else nullcontext():
            if gateway_for is None:
                load_models(options)
            arms = asyncio.run(run_arms(base, options, gateway_for, defaults[0]["selection"]))
    for arm in arms:
        if arm.library is not None and not arm.by_hand and not arm.person:
            arm.changes = (["a direct run: experiences asked for, no rollouts"] if arm.plan["direct"]
                           else switch_changes(arm.switches, defaults[0]))
    result = to_json(arms, options, command, splits, notes, defaults)
    print(report(arms, options, command,
                 [f"data: {note}" for note in notes] + [f"queries per split: {splits}",
                                                         f"load average at the end: {os.getloadavg()[0]:.2f}"],
                 defaults[1]))
    if options.json:
        Path(options.json).write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()

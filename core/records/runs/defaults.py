"""The defaults a new run gets, chosen by what this studio measured, each with its reason (issue 36; DESIGN §8,
"The default path is the measured path").

RunSettings' own field defaults are the paper's: lessons from each group's semantic advantage, no worked
examples, a group where every attempt failed skipped. That is what a capable learner keeps. For the embedded
learner (a `local/...` model, which this studio measured writing unusable lessons) the learning benchmark
(bench/README.md, "Learning effect") found another path: worked examples made from the reference where every
attempt failed, each query shown its few most similar entries, and no lessons. `chosen_defaults` is the one
place that choice is made: the Train page fills its form with it (the Quick trial too) and says why, and the
CLI's `train` calls it through core.grpo.training.create_run_with_defaults and prints the same reasons.

A value given explicitly always wins (a RunSettings' `model_fields_set`, or the keys of a dict), and the
defaults never break the settings' own rules: worked examples need ground truth and a reward computed from the
answer, and a run with lessons off must learn examples, so where examples cannot be on the paper's defaults
stay, and the reason says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlmodel import Session

from core.domain.library import MAX_EXAMPLES, MAX_EXAMPLES_TOP_K, examples
from core.domain.rewards import METHODS
from core.domain.selection import DEFAULT_K, Selection, SelectionMode
from core.models.model_choice import LOCAL_PREFIX
from core.records.library.selection import selection_chosen, selection_of
from core.records.runs.settings import RunSettings
from core.records.tasks.scenarios import is_conversation
from core.settings import get_settings
from storage import queries
from storage.tables import Task

SELECTION = "selection"  # the library's entry selection, chosen with the run (not a RunSettings field of its own)
LABELS = {"examples": "worked examples", "lessons": "lessons",
          "reference_when_all_fail": "learning from the reference where every attempt failed",
          SELECTION: "entries per query", "max_examples": "worked examples kept",
          "learner_replies": "example replies by the learner"}

# The figures behind each choice, as bench/README.md ("Learning effect": the default path on both knowledge tasks, the
# lessons earlier) and core.records.models.learner_advice report them, all on the embedded model with held-out queries.
EXAMPLES_FIGURE = ("+0.406 to +0.562 over five seeds (each p < 0.01) on the shop-policies demo's 16 held-out "
                   "messages and +0.406 to +0.656 over five (each p ≤ 0.002) on Fernhill, a second task frozen "
                   "before tuning, no message worse, each trained on 16 messages with train's defaults in 2 to 4 "
                   "minutes on 2 cores")
EXAMPLES_ON = ("On: worked examples made from the references of the messages the agent failed, each query shown "
               f"its {DEFAULT_K} most similar, lifted the embedded agent by {EXAMPLES_FIGURE}.")
LESSONS_OFF = ("Off: the embedded learner's lessons retell problems instead of teaching, and moved the agent by "
               "+0.000 on the shop-policies demo, -0.125 [-0.375, +0.083] on arithmetic and +0.017 [-0.050, +0.083] "
               "on 60 GSM8K problems (no detectable difference).")
REFERENCE_ON = ("On: where the agent lacks the knowledge every attempt fails (the empty library scores 0.000 on the "
                "shop-policies demo), and the paper's filter would skip each such group; its reference is what the "
                "worked examples are made of.")
SELECTION_TOP_K = ("Chosen for a library that will hold worked examples and whose selection nobody set: the retrieval "
                   f"the worked examples were measured with ({EXAMPLES_FIGURE}), where the whole library would show "
                   "every query every example.")
LESSONS_PAPER = ("On, as in the paper: lessons from each group's semantic advantage; this studio measured no problem "
                 "with {learner}'s lessons (it did with the embedded model's).")
EXAMPLES_PAPER = (f"Off, as in the paper; on the embedded model they gave {EXAMPLES_FIGURE}, so turn them on where "
                  "the agent lacks knowledge that only the references hold.")
REFERENCE_PAPER = "Off, as in the paper: a group where every attempt failed is skipped."
REPLIES_TEMPLATE = ("Off: a sentence per fact of the reference, without asking the learner. The embedded learner's "
                    "own replies were used 0 times for 51 examples made from references in five runs of the default "
                    "path (each repeated the message, invented a figure or was cut off, and the sentence per fact "
                    "was used instead), and asking cost 81 to 228 s a run. Where some attempts were right, a task "
                    "whose reward reads stated facts gets the reference's sentences too: none of the learner's 17 "
                    "compressions of a right attempt in 28 runs read as a clean reply (5 landed with an invented "
                    "clause or a 'Steps: The agent's solution:' form, 3 were refused for an invented figure, 3 "
                    "rejected by the gate, 6 duplicated an example).")
REPLIES_LEARNER = ("On: the learner writes each example's reply, checked against the reference; a sentence per fact "
                   "where it fails.")
CAP_TOP_K = (f"Each query is shown only its {DEFAULT_K} nearest entries, so a larger library "
             "costs no prompt length, and the cap serves coverage (one example per need); retrieval got no worse up "
             "to 28 examples (bench/retrieval_cap.py, top_k 2: 11-14 of 16 held-out shop messages shown every fact "
             "of their reference from 8 to 28 examples, 9 at 6).")
CAP_ALL = ("The library shows every query all its entries, so each example lengthens every prompt; "
           "a small library, one example per need.")


@dataclass(frozen=True)
class Choice:
    """One default chosen for a run: the setting (a RunSettings field, or `selection`: the library's), its value
    and the reason, with the figure behind it, in one sentence."""

    field: str
    value: Any
    reason: str

    @property
    def label(self) -> str:
        """The setting as a person names it ("worked examples")."""
        return LABELS.get(self.field, self.field)

    def words(self) -> str:
        """The value as a person reads it: on, off, or the selection in words."""
        if self.field == SELECTION:
            return Selection.from_dict(self.value).describe()
        return ("on" if self.value else "off") if isinstance(self.value, bool) else str(self.value)

    def line(self) -> str:
        """The choice in one line, as the Train page and `train` print it."""
        return f"{self.label}: {self.words()}. {self.reason}"


def writes_unusable_lessons(model: str) -> bool:
    """Whether this studio measured `model`, as the learner, writing unusable lessons: the embedded models
    (core.records.models.learner_advice has the figures)."""
    return model.startswith(LOCAL_PREFIX)


def can_verify(task: Task) -> str | None:
    """Why this task's worked examples could not be verified (None when they can): the check scores the
    example's answer with the task's reward on the spot, which a judge's or a person's reward cannot do, and a
    conversation has no single final answer."""
    if is_conversation(task):
        return "a conversation task has no final answer to check a worked example against"
    method = METHODS.get(task.reward_method)
    if method is None or not method.scored_by_function:
        return (f"the task's reward ({task.reward_method}) is not computed from the answer, so a worked example "
                "could not be checked before it is proposed")
    return None


def explicit_values(given: RunSettings | Mapping[str, Any]) -> dict[str, Any]:
    """The values a person set: a RunSettings' fields set at construction, or a dict's entries that are not None
    (the CLI leaves an option it was not given as None)."""
    if isinstance(given, RunSettings):
        return {name: getattr(given, name) for name in given.model_fields_set}
    return {name: value for name, value in given.items() if value is not None}


def chosen_defaults(session: Session, task: Task, given: RunSettings | Mapping[str, Any], *,
                    library_name: str = "default") -> tuple[RunSettings, list[Choice]]:
    """The settings of a new run of `task`: what `given` sets explicitly, and for the rest of `examples`,
    `lessons`, `reference_when_all_fail` and the library's entry selection the defaults for its learner (as
    create_run resolves it), each with its reason. The selection is chosen only for a library that will hold
    worked examples and whose selection nobody chose; it comes back in `settings.selection`, which create_run
    stores on the library. Raises InvalidInput, as RunSettings.build does, when the given values break a rule."""
    explicit = explicit_values(given)
    learner = explicit.get("learner_model") or task.learner_model or get_settings().model
    choices = _run_choices(task, explicit, learner)
    settings = RunSettings.build(**{**{choice.field: choice.value for choice in choices}, **explicit})
    selection = None if SELECTION in explicit else _selection_choice(session, task, library_name, settings)
    if selection is not None:
        settings.selection = selection.value
        choices.append(selection)
    if settings.examples and "max_examples" not in explicit:
        cap = _cap_choice(session, task, library_name, settings)
        settings.max_examples = cap.value
        choices.append(cap)
    return settings, choices


def _cap_choice(session: Session, task: Task, library_name: str, settings: RunSettings) -> Choice:
    """The most worked examples the run's library keeps, following its selection (the one chosen with the run,
    else the library's own): large under `top_k`, small where every entry is shown."""
    shown = (Selection.from_dict(settings.selection) if settings.selection
             else selection_of(queries.library_by_name(session, task.id, library_name)))
    return Choice("max_examples", MAX_EXAMPLES_TOP_K if shown.chooses else MAX_EXAMPLES,
                  CAP_TOP_K if shown.chooses else CAP_ALL)


def _run_choices(task: Task, explicit: dict[str, Any], learner: str) -> list[Choice]:
    """The defaults of the learning switches a person did not set, for this learner and task."""
    chosen: dict[str, Choice] = {}
    ground_truth = explicit.get("ground_truth", True)
    blocked = ("worked examples are checked against the reference answer, and ground truth is off"
               if not ground_truth else can_verify(task))
    measured = writes_unusable_lessons(learner)
    if "examples" not in explicit:
        if blocked:
            chosen["examples"] = Choice("examples", False, f"Off: {blocked}.")
        elif measured:
            chosen["examples"] = Choice("examples", True, EXAMPLES_ON)
        elif explicit.get("lessons") is False:
            chosen["examples"] = Choice("examples", True, "On: lessons are off, and such a run learns worked "
                                                          "examples only.")
        else:
            chosen["examples"] = Choice("examples", False, EXAMPLES_PAPER)
    examples_on = explicit["examples"] if "examples" in explicit else chosen["examples"].value
    if "lessons" not in explicit:
        if measured and examples_on:
            chosen["lessons"] = Choice("lessons", False, LESSONS_OFF)
        elif measured:
            chosen["lessons"] = Choice("lessons", True, "On, though the embedded learner's lessons rarely help: "
                                                        "worked examples are off, and a run must learn something.")
        else:
            chosen["lessons"] = Choice("lessons", True, LESSONS_PAPER.format(learner=learner))
    if "reference_when_all_fail" not in explicit:
        if not ground_truth:
            chosen["reference_when_all_fail"] = Choice("reference_when_all_fail", False,
                                                       "Off: it needs ground truth, which is off.")
        elif measured and examples_on:
            chosen["reference_when_all_fail"] = Choice("reference_when_all_fail", True, REFERENCE_ON)
        else:
            chosen["reference_when_all_fail"] = Choice("reference_when_all_fail", False, REFERENCE_PAPER)
    if "learner_replies" not in explicit and examples_on:
        chosen["learner_replies"] = Choice("learner_replies", not measured,
                                           REPLIES_TEMPLATE if measured else REPLIES_LEARNER)
    return list(chosen.values())


def _selection_choice(session: Session, task: Task, library_name: str, settings: RunSettings) -> Choice | None:
    """`top_k` (selection.DEFAULT_K, 2) for a library that will hold worked examples (this run proposes them, or its
    latest version has some) and whose selection nobody chose; None where the library keeps its own."""
    library = queries.library_by_name(session, task.id, library_name)
    if selection_chosen(session, library) or selection_of(library).chooses:
        return None
    latest = queries.latest_version(session, library.id) if library is not None else None
    if not (settings.examples or (latest is not None and examples(latest.experiences))):
        return None
    return Choice(SELECTION, Selection(SelectionMode.TOP_K, DEFAULT_K).as_dict(), SELECTION_TOP_K)

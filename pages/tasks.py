"""Tasks: edit the sidebar's task or create one, add data to it, try its reward, and export or import it.

Every change goes through `core.records.tasks.task_io` or `core.records.tasks.samples.add_dataset_file`, which check the admin role
again and write the audit log. Buttons act in callbacks, before the page (and the sidebar) is drawn
again, so a renamed, created or imported task can become the sidebar's task at once. Their outcome is
kept in session state and shown once beside the section that caused it: our message in an alert, any
text from the database or a file (task names, rows, core's error text) verbatim as code. Queries,
references, rubrics and instructions appear only in tables or as code (ui.display). Which column
feeds which field is core's rule (core.domain.datasets.resolve_columns), the same as the CLI's; so is the
hold-out of rows for test and validation (core.domain.datasets.hold_out). *Test the reward* scores a pasted
answer through core.domain.rewards.try_reward, the engine's own scoring call, and writes nothing.

A conversation task has a *Personas* tab: its personas with the splits their scenarios are in, an editor, a
file upload and a download (core.domain.personas, core.records.tasks.task_io.save_personas), and the held-out personas whose
scenarios go to test (core.records.tasks.scenarios.split_by_persona). A task's kind is fixed when it is created (a task file
or a built-in task): TaskSettings, which the form edits, does not hold it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pandas as pd
import streamlit as st
from sqlmodel import Session

from core.domain.agent_modes import AGENT_MODES
from core.domain.datasets import SPLITS, mapping_note, parse_dataset_file, resolve_columns, split_summary
from core.domain.personas import (
    TASK_KINDS,
    Persona,
    join_list_cell,
    parse_personas,
    persona_dicts,
    personas_from_objects,
    split_list_cell,
)
from core.domain.prompts import EXAMPLES_INTRO, LIBRARY_HEADER, MAX_WORDING_CHARS, LibraryWording
from core.domain.rewards import (
    MAX_LABELS_PER_ROLLOUT,
    METHODS,
    SCALE_NAMES,
    RewardResult,
    all_setting_keys,
    cannot_try,
    get_method,
    setting_defaults,
    setting_keys,
    try_reward,
)
from core.domain.rubric import DEFAULT_RUBRIC
from core.domain.sandbox import jail_status
from core.domain.scoring import MAX_TEXT_CHARS
from core.errors import InvalidInput
from core.records.models.options import ModelOption
from core.records.tasks.samples import add_dataset_file
from core.records.tasks.scenarios import is_conversation, persona_splits, split_by_persona
from core.records.tasks.task_io import (
    TaskSettings,
    columns_of,
    export_filename,
    export_task_json,
    form_setting,
    import_task,
    save_personas,
    save_task,
    task_personas,
)
from storage import queries
from storage.tables import Task
from ui.common import (
    TASK_KEY,
    Flash,
    Outcome,
    allowed,
    context,
    current_task,
    engine,
    keep_valid_choice,
    model_picker,
    models_note,
    offered_models,
    plain,
    reward_text,
    role_note,
    run_action,
    run_page,
    show_outcome,
    show_text,
)
from ui.display import show_long, table

FLASH = Flash("tasks_flash")
NEW_KEY = "tasks_new"
NEW_PREFIX = "task_new_"
CHECKED_KEY = "tasks_checked"
AUTO = "(automatic)"
PREVIEW_ROWS, SAMPLE_ROWS = 20, 50
MAPPING_TARGETS = {"query": "Query (required)", "id": "Id", "reference": "Reference answer",
                   "rubric": "Rubric / criteria", "split": "Split"}
PASTE_FORMATS = {"CSV": "pasted.csv", "JSONL": "pasted.jsonl"}
HOLD_OUT_PERCENT = {"test": 20, "validation": 0}  # the page's defaults; core's (and the CLI's) are 0
TRY_KEY = "tasks_try_result"
NO_SAMPLE = "(none: type a reference below)"
SAMPLE_CHOICES = 200
MODELS_HELP = ("Offered: the task's models, the studio's default, each model connection's models (as its server lists "
               "them), the embedded models and those of providers whose key is set; type any other name "
               "(connection/model or a litellm name).")
AGENT_HELP = "direct: the model answers in one reply; python: it may run Python code before answering."
CONVERSATION_FIELDS = ("simulator_model", "max_turns")  # TaskSettings a conversation task's form shows
PERSONA_COLUMNS = ("name", "segment", "description", "hidden facts")
PERSONA_FIELDS = {"name": "name", "segment": "segment", "description": "description", "hidden facts": "hidden_facts"}
PERSONAS_SAVE_KEY = "tasks_personas_save"


# --- settings ---------------------------------------------------------------------------------


def setting_key(prefix: str, name: str) -> str:
    return f"{prefix}rs_{name}"


def _number(current: dict, key: str, defaults: dict) -> float:
    value = current.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else defaults[key]


def _flag(current: dict, key: str, defaults: dict) -> bool:
    value = current.get(key)
    return value if isinstance(value, bool) else defaults[key]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def method_fields(prefix: str, method: str, current: dict) -> None:
    """The inputs for the settings `method` reads (its settings model in the registry), preset from the
    task's values, else the model's defaults."""
    used, defaults = setting_keys(method), setting_defaults(method)
    if not used:
        st.caption("This method has no settings.")
    if "rel_tol" in used:
        left, right = st.columns(2)
        left.number_input("Relative tolerance (rel_tol)", min_value=0.0, value=_number(current, "rel_tol", defaults),
                          format="%g", key=setting_key(prefix, "rel_tol"))
        right.number_input("Absolute tolerance (abs_tol)", min_value=0.0, value=_number(current, "abs_tol", defaults),
                           format="%g", key=setting_key(prefix, "abs_tol"))
    if "pattern" in used:
        st.text_input("Pattern (a regular expression)", value=_text(current.get("pattern")),
                      key=setting_key(prefix, "pattern"),
                      help="Leave empty to use each sample's reference answer as its pattern.")
    if "phrases" in used:
        phrases = current.get("phrases")
        lines = "\n".join(phrases) if isinstance(phrases, list) else _text(phrases)
        st.text_area("Required phrases, one per line", value=lines, key=setting_key(prefix, "phrases"),
                     help="Leave empty to use each sample's reference answer, split at ; or new lines.")
    if "partial" in used:
        st.checkbox("Partial credit (the share of phrases found)", value=_flag(current, "partial", defaults),
                    key=setting_key(prefix, "partial"))
    if "ignore_case" in used:
        st.checkbox("Ignore case", value=_flag(current, "ignore_case", defaults),
                    key=setting_key(prefix, "ignore_case"))
    if "full_match" in used:
        st.checkbox("The whole response must match", value=_flag(current, "full_match", defaults),
                    key=setting_key(prefix, "full_match"))
    if "criteria" in used:
        st.text_area("Criteria (what a good answer does)", value=_text(current.get("criteria")),
                     key=setting_key(prefix, "criteria"), height=120,
                     help="Shown to the judge and to labellers, with each sample's own rubric.")
    for name, label in (("rubric", "Rubric criteria (JSON: name, description, scale binary or 1-5, weight)"),
                        ("rules", "Rules (JSON: name, kind must or must_not, check regex or judge, pattern or "
                                  "question, role)")):
        if name in used:
            st.text_area(label, value=json.dumps(current.get(name) or [], ensure_ascii=False, indent=1),
                         key=setting_key(prefix, name), height=160,
                         help="Scenarios add their own must / must-not statements, asked of the judge.")
    if "scale" in used:
        scales = list(SCALE_NAMES)
        scale = current.get("scale") if current.get("scale") in scales else defaults["scale"]
        st.radio("Scale", scales, index=scales.index(scale), horizontal=True, key=setting_key(prefix, "scale"))
    if "labels_per_rollout" in used:
        value = current.get("labels_per_rollout")
        fits = isinstance(value, int) and 1 <= value <= MAX_LABELS_PER_ROLLOUT
        st.number_input("Labels per rollout (people who label each one)", min_value=1,
                        max_value=MAX_LABELS_PER_ROLLOUT, step=1,
                        value=value if fits else defaults["labels_per_rollout"],
                        key=setting_key(prefix, "labels_per_rollout"))
    if "spot_check_share" in used:
        share = min(1.0, max(0.0, _number(current, "spot_check_share", defaults)))
        st.slider("Spot-check share (rollouts a person confirms besides every unsure one)", 0.0, 1.0, share,
                  step=0.05, key=setting_key(prefix, "spot_check_share"))


def collect_method_settings(prefix: str, method: str, kept: dict) -> dict:
    """The reward settings from the inputs of `method`, plus keys no method reads (kept as they were); a
    setting of `method` that has no input on this page (a method added to the registry) keeps its value."""
    result = {key: value for key, value in kept.items() if key not in all_setting_keys()}
    state = st.session_state
    for name in setting_keys(method):
        key = setting_key(prefix, name)
        if key not in state:
            if kept.get(name) is not None:
                result[name] = kept[name]
            continue
        value = form_setting(name, state[key])
        if value in ("", []):
            continue
        result[name] = value
    return result


def collect(prefix: str, kept: dict, unshown: dict | None = None) -> TaskSettings:
    """The form's settings; `unshown` holds the stored values of settings the form did not draw (a single
    task's simulator model and turn limit), which are kept as they were rather than reset to defaults."""
    state = st.session_state
    method = state[f"{prefix}reward_method"]
    conversation = {**(unshown or {}), **{name: state[f"{prefix}{name}"] for name in CONVERSATION_FIELDS
                                          if f"{prefix}{name}" in state}}
    if "max_turns" in conversation:
        conversation["max_turns"] = int(conversation["max_turns"])
    if "simulator_model" in conversation:
        conversation["simulator_model"] = conversation["simulator_model"] or ""  # a cleared picker
    return TaskSettings(
        name=state[f"{prefix}name"], description=state[f"{prefix}description"],
        instructions=state[f"{prefix}instructions"], answer_format=state[f"{prefix}answer_format"],
        agent_mode=state[f"{prefix}agent_mode"], policy_model=state[f"{prefix}policy_model"] or "",
        learner_model=state[f"{prefix}learner_model"] or "", judge_model=state[f"{prefix}judge_model"] or "",
        reward_method=method, reward_settings=collect_method_settings(prefix, method, kept), **conversation,
        library_header=state.get(f"{prefix}library_header") or None,
        examples_intro=state.get(f"{prefix}examples_intro") or None,
    )


def on_save(prefix: str, original: str | None, kept: dict, unshown: dict | None = None,
            kind: str = "single") -> None:
    """Save through core; a new or renamed task becomes the sidebar's task (allowed here: before the sidebar)."""
    task = run_action(FLASH, "settings", lambda: save_task(engine(), collect(prefix, kept, unshown),
                                                           context().reviewer, original_name=original, kind=kind),
                      success="Task saved." if original else "Task created; it is now the sidebar's task.",
                      failure=f"{'Not saved' if original else 'Not created'}; nothing was written.")
    if task is None:
        return
    st.session_state[TASK_KEY] = task.name
    if original is None:
        st.session_state[NEW_KEY] = False
        for key in [k for k in st.session_state if str(k).startswith(NEW_PREFIX)]:
            del st.session_state[key]


def settings_form(prefix: str, base: TaskSettings, kind: str = "single") -> None:
    st.text_input("Name", value=base.name, max_chars=100, key=f"{prefix}name")
    if kind == "conversation":
        st.caption("A conversation task: the agent chats with a simulated user (a persona, see the Personas tab) "
                   "for up to the turn limit below; the rubric reward scores each conversation.")
    st.text_input("Description", value=base.description, key=f"{prefix}description")
    st.text_area("Instructions (the agent's system prompt)", value=base.instructions, height=160,
                 key=f"{prefix}instructions")
    st.text_area("Answer format", value=base.answer_format, height=80, key=f"{prefix}answer_format",
                 help="Appended to the instructions: how the final answer must be written.")
    wording_fields(prefix, base)
    modes = list(AGENT_MODES)
    st.selectbox("Agent mode", modes, index=modes.index(base.agent_mode) if base.agent_mode in modes else 0,
                 key=f"{prefix}agent_mode", help=AGENT_HELP)
    if st.session_state.get(f"{prefix}agent_mode", base.agent_mode) == "python":
        jail = jail_status()  # a failed probe is not cached: ask once per draw
        if not jail.available:
            st.warning("Runs in python mode will be refused on this machine: " + plain(jail.message))
    options = offered_models(base)
    policy, learner, judge = st.columns(3)
    for column, label, field, role in ((policy, "Policy model", "policy_model", "Answers the queries (the agent)."),
                                       (learner, "Learner model", "learner_model",
                                        "Summarises rollouts and writes experiences."),
                                       (judge, "Judge model", "judge_model", "Scores rollouts for the judge methods.")):
        model_picker(column, label, f"{prefix}{field}", options, task_id=None, start=getattr(base, field),
                     help=f"{role} {MODELS_HELP}", remember=False)
    if kind == "conversation":
        simulator, turns = st.columns(2)
        model_picker(simulator, "User simulator model (empty: the policy model)", f"{prefix}simulator_model",
                     [ModelOption("", "the policy model"), *options], task_id=None, start=base.simulator_model,
                     help=f"Plays the persona; it never sees the library. {MODELS_HELP}", remember=False,
                     format_func=lambda model: model or "(the policy model)")
        turns.number_input("Most agent turns in a conversation", min_value=1, max_value=20, step=1,
                           value=int(base.max_turns), key=f"{prefix}max_turns")
    models_note(f"{prefix}refresh_models")
    methods = list(METHODS)
    method = st.selectbox("Reward method", methods,
                          index=methods.index(base.reward_method) if base.reward_method in methods else 0,
                          key=f"{prefix}reward_method",
                          help="\n\n".join(plain(f"{m.name}: {m.description}") for m in METHODS.values()))
    st.caption(plain(get_method(method).description))
    method_fields(prefix, method, base.reward_settings)
    kept = {k: v for k, v in base.reward_settings.items() if k not in all_setting_keys()}
    if kept:
        st.caption("Other reward settings, kept as they are (no method of this studio reads them):")
        show_long(json.dumps(kept, ensure_ascii=False, indent=2), f"{prefix}kept_settings")


def wording_fields(prefix: str, base: TaskSettings) -> None:
    """The two lines around the library in the agent's prompt (core.domain.prompts.LibraryWording); empty is the
    neutral default, shown as the placeholder."""
    custom = bool(getattr(base, "library_header", None) or getattr(base, "examples_intro", None))
    with st.expander("How the agent's prompt introduces the library", expanded=custom):
        st.text_input("Library header", value=getattr(base, "library_header", None) or "", max_chars=MAX_WORDING_CHARS,
                      key=f"{prefix}library_header", placeholder=LIBRARY_HEADER,
                      help="The line above the library's lessons and examples. Empty: the default shown.")
        st.text_input("Worked examples' intro", value=getattr(base, "examples_intro", None) or "",
                      max_chars=MAX_WORDING_CHARS, key=f"{prefix}examples_intro", placeholder=EXAMPLES_INTRO,
                      help="The line above the worked examples. Empty: the default shown. Say what the agent "
                           "should take from them: a method, or the facts and numbers themselves.")


def show_settings(task: Task) -> None:
    """The settings as a reader sees them: short values in a table, long texts verbatim."""
    rows = [("name", task.name), ("kind", task.kind or "single"), ("description", task.description),
            ("agent mode", task.agent_mode),
            ("policy model", task.policy_model), ("learner model", task.learner_model),
            ("judge model", task.judge_model), ("reward method", task.reward_method)]
    if is_conversation(task):
        rows += [("user simulator model", task.simulator_model or "(the policy model)"),
                 ("most agent turns", str(task.max_turns))]
    table(rows, columns=["setting", "value"], key="tasks_settings_table")
    method = METHODS.get(task.reward_method)
    if method is not None:
        st.caption(plain(method.description))
    st.caption("Instructions")
    show_long(task.instructions, f"tasks_{task.id}_instructions")
    st.caption("Answer format")
    show_long(task.answer_format, f"tasks_{task.id}_answer_format")
    wording = LibraryWording.of(task)
    st.caption("Library header" + ("" if task.library_header else " (the default)"))
    show_long(wording.header, f"tasks_{task.id}_library_header")
    st.caption("Worked examples' intro" + ("" if task.examples_intro else " (the default)"))
    show_long(wording.examples_intro, f"tasks_{task.id}_examples_intro")
    st.caption("Reward settings")
    show_long(json.dumps(task.reward_settings or {}, ensure_ascii=False, indent=2), f"tasks_{task.id}_reward",
              empty="{}")


def on_kind() -> None:
    """A new conversation task is scored by the rubric; a new single-reply task starts from the default method."""
    state = st.session_state
    conversation = state.get(f"{NEW_PREFIX}kind") == "conversation"
    state[f"{NEW_PREFIX}reward_method"] = "rubric" if conversation else TaskSettings.model_fields["reward_method"].default


def draw_settings(task: Task | None) -> None:
    FLASH.show("settings")
    if not allowed("admin"):
        role_note("admin", "editing tasks")
        if task is not None:
            show_settings(task)
        return
    new = task is None or st.toggle("New task", key=NEW_KEY, help="Create another task instead of editing this one.")
    if new:
        models = TaskSettings.from_task(task) if task is not None else TaskSettings.draft(name="", instructions="")
        base = TaskSettings.draft(name="", instructions="", policy_model=models.policy_model,
                                  learner_model=models.learner_model, judge_model=models.judge_model)
        prefix, original = NEW_PREFIX, None
    else:
        base, prefix, original = TaskSettings.from_task(task), f"task_{task.id}_", task.name
    if new:
        kind = st.radio("Kind", TASK_KINDS, horizontal=True, key=f"{NEW_PREFIX}kind", on_change=on_kind,
                        format_func=lambda k: {"single": "one reply per query",
                                               "conversation": "conversations with personas"}.get(k, k),
                        help="A conversation task's agent chats with simulated users (personas, added on the "
                             "Personas tab after creating it); its samples are scenarios and its reward the rubric.")
    else:
        kind = task.kind or "single"
    if new and kind == "conversation" and base.reward_method != "rubric":
        base = TaskSettings.draft(**{**base.__dict__, "reward_method": "rubric",
                                     "reward_settings": dict(DEFAULT_RUBRIC)})
    settings_form(prefix, base, kind)
    unshown = {name: getattr(base, name) for name in CONVERSATION_FIELDS}
    st.button("Create task" if new else "Save", type="primary", key="tasks_save", on_click=on_save,
              args=(prefix, original, dict(base.reward_settings), unshown, kind))


# --- data -------------------------------------------------------------------------------------


def on_add(task_name: str, data: bytes, filename: str, mapping: dict, default_split: str,
           shares: tuple[float, float]) -> None:
    """The counts, and below them core's notes (the rows left out as duplicates) as the CLI prints them."""
    result = run_action(FLASH, "data", add_dataset_file, engine(), task_name, data, filename, mapping=mapping,
                        default_split=default_split, actor=context().reviewer, test_share=shares[0],
                        validation_share=shares[1], failure="The samples were not added; nothing was written.")
    if result is not None:
        FLASH.set("data", Outcome(True, f"Added {result.added} samples ({result.already} already present).",
                                  detail="\n".join(result.notes)))
        st.session_state.pop(CHECKED_KEY, None)


def mapping_form(columns: list[str]) -> tuple[dict[str, str], str]:
    """Which column feeds which field; widget keys follow the columns, so another file starts afresh."""
    tag = hashlib.sha256(json.dumps(columns).encode()).hexdigest()[:10]
    if columns:
        st.caption("Columns found in the file")
        show_long(", ".join(columns), f"tasks_columns_{tag}")
    else:
        st.caption("No column names could be read; Check file says why.")
    st.caption(f"{AUTO} uses a column named like the field or a usual synonym (query: question, prompt, input; "
               "reference: answer, target, solution; rubric: criteria), if the file has one.")
    mapping: dict[str, str] = {}
    options = [AUTO, *columns]
    guessed = resolve_columns(columns)  # core's rule, the CLI's too
    cells = st.columns(len(MAPPING_TARGETS))
    for cell, (target, label) in zip(cells, MAPPING_TARGETS.items(), strict=True):
        chosen = cell.selectbox(label, options, index=options.index(guessed.get(target, AUTO)),
                                key=f"tasks_map_{tag}_{target}")
        if chosen != AUTO:
            mapping[target] = chosen
    meta = st.multiselect("Metadata columns (none chosen: every column not used above)", columns,
                          key=f"tasks_map_{tag}_meta")
    if meta:
        mapping["meta"] = ",".join(meta)
    default_split = st.radio("Split for the other rows without one", SPLITS, horizontal=True,
                             key="tasks_default_split")
    return mapping, default_split


def hold_out_form() -> tuple[float, float]:
    """The shares (0 to 1) of the rows without a split that core holds out for test and validation."""
    test, validation = st.columns(2)
    test_percent = test.number_input("Hold out for test (%)", min_value=0, max_value=100,
                                     value=HOLD_OUT_PERCENT["test"], step=5, key="tasks_hold_test")
    validation_percent = validation.number_input("Hold out for validation (%)", min_value=0, max_value=100,
                                                 value=HOLD_OUT_PERCENT["validation"], step=5,
                                                 key="tasks_hold_validation")
    st.caption("Held out from the rows whose split cell is missing or empty; rows that name a split keep it. "
               "The choice is seeded by each row's id, so the same file always splits the same way.")
    return test_percent / 100, validation_percent / 100


def dataset_input() -> tuple[bytes, str]:
    source = st.radio("Source", ["Upload a file", "Paste text"], horizontal=True, key="tasks_data_source")
    if source == "Upload a file":
        uploaded = st.file_uploader("Dataset file (CSV, JSONL or JSON)", type=["csv", "jsonl", "json"],
                                    key="tasks_upload")
        return (uploaded.getvalue(), uploaded.name) if uploaded is not None else (b"", "")
    fmt = st.radio("Format", list(PASTE_FORMATS), horizontal=True, key="tasks_paste_format")
    text = st.text_area("Rows (CSV with a header row, or one JSON object per line)", height=200,
                        key="tasks_paste")
    return text.encode("utf-8"), PASTE_FORMATS[fmt]


def draw_samples(session: Session, task: Task) -> None:
    counts = queries.count_samples(session, task.id)
    shown = ["train", "validation", "test"] if counts.get("validation") else ["train", "test"]
    cells = st.columns(len(shown) + 1)
    for cell, split in zip(cells, shown, strict=False):
        cell.metric(split.capitalize(), counts.get(split, 0))
    cells[-1].metric("All samples", sum(counts.values()))
    samples = queries.samples(session, task.id, limit=SAMPLE_ROWS)
    if samples:
        st.caption(f"The first {len(samples)} samples")
        table([{"id": s.external_id, "split": s.split, "query": s.query, "reference": s.reference,
                "rubric": s.rubric} for s in samples], key="tasks_samples_table")
    else:
        st.caption("This task has no samples yet.")


def draw_data(task: Task | None) -> None:
    if task is None:
        st.info("No task is chosen. Create one under Settings.")
        return
    with Session(engine()) as session:
        draw_samples(session, task)
    st.subheader("Add samples", anchor=False)
    FLASH.show("data")
    if not allowed("admin"):
        role_note("admin", "adding data to a task")
        return
    data, filename = dataset_input()
    if not data.strip():
        st.caption("Give a file or paste rows to map their columns.")
        return
    columns = columns_of(data, filename)
    mapping, default_split = mapping_form(columns)
    shares = hold_out_form()
    signature = json.dumps([task.name, hashlib.sha256(data).hexdigest(), filename, mapping, default_split, shares])
    if st.button("Check file", key="tasks_check"):
        st.session_state[CHECKED_KEY] = signature
    if st.session_state.get(CHECKED_KEY) != signature:
        st.caption("Check the file to see a preview; nothing is written before you add the samples.")
        return
    try:
        dataset = parse_dataset_file(data, filename, mapping, default_split, test_share=shares[0],
                                     validation_share=shares[1])
    except InvalidInput as exc:
        row = getattr(exc, "row", None)
        where = f" (row {row})" if row is not None else ""
        show_outcome(Outcome(False, f"This file cannot be added{where}; nothing was written. The problem:", str(exc)))
        return
    rows = dataset.rows
    show_outcome(Outcome(True, f"{len(rows)} rows OK: {split_summary(rows)}", detail="\n".join(dataset.notes())))
    note = mapping_note(resolve_columns(columns, mapping))
    if note:
        st.caption(plain(f"Columns: {note}."))
    st.caption(f"Preview of the first {min(len(rows), PREVIEW_ROWS)} rows")
    table([{"id": r.external_id, "split": r.split, "query": r.query, "reference": r.reference, "rubric": r.rubric,
            "meta": json.dumps(r.meta, ensure_ascii=False)} for r in rows[:PREVIEW_ROWS]], key="tasks_preview_table")
    st.button(f"Add {len(rows)} samples", type="primary", key="tasks_add", on_click=on_add,
              args=(task.name, data, filename, mapping, default_split, shares))


# --- test the reward --------------------------------------------------------------------------


def reference_input(task: Task) -> str | None:
    """A sample's reference (its query shown beside it), or one typed here."""
    with Session(engine()) as session:
        samples = {s.external_id: s for s in queries.samples(session, task.id, limit=SAMPLE_CHOICES)}
    key = f"tasks_try_sample_{task.id}"
    options = [NO_SAMPLE, *samples]
    keep_valid_choice(key, options)
    choice = st.selectbox(f"Sample (optional; the first {SAMPLE_CHOICES} of the task)", options, key=key)
    if choice == NO_SAMPLE:
        return st.text_input("Reference answer", key="tasks_try_reference")
    sample = samples[choice]
    st.caption("The sample's query")
    show_long(sample.query, f"tasks_try_query_{sample.id}")
    st.caption("Its reference answer")
    show_text(sample.reference, empty="(no reference)")
    return sample.reference


def show_try_result(result: RewardResult) -> None:
    reward, source = st.columns(2)
    reward.metric("Reward", reward_text(result.value))
    source.metric("Source", result.source)
    st.caption("Why")
    show_text(result.detail)


def draw_try(task: Task | None) -> None:
    """Score one pasted answer with the task's saved reward method and settings; nothing is stored."""
    if task is None:
        st.info("No task is chosen. Create one under Settings.")
        return
    method = METHODS.get(task.reward_method)
    if method is None:
        st.error(plain(f"This task's reward method {task.reward_method!r} is not one this studio knows."))
        return
    st.caption(plain(f"The task's saved reward method, {method.name}: {method.description}"))
    st.caption(plain(f"What it reads: {method.reads}"))
    reason = cannot_try(method.name)
    if reason is not None:
        st.info(plain(reason))
        return
    reference = reference_input(task)
    answer = st.text_area("Answer (as the agent would write it)", height=140, max_chars=MAX_TEXT_CHARS,
                          key="tasks_try_answer")
    signature = json.dumps([task.id, task.reward_method, task.reward_settings, answer, reference], default=str)
    if st.button("Score it", type="primary", key="tasks_try_score"):
        st.session_state[TRY_KEY] = (signature, try_reward(task, answer, reference))
    kept = st.session_state.get(TRY_KEY)
    if kept is not None and kept[0] == signature:
        show_try_result(kept[1])


# --- personas (conversation tasks) ------------------------------------------------------------


def persona_rows(personas: list[Persona]) -> list[dict]:
    """Personas as the editor's rows: hidden facts in one cell, separated by `;` as in a CSV file."""
    return [{"name": p.name, "segment": p.segment, "description": p.description,
             "hidden facts": join_list_cell(p.hidden_facts)} for p in personas]


def _cell(value: Any) -> str:
    return "" if value is None or (not isinstance(value, str) and pd.isna(value)) else str(value)


def edited_personas(frame: pd.DataFrame) -> list[dict]:
    """The editor's rows as persona objects for core to check; a row left wholly empty is dropped."""
    items = []
    for record in frame.to_dict("records"):
        cells = {column: _cell(record.get(column)) for column in PERSONA_COLUMNS}
        if not any(cell.strip() for cell in cells.values()):
            continue
        item: dict[str, Any] = {PERSONA_FIELDS[column]: cells[column] for column in PERSONA_COLUMNS}
        item["hidden_facts"] = split_list_cell(cells["hidden facts"])
        items.append(item)
    return items


def replace_personas(task_name: str, items: list[dict], where: str) -> int:
    """Check the persona objects (core's rules and messages) and make them the task's personas."""
    return save_personas(engine(), task_name, personas_from_objects(items, where), context().reviewer)


def on_replace_from_file(task_name: str, items: list[dict], filename: str) -> None:
    run_action(FLASH, "personas", replace_personas, task_name, items, filename,
               report=lambda n: f"The task's personas are now the file's {n}.",
               failure="The personas were not saved; nothing was written.")


def on_split(task_name: str, key: str) -> None:
    held = list(st.session_state.get(key) or [])
    run_action(FLASH, "split", split_by_persona, engine(), task_name, held, context().reviewer,
               report=lambda counts: "Scenarios per split now: " + ", ".join(
                   f"{split} {counts.get(split, 0)}" for split in SPLITS) + ".",
               failure="The splits were not changed; nothing was written.")


def splits_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{split} {counts[split]}" for split in SPLITS if counts.get(split)) or "no scenarios"


def draw_persona_table(personas: list[Persona], splits: dict[str, dict[str, int]]) -> None:
    if not personas:
        st.info("This task has no personas yet; a conversation task needs them before it can run. Add them "
                "below or upload a personas file.")
    else:
        table([{**row, "splits": splits_text(splits.get(row["name"], {}))} for row in persona_rows(personas)],
              columns=["name", "segment", "splits", "hidden facts", "description"], key="tasks_personas_table")
    known = {p.name for p in personas}
    orphans = sorted(name for name, counts in splits.items() if name not in known and counts)
    if orphans:
        st.warning(plain("Scenarios name personas this task does not have, so they cannot be played: "
                         + "; ".join(f"{name or '(none)'} ({splits_text(splits[name])})" for name in orphans)))


def draw_persona_editor(task: Task, personas: list[Persona]) -> None:
    """The personas as an editable table; Save replaces them all through core (checked whole first)."""
    st.subheader("Edit personas", anchor=False)
    st.caption("Edit cells, add rows at the bottom, or select rows and delete them; then Save. Segments are short "
               "tags like at_risk; hidden facts are separated by ;. Names must be unique: scenarios find their "
               "persona by name.")
    digest = hashlib.sha256(json.dumps(persona_dicts(personas), sort_keys=True).encode()).hexdigest()[:10]
    frame = pd.DataFrame(persona_rows(personas), columns=list(PERSONA_COLUMNS), dtype="string")
    edited = st.data_editor(frame, num_rows="dynamic", hide_index=True,
                            key=f"tasks_personas_editor_{task.id}_{digest}",  # a new table after each save
                            column_config={"description": st.column_config.TextColumn(width="large"),
                                           "hidden facts": st.column_config.TextColumn(width="large")})
    if st.button("Save personas", type="primary", key=PERSONAS_SAVE_KEY):
        run_action(FLASH, "personas", replace_personas, task.name, edited_personas(edited), "the personas",
                   report=lambda n: f"Saved: the task has {n} personas.",
                   failure="The personas were not saved; nothing was written.")
        st.rerun()  # the table above and the editor show what is stored now


def draw_persona_file(task: Task) -> None:
    st.subheader("Upload a personas file", anchor=False)
    st.caption("JSON (a list of objects with name, description, segment, hidden_facts) or CSV with those "
               "columns (hidden facts separated by ;). The file replaces all the task's personas.")
    uploaded = st.file_uploader("Personas file (JSON or CSV)", type=["json", "csv"],
                                key=f"tasks_personas_file_{task.id}")
    if uploaded is None:
        return
    try:
        parsed = parse_personas(uploaded.getvalue(), uploaded.name)
    except InvalidInput as exc:
        show_outcome(Outcome(False, "This file cannot be used; nothing was written. The problem:", str(exc)))
        return
    st.caption(f"The file holds {len(parsed)} personas")
    table(persona_rows(parsed), key="tasks_personas_file_table")
    st.button(f"Replace the task's personas with these {len(parsed)}", key="tasks_personas_replace",
              on_click=on_replace_from_file, args=(task.name, persona_dicts(parsed), uploaded.name))


def draw_held_out(task: Task, personas: list[Persona], splits: dict[str, dict[str, int]]) -> None:
    """Which personas only test sees: every scenario of theirs goes to test, every other one to train."""
    st.subheader("Held-out personas", anchor=False)
    st.caption("Scenarios of the held-out personas go to test and all others to train (validation stays as it "
               "is), so an evaluation on test measures the library with people it never trained on.")
    FLASH.show("split")
    names = [p.name for p in personas]
    key = f"tasks_held_out_{task.id}"
    state = st.session_state
    if key in state:
        state[key] = [name for name in state[key] if name in names]
    else:
        state[key] = [n for n in names if splits.get(n) and set(splits[n]) - {"validation"} == {"test"}]
    st.multiselect("Held-out personas (only in test)", names, key=key)
    st.button("Split by persona", key="tasks_split_by_persona", on_click=on_split, args=(task.name, key))


def draw_personas(task: Task) -> None:
    with Session(engine()) as session:
        personas = task_personas(session, task.id)
        splits = persona_splits(session, task)
    FLASH.show("personas")
    draw_persona_table(personas, splits)
    if personas:
        st.download_button("Download personas (JSON)", key="tasks_personas_download", on_click="ignore",
                           data=json.dumps(persona_dicts(personas), ensure_ascii=False, indent=2).encode("utf-8"),
                           file_name=export_filename(task.name).replace("tfgrpo-task-", "personas-"),
                           mime="application/json")
    if not allowed("admin"):
        role_note("admin", "editing personas")
        return
    draw_persona_editor(task, personas)
    draw_persona_file(task)
    draw_held_out(task, personas, splits)


# --- export / import --------------------------------------------------------------------------


def sample_count(task: Task) -> int:
    with Session(engine()) as session:
        return sum(queries.count_samples(session, task.id).values())


def on_import() -> None:
    uploaded = st.session_state.get("tasks_import_file")
    pasted = str(st.session_state.get("tasks_import_text") or "")
    data: bytes | str = uploaded.getvalue() if uploaded is not None else pasted
    if not (data.strip() if isinstance(data, str) else data):
        FLASH.set("import", Outcome(False, "Choose a task file or paste one first."))
        return
    rename = str(st.session_state.get("tasks_import_name") or "").strip() or None
    task = run_action(FLASH, "import", import_task, engine(), data, context().reviewer, rename=rename,
                      report=lambda new: f"Imported a task with {sample_count(new)} samples; it is now the "
                                         "sidebar's task.",
                      failure="The task was not imported; nothing was written.")
    if task is not None:
        st.session_state[TASK_KEY] = task.name


def draw_export_import(task: Task | None) -> None:
    st.subheader("Export", anchor=False)
    if task is None:
        st.caption("No task is chosen.")
    else:
        with Session(engine()) as session:
            text = export_task_json(session, task)
        st.caption("The task's settings and all its samples, as one JSON file that Import reads.")
        st.download_button("Download task file", data=text.encode("utf-8"), file_name=export_filename(task.name),
                           mime="application/json", key="tasks_export", on_click="ignore")
    st.subheader("Import", anchor=False)
    FLASH.show("import")
    if not allowed("admin"):
        role_note("admin", "importing tasks")
        return
    st.file_uploader("Task file (exported from a studio)", type=["json"], key="tasks_import_file")
    st.text_area("Or paste the file's JSON", height=120, key="tasks_import_text")
    st.text_input("Import as (optional, a name for the new task)", key="tasks_import_name",
                  help="Needed when a task of the file's name exists already.")
    st.button("Import task", type="primary", key="tasks_import", on_click=on_import)


def page() -> None:
    st.title("Tasks")
    task = current_task(context())  # none chosen (or none yet): Settings creates one
    conversation = task is not None and is_conversation(task)
    names = ["Settings", "Data", *(["Personas"] if conversation else []), "Test the reward", "Export / import"]
    tabs = dict(zip(names, st.tabs(names), strict=True))
    with tabs["Settings"]:
        draw_settings(task)
    with tabs["Data"]:
        draw_data(task)
    if conversation:
        with tabs["Personas"]:
            draw_personas(task)
    with tabs["Test the reward"]:
        draw_try(task)
    with tabs["Export / import"]:
        draw_export_import(task)


run_page(page)

"""Library: the versions of the sidebar's library, their text, what each experience of a version does
(measured by leaving it out), a diff between any two, manual edits, revert, labels, export and import.

Versions are immutable: every change here goes through `core.records.library.versions` and appends a new version
(the actor is the sidebar's reviewer). Moving `production` opens the Evaluate page's guarded Promote dialog
(ui.promote); other labels move at once. Reads go through `storage.queries`. Experience texts are
written by a model or a person, so they are shown only as text, in tables, or in a diff block, through
ui.display (long texts clipped with a "Show all" toggle, table cells spreadsheet-safe).

"Entries per query" sets the library's selection (core.records.library.selection: all entries, or the k most similar to
each query by BM25) and previews the entries a typed query would be shown, through the function the HTTP API's
selection route uses.

"Measure experiences" queues a run of kind `attribute` (core.grpo.attribution) for the worker and follows its
progress; once measured, each experience's effect (version minus version-without-it, with its interval and
helps / hurts / unclear) shows beside it, and the experiences that hurt can be removed as a new version
through the same edit path as manual edits.

Actions run in button callbacks, before the page is drawn, so every table already shows their result;
their outcome is kept in session state and shown once beside the section that caused it.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

import streamlit as st
from sqlmodel import Session

from core.domain.coverage import Coverage
from core.domain.library import EXAMPLE, EXAMPLE_MAX_WORDS, LESSON, MAX_WORDS, ProposedOp
from core.domain.library import diff as library_diff
from core.domain.library_io import LibraryFormatError, decode_library
from core.domain.selection import MAX_K, Selection, SelectionMode
from core.errors import StudioError
from core.grpo import attribution
from core.jobs.run_control import cancel_attribution, resume_run
from core.records.library import versions as core_versions
from core.records.library.coverage import version_coverage
from core.records.library.selection import selection_of, set_selection
from core.records.production.serving import served_selection
from core.records.runs.workers import job_health
from storage import queries
from storage.statuses import PERSON_MAY_CANCEL, PERSON_MAY_RESUME, UNFINISHED, JobStatus
from ui.common import (
    DATETIME,
    Context,
    Flash,
    Outcome,
    allowed,
    checks_sign_in,
    context,
    engine,
    experience_lines,
    failed,
    keep_valid_choice,
    plain,
    require_task,
    role_note,
    run_action,
    run_page,
    start_worker_if_needed,
    status_label,
)
from ui.display import show_long, table
from ui.messages import message_markdown
from ui.promote import PromoteDialog

FLASH = Flash("library_flash")
PROMOTE = PromoteDialog("lib", FLASH, "label")  # moving production: the Evaluate page's guarded dialog
FORMATS = {"md": "Markdown", "json": "JSON", "prompt": "System prompt"}
EXTENSIONS = {"md": ("md", "text/markdown"), "json": ("json", "application/json"), "prompt": ("txt", "text/plain")}
# Selections that should follow the newest version after a change (their defaults are recomputed).
FOLLOW_LATEST_KEYS = ("lib_text_version", "lib_diff_from", "lib_diff_to", "lib_label_version",
                      "lib_export_version", "lib_revert_version")
AUTO_SPLIT = "auto"  # the measurement's default split: validation when the task has one, else test
VERDICT_ORDER = {attribution.Verdict.HURTS: 0, attribution.Verdict.UNCLEAR: 1, attribution.Verdict.HELPS: 2}
MODE_NAMES = {SelectionMode.ALL: "All entries (the paper)", SelectionMode.TOP_K: "The k most similar to the query"}


@dataclass
class VersionInfo:
    id: int
    number: int
    parent_id: int | None
    source: str
    created_by: str
    note: str
    experiences: list[dict]
    created_at: Any
    labels: list[str] = field(default_factory=list)


@dataclass
class PageData:
    task: Any = None
    library_exists: bool = False
    versions: list[VersionInfo] = field(default_factory=list)  # oldest first
    rows: list[dict] = field(default_factory=list)  # newest first
    label_rows: list[dict] = field(default_factory=list)
    splits: dict[str, int] = field(default_factory=dict)  # samples per split of the task
    selection: Selection = field(default_factory=Selection)
    coverage: Coverage | None = None  # the latest version's, on the task's train references (issue 44)

    @property
    def by_id(self) -> dict[int, VersionInfo]:
        return {v.id: v for v in self.versions}

    @property
    def latest(self) -> VersionInfo | None:
        return self.versions[-1] if self.versions else None


# ---------------------------------------------------------------------------------------------- reading


def creator(version: Any, steps: dict) -> str:
    """Who or what made a version: `run 3 · step 0/1` for a training step, else the person or tool."""
    if version.run_id is None:
        return version.created_by
    step = steps.get(version.step_id)
    where = f" · step {step.epoch}/{step.batch_index}" if step is not None else ""
    return f"run {version.run_id}{where}"


def load(ctx: Context) -> PageData:
    """Everything the page shows about the sidebar's library, read in one session."""
    data = PageData()
    with Session(engine()) as session:
        data.task = queries.task_by_name(session, ctx.task) if ctx.task else None
        if data.task is None:
            return data
        library = queries.library_by_name(session, data.task.id, ctx.library)
        if library is None:
            return data
        data.library_exists = True
        data.selection = selection_of(library)
        data.splits = queries.count_samples(session, data.task.id)
        stored = queries.versions(session, library.id)
        labels = queries.labels(session, library.id)
        steps = queries.steps_by_ids(session, sorted({v.step_id for v in stored if v.step_id is not None}))
        labels_by_version: dict[int, list[str]] = {}
        for label in labels:
            labels_by_version.setdefault(label.version_id, []).append(label.name)
        numbers = {v.id: v.number for v in stored}
        for v in stored:
            data.versions.append(VersionInfo(
                id=v.id, number=v.number, parent_id=v.parent_id, source=v.source, created_by=v.created_by,
                note=v.note, experiences=[dict(exp) for exp in v.experiences], created_at=v.created_at,
                labels=sorted(labels_by_version.get(v.id, []))))
            data.rows.append({
                "version": f"#{v.number}",
                "parent": f"#{numbers[v.parent_id]}" if v.parent_id in numbers else None,
                "source": v.source, "created by": creator(v, steps), "note": v.note, "size": len(v.experiences),
                "labels": ", ".join(sorted(labels_by_version.get(v.id, []))), "created at": v.created_at})
        data.rows.reverse()
        data.coverage = version_coverage(session, data.task, library, stored[-1] if stored else None)
        data.label_rows = [{"label": label.name, "version": f"#{numbers.get(label.version_id, '?')}",
                            "moved by": label.moved_by, "moved at": label.moved_at}
                           for label in sorted(labels, key=lambda item: item.name)]
    return data


def version_option(version: VersionInfo | None) -> str:
    """A version as the selectboxes name it (stable, so a kept selection still matches after a change)."""
    return f"#{version.number}" if version else "?"


def unified_diff(old: VersionInfo, new: VersionInfo) -> str:
    lines = difflib.unified_diff(experience_lines(old.experiences).splitlines(),
                                 experience_lines(new.experiences).splitlines(),
                                 fromfile=f"version #{old.number}", tofile=f"version #{new.number}", lineterm="")
    return "\n".join(lines)


def export_file_name(task_name: str, library_name: str, number: int, fmt: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", f"{task_name} {library_name}".lower()).strip("-") or "library"
    return f"{slug}-v{number}.{EXTENSIONS[fmt][0]}"


# ---------------------------------------------------------------------------------------------- actions
# Each takes its inputs explicitly and returns an Outcome; all writing is done by core.records.library.versions.


@checks_sign_in
def apply_edit(ops: list[ProposedOp], note: str = "", ctx: Context | None = None,
               base_version_id: int | None = None) -> Outcome:
    """A manual change as a new version; an invalid operation (duplicate, too short, unknown id) writes nothing,
    and so does a change made on a version that is no longer the latest (someone else's edit landed first)."""
    ctx = ctx or context()
    try:
        version = core_versions.edit_library(engine(), ctx.task, ops, ctx.reviewer, library_name=ctx.library,
                                             note=note, base_version_id=base_version_id)
    except Exception as exc:  # noqa: BLE001  (shown to the person; the transaction was rolled back)
        return failed(exc)
    return Outcome(True, f"Created version #{version.number}.")


@checks_sign_in
def revert(version_id: int, ctx: Context | None = None) -> Outcome:
    """A new version with the content of an older one."""
    ctx = ctx or context()
    try:
        version = core_versions.revert_to(engine(), ctx.task, version_id, ctx.reviewer, library_name=ctx.library)
    except Exception as exc:  # noqa: BLE001
        return failed(exc)
    return Outcome(True, f"Created version #{version.number}: {plain(version.note)}.")


def public_name(version_id: int) -> str:
    """The version a selectbox chose (by id) as core takes what a person names: its number in the library."""
    with Session(engine()) as session:
        version = queries.version_by_id(session, version_id)
    return str(version.number) if version else "?"


@checks_sign_in
def move_label(name: str, version_id: int, ctx: Context | None = None) -> Outcome:
    """Point a label at a version (`production` through its guard: core refuses it without a comparison or a
    reason, which only the Promote dialog gives)."""
    ctx = ctx or context()
    try:
        label = core_versions.set_label(engine(), ctx.task, public_name(version_id), name, ctx.reviewer,
                                        library_name=ctx.library)
    except Exception as exc:  # noqa: BLE001
        return failed(exc)
    with Session(engine()) as session:
        version = queries.version_by_id(session, label.version_id)
    return Outcome(True, f"The label {plain(label.name)} now points at version #{version.number}.")


@checks_sign_in
def import_upload(filename: str, data: bytes, ctx: Context | None = None) -> Outcome:
    """An uploaded Markdown, JSON or text file as a new version, through the CLI's checks (core.domain.library_io: size,
    UTF-8, nesting, the learner's limits); a file that fails any of them writes nothing."""
    ctx = ctx or context()
    try:
        text = decode_library(data, filename)
        version = core_versions.import_library(engine(), ctx.task, text, filename, library_name=ctx.library,
                                               actor=ctx.reviewer)
    except LibraryFormatError as exc:
        return Outcome(False, "Cannot import this file. Nothing was written. The problem:", detail=str(exc))
    except Exception as exc:  # noqa: BLE001
        return failed(exc)
    return Outcome(True, f"Imported {len(version.experiences)} experiences as version #{version.number}.")


# ---------------------------------------------------------------------------------------------- callbacks


def follow_new_version() -> None:
    """After a change that created a version: every version picker names the new one (the diff's From its
    parent, Revert the version it replaced), set here in the callback, before they are drawn. Popping their keys
    instead let the browser keep showing the old number while the page worked on the new version: a download
    named after one version under a picker that said another, a label moved to the version not shown."""
    ctx = context()
    with Session(engine()) as session:
        task = queries.task_by_name(session, ctx.task) if ctx.task else None
        library = queries.library_by_name(session, task.id, ctx.library) if task else None
        newest = queries.latest_version(session, library.id) if library else None
    stale = [key for key in st.session_state if str(key).startswith("lib_edit_text_")]
    for key in (*FOLLOW_LATEST_KEYS, *stale):
        st.session_state.pop(key, None)
    if newest is None:
        return
    for key in FOLLOW_LATEST_KEYS:
        st.session_state[key] = newest.id
    if newest.parent_id is not None:
        st.session_state["lib_diff_from"] = st.session_state["lib_revert_version"] = newest.parent_id
    else:
        st.session_state.pop("lib_revert_version", None)


CREATES_VERSION = ("edit", "revert", "import")  # the sections whose every success is a new version


def _flash(section: str, outcome: Outcome) -> None:
    FLASH.set(section, outcome)
    if outcome.ok and section in CREATES_VERSION:
        follow_new_version()


EDIT_BASE_KEY = "lib_edit_base_version"
KIND_LABELS = {LESSON: "lesson", EXAMPLE: "worked example"}


def _on_add() -> None:
    text = st.session_state.get("lib_add_text", "")
    kind = EXAMPLE if st.session_state.get("lib_add_kind") == KIND_LABELS[EXAMPLE] else LESSON
    outcome = apply_edit([ProposedOp("ADD", text=text, kind=kind)], st.session_state.get("lib_add_note", ""),
                         base_version_id=st.session_state.get(EDIT_BASE_KEY))
    if outcome.ok:
        st.session_state["lib_add_text"] = ""
        st.session_state["lib_add_note"] = ""
    _flash("edit", outcome)


def _on_edit(exp_id: str) -> None:
    text = st.session_state.get(f"lib_edit_text_{exp_id}", "")
    _flash("edit", apply_edit([ProposedOp("MODIFY", [exp_id], text)], st.session_state.get("lib_edit_note", ""),
                              base_version_id=st.session_state.get(EDIT_BASE_KEY)))


def _on_delete() -> None:
    ids = list(st.session_state.get("lib_delete_ids") or [])
    outcome = apply_edit([ProposedOp("DELETE", ids)], st.session_state.get("lib_delete_note", ""),
                         base_version_id=st.session_state.get(EDIT_BASE_KEY))
    if outcome.ok:
        st.session_state["lib_delete_ids"] = []
    _flash("edit", outcome)


def _on_merge() -> None:
    ids = list(st.session_state.get("lib_merge_ids") or [])
    text = st.session_state.get("lib_merge_text", "")
    outcome = apply_edit([ProposedOp("MERGE", ids, text)], st.session_state.get("lib_merge_note", ""),
                         base_version_id=st.session_state.get(EDIT_BASE_KEY))
    if outcome.ok:
        st.session_state["lib_merge_ids"] = []
        st.session_state["lib_merge_text"] = ""
    _flash("edit", outcome)


def _on_revert() -> None:
    _flash("revert", revert(st.session_state["lib_revert_version"]))


def _on_move_label() -> None:
    name, version_id = st.session_state.get("lib_label_name", ""), st.session_state["lib_label_version"]
    if name.strip() == core_versions.PRODUCTION and allowed("admin"):
        PROMOTE.ask(version_id)  # production moves only after the guarded dialog's Confirm (ui.promote)
        return
    _flash("label", move_label(name, version_id))


def _on_selection() -> None:
    ctx = context()
    mode, k = st.session_state.get("lib_selection_mode"), int(st.session_state.get("lib_selection_k") or 0)
    run_action(FLASH, "selection", set_selection, engine(), ctx.task, ctx.library, mode, k, ctx.reviewer,
               success=lambda chosen: f"Each prompt now shows {chosen.describe()}.")


def _on_import(uploaded: Any) -> None:
    if uploaded is None:
        _flash("import", Outcome(False, "Choose a file first."))
        return
    _flash("import", import_upload(uploaded.name, uploaded.getvalue()))


# ---------------------------------------------------------------------------------------------- measuring


def effect_rows(experiences: list[dict], effects: dict) -> list[dict]:
    """One row per experience of the version, in its order, with its measured effect (blank if none)."""
    rows = []
    for exp in experiences:
        effect = effects.get(exp["id"])
        rows.append({"id": exp["id"], "experience": exp["text"],
                     "effect": effect.delta if effect else None,
                     "95% interval": effect.interval if effect else "–",
                     "p": effect.p_value if effect else None,
                     "verdict": str(effect.verdict) if effect else "not measured",
                     "shown": effect.shown_line if effect else "–"})
    return rows


def measure_settings() -> dict:
    """The measurement form's choices as core.grpo.attribution takes them."""
    state = st.session_state
    split = state.get("lib_measure_split") or AUTO_SPLIT
    return {"split": None if split == AUTO_SPLIT else split, "k": int(state.get("lib_measure_k") or 2),
            "limit": int(state.get("lib_measure_limit") or 0) or None}


def _on_measure(version_id: int) -> None:
    ctx = context()
    run_id = run_action(FLASH, "measure", attribution.create_attribution, engine(), ctx.task, public_name(version_id),
                        library_name=ctx.library, created_by=ctx.reviewer, **measure_settings(),
                        report=lambda new_id: f"Measurement run {new_id} queued; a worker executes it.")
    if run_id is not None:
        start_worker_if_needed()


def _on_remove_hurting(version_id: int) -> None:
    ctx = context()
    version = run_action(FLASH, "measure", attribution.remove_hurting, engine(), ctx.task, version_id, ctx.reviewer,
                         library_name=ctx.library,
                         report=lambda new: f"Created version #{new.number} without the experiences "
                                            "that hurt.")
    if version is not None:
        follow_new_version()


def _on_measure_request(change, run_id: int, done: str) -> None:
    if run_action(FLASH, "measure", change, engine(), run_id, context().reviewer, success=done) is not None \
            and change is resume_run:
        start_worker_if_needed()


# ---------------------------------------------------------------------------------------------- drawing


def version_select(label: str, key: str, ids: list[int], data: PageData, default: int | None = None) -> int:
    """A version picker whose choice lives in session state (follow_new_version sets it after a change), starting
    from `default` (else the newest)."""
    keep_valid_choice(key, ids)
    if default in ids:
        st.session_state.setdefault(key, default)
    return st.selectbox(label, ids, key=key, format_func=lambda i: version_option(data.by_id.get(i)))


def draw_versions(data: PageData) -> None:
    st.header("Versions", anchor=False)
    table(data.rows, key="lib_versions_table",
          column_config={"created at": DATETIME, "parent": st.column_config.NumberColumn(format="%d")})


def draw_text(data: PageData, newest_first: list[int], ctx: Context) -> None:
    st.header("Experiences of a version", anchor=False)
    chosen = data.by_id[version_select("Version", "lib_text_version", newest_first, data)]
    if chosen.experiences:
        show_long(experience_lines(chosen.experiences), f"lib_text_{chosen.id}")
    else:
        st.caption(f"Version #{chosen.number} is empty: the agent runs without experiences.")
    draw_measure(data, chosen, ctx)


def draw_effects(chosen: VersionInfo, effects: dict, latest: VersionInfo) -> None:
    """Each experience of the version beside its measured effect, and the removal of those that hurt."""
    some = next(iter(effects.values()))
    st.caption(f"Measured by run {some.run_id} on {some.n} {some.split} queries x k={some.k}. Effect: mean reward "
               "of the version minus the version without that experience, per query (paired); it helps when "
               "its 95% interval lies above 0, hurts when it lies below 0, and is unclear otherwise.")
    table(effect_rows(chosen.experiences, effects), key="lib_effects_table",
          column_config={"effect": st.column_config.NumberColumn(format="%+.3f"),
                         "p": st.column_config.NumberColumn(format="%.3g")})
    hurting = [e.experience_id for e in effects.values() if e.verdict == attribution.Verdict.HURTS]
    if not hurting or not allowed("reviewer"):
        return
    if chosen.id != latest.id:
        st.caption(f"{len(hurting)} of these hurt, but version #{chosen.number} is no longer the latest "
                   f"(#{latest.number} is): measure the latest version, or delete by hand below.")
        return
    label = (f"Remove the experience that hurts ({hurting[0]})" if len(hurting) == 1
             else f"Remove the {len(hurting)} experiences that hurt ({', '.join(hurting)})")
    st.button(label, key="lib_remove_hurting", icon=":material/delete_sweep:", on_click=_on_remove_hurting,
              args=(chosen.id,), help="Creates a new version without them, audited like a manual edit.")


def draw_measure_form(chosen: VersionInfo, data: PageData, ctx: Context, busy: bool) -> None:
    """The measurement's settings, what it would take (shown before starting) and the start button."""
    splits = [AUTO_SPLIT, *sorted(data.splits)]
    keep_valid_choice("lib_measure_split", splits)
    names = {AUTO_SPLIT: "validation if the task has one, else test"}
    c1, c2, c3 = st.columns(3)
    c1.selectbox("Split", splits, key="lib_measure_split",
                 format_func=lambda s: names.get(s, f"{s} ({data.splits.get(s, 0)} queries)"))
    c2.number_input("k (samples per query)", value=2, min_value=1, step=1, key="lib_measure_k")
    c3.number_input("Queries limit (0 = all)", value=0, min_value=0, step=1, key="lib_measure_limit")
    try:
        est = attribution.estimate(engine(), ctx.task, str(chosen.number), library_name=ctx.library, **measure_settings())
    except StudioError as exc:
        st.error("This version cannot be measured: " + message_markdown(exc))
        return
    st.info(plain(f"Estimate: {attribution.estimate_line(est)}."))
    if est["note"]:
        st.warning(plain(f"Note: {est['note']}."))
    st.button("Start measuring", key="lib_measure_start", type="primary", on_click=_on_measure, args=(chosen.id,),
              disabled=busy, help="Queues the measurement; a worker evaluates every variant.")


@st.fragment(run_every=2)
def measure_progress(version_id: int, run_id: int) -> None:
    """A measurement that is not over: its status and progress, redrawn every two seconds; when it completes,
    the whole page is drawn again so that the effects show."""
    run = next((r for r in attribution.attribution_runs(engine(), version_id) if r.id == run_id), None)
    if run is None:
        return
    if run.status == JobStatus.COMPLETED:
        st.rerun()
    shown = job_health(run.status, run.heartbeat_at)
    p = attribution.measurement_progress(engine(), run_id)
    now = ""
    if p["current"]:
        which = "the whole version" if p["current"] == attribution.FULL else f"without {p['current']}"
        now = f" · now {which}: {p['rollouts_done']}/{p['rollouts_total']} rollouts"
    st.caption(f"Measurement run {run_id}: {status_label(run.status, run.heartbeat_at)} · variants "
               f"{p['variants_done']}/{p['variants_total']}{now} · {p['calls']} model calls "
               f"(cache hits {p['cache_hits']}) · ${p['cost']:.4f}")
    if shown == JobStatus.STALLED:
        st.warning(f"The worker executing run {run_id} stopped beating. Resume it to queue it again "
                   "(finished variants are kept).")
    if run.error:
        show_long(run.error, f"lib_measure_error_{run_id}")
    if not allowed("reviewer"):
        return
    offered = [(label, key, icon, change, done) for label, key, icon, change, done, statuses in (
        ("Resume", "lib_measure_resume", ":material/play_arrow:", resume_run, "queued again", PERSON_MAY_RESUME),
        ("Cancel", "lib_measure_cancel", ":material/stop:", cancel_attribution, "cancelled", PERSON_MAY_CANCEL))
        if shown in statuses]
    for column, (label, key, icon, change, done) in zip(st.columns([1, 1, 4])[:len(offered)], offered, strict=True):
        column.button(label, key=key, icon=icon, on_click=_on_measure_request, args=(change, run_id, f"Run {run_id} {done}"))


def draw_measure(data: PageData, chosen: VersionInfo, ctx: Context) -> None:
    """Measure experiences: each experience's effect once measured, the measurement under way, and a new one."""
    st.subheader("Measure experiences", anchor=False)
    FLASH.show("measure")
    if not chosen.experiences:
        st.caption(f"Version #{chosen.number} has no experiences to measure.")
        return
    effects = attribution.experience_effects(engine(), chosen.id)
    if effects:
        draw_effects(chosen, effects, data.latest)
    else:
        st.caption(f"The experiences of version #{chosen.number} have not been measured yet. Measuring evaluates "
                   "the version and, for each experience, the version without it, on the same queries.")
    runs = attribution.attribution_runs(engine(), chosen.id)
    active = next((r for r in runs if r.status in UNFINISHED or r.status == JobStatus.FAILED), None)
    if active is not None and (not effects or active.id > next(iter(effects.values())).run_id):
        measure_progress(chosen.id, active.id)
    if allowed("reviewer"):
        with st.expander("Measure again" if effects else "Measure this version", expanded=not effects):
            draw_measure_form(chosen, data, ctx, busy=active is not None and active.status in UNFINISHED)


def draw_selection(data: PageData, ctx: Context) -> None:
    """Which entries each prompt shows (set by a reviewer), and the entries a typed query would be shown."""
    st.header("Entries per query", anchor=False)
    FLASH.show("selection")
    st.caption(f"Each prompt shows {data.selection.describe()}. Runs, evaluations and measurements made from now on "
               "use this; the HTTP API's selection route gives a live agent the same entries for its query.")
    if allowed("reviewer"):
        with st.form("lib_selection_form"):
            left, right = st.columns(2)
            left.radio("Selection", list(SelectionMode), index=list(SelectionMode).index(data.selection.mode),
                       format_func=MODE_NAMES.get, key="lib_selection_mode")
            right.number_input("k (entries per query when choosing)", min_value=1, max_value=MAX_K,
                               value=data.selection.k, step=1, key="lib_selection_k")
            st.form_submit_button("Save selection", key="lib_selection_submit", on_click=_on_selection)
    draw_coverage(data)
    query = st.text_input("Try a query", key="lib_selection_query",
                          help=f"The entries of the latest version (#{data.latest.number}) this query would be shown.")
    if not query.strip():
        return
    with Session(engine()) as session:
        served = served_selection(session, ctx.task, ctx.library, query=query, version=str(data.latest.number))
    if not served.entries:
        st.caption(f"Version #{served.number} is empty: the query is shown no entries.")
        return
    table([{"id": e["id"], "BM25": e["score"], "entry": e["text"]} for e in served.entries],
          key="lib_selection_preview", column_config={"BM25": st.column_config.NumberColumn(format="%.3f")})
    fillers = [str(e["id"]) for e in served.entries if e["score"] == 0]
    if fillers:
        st.caption(f"{', '.join(fillers)} share{'s' if len(fillers) == 1 else ''} no word with the query (BM25 "
                   f"0.000): fewer than k entries matched, so the library's first entries fill the k places, as "
                   "the agent would be shown them.")


def draw_coverage(data: PageData) -> None:
    """What the latest version covers: the train references whose query is shown an example stating its facts."""
    if data.coverage is None or data.latest is None:
        return
    line = f"Version #{data.latest.number}: {data.coverage.line().removeprefix('coverage: ')}."
    if data.coverage.counted and data.coverage.uncovered:
        st.warning(f"Coverage. {line}", icon=":material/rule:")
    else:
        st.caption(f"Coverage. {line}")


def draw_diff(data: PageData, newest_first: list[int]) -> None:
    st.header("Diff", anchor=False)
    latest = data.latest
    left, right = st.columns(2)
    with left:
        old_id = version_select("From version", "lib_diff_from", newest_first, data,
                                default=latest.parent_id if latest.parent_id in data.by_id else latest.id)
    with right:
        new_id = version_select("To version", "lib_diff_to", newest_first, data, default=latest.id)
    old, new = data.by_id[old_id], data.by_id[new_id]
    changes = library_diff(old.experiences, new.experiences)
    if not changes and [e["id"] for e in old.experiences] == [e["id"] for e in new.experiences]:
        st.info(f"No differences between version #{old.number} and version #{new.number}.")
        return
    if changes:
        table(changes, columns=["change", "id", "kind", "before", "after"], key="lib_diff_table")
    else:
        st.caption("Same experiences, in a different order.")
    show_long(unified_diff(old, new), f"lib_diff_{old.id}_{new.id}", language="diff")


def draw_edits(data: PageData) -> None:
    st.header("Edit the library", anchor=False)
    latest = data.latest
    st.session_state[EDIT_BASE_KEY] = latest.id  # what the forms below change; a newer version refuses the edit
    st.caption(f"Each change creates a new version on top of the latest one (#{latest.number}).")
    FLASH.show("edit")
    ids = [exp["id"] for exp in latest.experiences]
    if latest.experiences:
        show_long(experience_lines(latest.experiences), f"lib_edit_{latest.id}")
    add_tab, edit_tab, delete_tab, merge_tab = st.tabs(["Add", "Edit", "Delete", "Merge"])
    with add_tab, st.form("lib_add_form"):
        st.text_area("New experience", key="lib_add_text", height=100)
        st.radio("Kind", list(KIND_LABELS.values()), horizontal=True, key="lib_add_kind",
                 help=f"A lesson: a short general rule (at most {MAX_WORDS} words). A worked example: a problem in "
                      f"brief, the steps to its answer and the answer (at most {EXAMPLE_MAX_WORDS} words); the agent "
                      "reads examples apart from the lessons.")
        st.text_input("Note (optional)", key="lib_add_note")
        st.form_submit_button("Add experience", key="lib_add_submit", on_click=_on_add)
    with edit_tab:
        if not ids:
            st.caption("The latest version has no experiences to edit.")
        else:
            exp_id = st.selectbox("Experience to edit", ids, key="lib_edit_id")
            current = next(exp["text"] for exp in latest.experiences if exp["id"] == exp_id)
            with st.form("lib_edit_form"):
                st.text_area("New text", value=current, key=f"lib_edit_text_{exp_id}", height=100)
                st.text_input("Note (optional)", key="lib_edit_note")
                st.form_submit_button("Save edit", key="lib_edit_submit", on_click=_on_edit, args=(exp_id,))
    with delete_tab:
        if not ids:
            st.caption("The latest version has no experiences to delete.")
        else:
            with st.form("lib_delete_form"):
                st.multiselect("Experiences to delete", ids, key="lib_delete_ids")
                st.text_input("Note (optional)", key="lib_delete_note")
                st.form_submit_button("Delete experiences", key="lib_delete_submit", on_click=_on_delete)
    with merge_tab:
        if len(ids) < 2:
            st.caption("Merging needs at least two experiences in the latest version.")
        else:
            with st.form("lib_merge_form"):
                st.multiselect("Experiences to merge", ids, key="lib_merge_ids")
                st.text_area("Merged text", key="lib_merge_text", height=100)
                st.text_input("Note (optional)", key="lib_merge_note")
                st.form_submit_button("Merge experiences", key="lib_merge_submit", on_click=_on_merge)


def draw_revert(data: PageData, newest_first: list[int]) -> None:
    st.header("Revert", anchor=False)
    FLASH.show("revert")
    older = newest_first[1:]
    if not older:
        st.caption("There is no older version to revert to.")
        return
    version_select("Revert to version", "lib_revert_version", older, data)
    st.button("Revert to this version", key="lib_revert_button", on_click=_on_revert,
              help="Creates a new version with the content of the chosen one; history is kept.")


def draw_labels(data: PageData, newest_first: list[int]) -> None:
    st.header("Labels", anchor=False)
    FLASH.show("label")
    if data.label_rows:
        table(data.label_rows, key="lib_labels_table", column_config={"moved at": DATETIME})
    else:
        st.caption("No labels yet.")
    left, right = st.columns(2)
    with left:
        st.text_input("Label", value="production", key="lib_label_name")
    with right:
        chosen = version_select("Version for the label", "lib_label_version", newest_first, data)
    name = (st.session_state.get("lib_label_name") or "").strip()
    if name == core_versions.PRODUCTION and PROMOTE.pending() == chosen:
        PROMOTE.draw(chosen, f"#{data.by_id[chosen].number}")
        return
    st.button("Move label", key="lib_label_button", on_click=_on_move_label,
              help="production opens the Promote dialog first: the diff against production and the comparison.")


def draw_export(data: PageData, newest_first: list[int], ctx: Context) -> None:
    st.header("Export", anchor=False)
    left, right = st.columns(2)
    with left:
        fmt = st.radio("Format", list(FORMATS), format_func=FORMATS.get, key="lib_export_format", horizontal=True)
    with right:
        chosen = data.by_id[version_select("Version to export", "lib_export_version", newest_first, data)]
    # version_json_meta reads only .id and .number, which VersionInfo has (no database object kept).
    text = core_versions.export_version(chosen.experiences, fmt,
                                        meta=core_versions.version_json_meta(data.task, chosen), task=data.task)
    show_long(text, f"lib_export_{chosen.id}_{fmt}", empty="(the version is empty: nothing to paste)")
    st.download_button("Download", data=text, file_name=export_file_name(data.task.name, ctx.library,
                                                                          chosen.number, fmt),
                       mime=EXTENSIONS[fmt][1], key="lib_export_download", on_click="ignore")


def draw_import() -> None:
    st.header("Import", anchor=False)
    st.caption("A Markdown or text list (one experience per line) or JSON; it becomes a new version that "
               "replaces the current content.")
    FLASH.show("import")
    uploaded = st.file_uploader("Library file", type=["md", "json", "txt"], key="lib_import_file")
    st.button("Import", key="lib_import_button", on_click=_on_import, args=(uploaded,),
              disabled=uploaded is None)


def page() -> None:
    st.title("Library")
    ctx, _task = require_task()
    data = load(ctx)
    if not data.library_exists or not data.versions:
        st.info("This task has no library of the name chosen in the sidebar yet; importing a file creates it.")
        draw_import()
        return
    newest_first = [v.id for v in reversed(data.versions)]
    draw_versions(data)
    draw_text(data, newest_first, ctx)
    draw_selection(data, ctx)
    draw_diff(data, newest_first)
    if allowed("reviewer"):
        draw_edits(data)
        draw_revert(data, newest_first)
        draw_labels(data, newest_first)
    else:
        role_note("reviewer", "editing the library, reverting it and moving labels")
    draw_export(data, newest_first, ctx)
    if allowed("reviewer"):
        draw_import()


run_page(page)

"""Library: the versions of the sidebar's library, their text, a diff between any two, manual edits,
revert, labels, export and import.

Versions are immutable: every change here goes through `core.versions` and appends a new version
(the actor is the sidebar's reviewer). Reads go through `storage.queries`. Experience texts are
written by a model or a person, so they are shown only with `show_text`, in tables, or in a diff block.

Actions run in button callbacks, before the page is drawn, so every table already shows their result;
their outcome is kept in session state and shown once beside the section that caused it.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import streamlit as st
from sqlmodel import Session

from core import versions as core_versions
from core.library import ProposedOp
from core.library import diff as library_diff
from core.library_io import LibraryFormatError
from pages._common import (
    DATETIME,
    Context,
    Flash,
    Outcome,
    allowed,
    context,
    engine,
    experience_lines,
    failed,
    require_task,
    role_note,
    run_page,
    show_text,
)
from storage import queries

FLASH = Flash("library_flash")
FORMATS = {"md": "Markdown", "json": "JSON", "prompt": "System prompt"}
EXTENSIONS = {"md": ("md", "text/markdown"), "json": ("json", "application/json"), "prompt": ("txt", "text/plain")}
# Selections that should follow the newest version after a change (their defaults are recomputed).
FOLLOW_LATEST_KEYS = ("lib_text_version", "lib_diff_from", "lib_diff_to", "lib_label_version",
                      "lib_export_version", "lib_revert_version")


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
                "id": v.id, "number": v.number,
                "parent": numbers.get(v.parent_id) if v.parent_id is not None else None,
                "source": v.source, "created by": creator(v, steps), "note": v.note, "size": len(v.experiences),
                "labels": ", ".join(sorted(labels_by_version.get(v.id, []))), "created at": v.created_at})
        data.rows.reverse()
        data.label_rows = [{"label": label.name, "version": numbers.get(label.version_id),
                            "version id": label.version_id, "moved by": label.moved_by, "moved at": label.moved_at}
                           for label in sorted(labels, key=lambda item: item.name)]
    return data


def version_option(version: VersionInfo | None) -> str:
    """A version as the selectboxes name it (stable, so a kept selection still matches after a change)."""
    return f"#{version.number} (id {version.id})" if version else "?"


def unified_diff(old: VersionInfo, new: VersionInfo) -> str:
    lines = difflib.unified_diff(experience_lines(old.experiences).splitlines(),
                                 experience_lines(new.experiences).splitlines(),
                                 fromfile=f"version #{old.number}", tofile=f"version #{new.number}", lineterm="")
    return "\n".join(lines)


def export_file_name(task_name: str, library_name: str, number: int, fmt: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", f"{task_name} {library_name}".lower()).strip("-") or "library"
    return f"{slug}-v{number}.{EXTENSIONS[fmt][0]}"


# ---------------------------------------------------------------------------------------------- actions
# Each takes its inputs explicitly and returns an Outcome; all writing is done by core.versions.


def apply_edit(ops: list[ProposedOp], note: str = "", ctx: Context | None = None) -> Outcome:
    """A manual change as a new version; an invalid operation (duplicate, too short, unknown id) writes nothing."""
    ctx = ctx or context()
    try:
        version = core_versions.edit_library(engine(), ctx.task, ops, ctx.reviewer, library_name=ctx.library,
                                             note=note)
    except Exception as exc:  # noqa: BLE001  (shown to the person; the transaction was rolled back)
        return failed(exc)
    return Outcome(True, f"Created version #{version.number} (id {version.id}).")


def revert(version_id: int, ctx: Context | None = None) -> Outcome:
    """A new version with the content of an older one."""
    ctx = ctx or context()
    try:
        version = core_versions.revert_to(engine(), ctx.task, version_id, ctx.reviewer, library_name=ctx.library)
    except Exception as exc:  # noqa: BLE001
        return failed(exc)
    return Outcome(True, f"Created version #{version.number} (id {version.id}): {version.note}.")


def move_label(name: str, version_id: int, ctx: Context | None = None) -> Outcome:
    """Point a label (e.g. `production`) at a version."""
    ctx = ctx or context()
    try:
        core_versions.set_label(engine(), ctx.task, version_id, name, ctx.reviewer, library_name=ctx.library)
    except Exception as exc:  # noqa: BLE001
        return failed(exc)
    return Outcome(True, f"The label now points at version id {version_id}.")


def import_upload(filename: str, data: bytes, ctx: Context | None = None) -> Outcome:
    """An uploaded Markdown, JSON or text file as a new version; a bad or undecodable file writes nothing."""
    ctx = ctx or context()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Outcome(False, "Cannot import this file: it is not UTF-8 text. Nothing was written. "
                              "Save it as UTF-8 Markdown, JSON or plain text and try again.",
                       detail=f"{filename}: {exc}")
    try:
        version = core_versions.import_library(engine(), ctx.task, text, filename, library_name=ctx.library,
                                               actor=ctx.reviewer)
    except LibraryFormatError as exc:
        return Outcome(False, "Cannot import this file: it holds no experiences in a format this studio reads. "
                              "Nothing was written.", detail=str(exc))
    except Exception as exc:  # noqa: BLE001
        return failed(exc)
    return Outcome(True, f"Imported {len(version.experiences)} experiences as version #{version.number} "
                         f"(id {version.id}).")


# ---------------------------------------------------------------------------------------------- callbacks


def _flash(section: str, outcome: Outcome) -> None:
    FLASH.set(section, outcome)
    if outcome.ok:
        stale = [key for key in st.session_state if str(key).startswith("lib_edit_text_")]
        for key in (*FOLLOW_LATEST_KEYS, *stale):
            st.session_state.pop(key, None)


def _on_add() -> None:
    text = st.session_state.get("lib_add_text", "")
    outcome = apply_edit([ProposedOp("ADD", text=text)], st.session_state.get("lib_add_note", ""))
    if outcome.ok:
        st.session_state["lib_add_text"] = ""
        st.session_state["lib_add_note"] = ""
    _flash("edit", outcome)


def _on_edit(exp_id: str) -> None:
    text = st.session_state.get(f"lib_edit_text_{exp_id}", "")
    _flash("edit", apply_edit([ProposedOp("MODIFY", [exp_id], text)], st.session_state.get("lib_edit_note", "")))


def _on_delete() -> None:
    ids = list(st.session_state.get("lib_delete_ids") or [])
    outcome = apply_edit([ProposedOp("DELETE", ids)], st.session_state.get("lib_delete_note", ""))
    if outcome.ok:
        st.session_state["lib_delete_ids"] = []
    _flash("edit", outcome)


def _on_merge() -> None:
    ids = list(st.session_state.get("lib_merge_ids") or [])
    text = st.session_state.get("lib_merge_text", "")
    outcome = apply_edit([ProposedOp("MERGE", ids, text)], st.session_state.get("lib_merge_note", ""))
    if outcome.ok:
        st.session_state["lib_merge_ids"] = []
        st.session_state["lib_merge_text"] = ""
    _flash("edit", outcome)


def _on_revert() -> None:
    _flash("revert", revert(st.session_state["lib_revert_version"]))


def _on_move_label() -> None:
    _flash("label", move_label(st.session_state.get("lib_label_name", ""), st.session_state["lib_label_version"]))


def _on_import(uploaded: Any) -> None:
    if uploaded is None:
        _flash("import", Outcome(False, "Choose a file first."))
        return
    _flash("import", import_upload(uploaded.name, uploaded.getvalue()))


# ---------------------------------------------------------------------------------------------- drawing


def version_select(label: str, key: str, ids: list[int], data: PageData, default: int | None = None) -> int:
    index = ids.index(default) if default in ids else 0
    return st.selectbox(label, ids, index=index, key=key, format_func=lambda i: version_option(data.by_id.get(i)))


def draw_versions(data: PageData) -> None:
    st.header("Versions", anchor=False)
    st.dataframe(pd.DataFrame(data.rows), hide_index=True, key="lib_versions_table",
                 column_config={"created at": DATETIME, "parent": st.column_config.NumberColumn(format="%d")})


def draw_text(data: PageData, newest_first: list[int]) -> None:
    st.header("Experiences of a version", anchor=False)
    chosen = data.by_id[version_select("Version", "lib_text_version", newest_first, data)]
    if chosen.experiences:
        show_text(experience_lines(chosen.experiences))
    else:
        st.caption(f"Version #{chosen.number} is empty: the agent runs without experiences.")


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
        st.dataframe(pd.DataFrame(changes, columns=["change", "id", "before", "after"]), hide_index=True,
                     key="lib_diff_table")
    else:
        st.caption("Same experiences, in a different order.")
    st.code(unified_diff(old, new), language="diff", wrap_lines=True)


def draw_edits(data: PageData) -> None:
    st.header("Edit the library", anchor=False)
    latest = data.latest
    st.caption(f"Each change creates a new version on top of the latest one (#{latest.number}).")
    FLASH.show("edit")
    ids = [exp["id"] for exp in latest.experiences]
    if latest.experiences:
        show_text(experience_lines(latest.experiences))
    add_tab, edit_tab, delete_tab, merge_tab = st.tabs(["Add", "Edit", "Delete", "Merge"])
    with add_tab, st.form("lib_add_form"):
        st.text_area("New experience", key="lib_add_text", height=100)
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
        st.dataframe(pd.DataFrame(data.label_rows), hide_index=True, key="lib_labels_table",
                     column_config={"moved at": DATETIME})
    else:
        st.caption("No labels yet.")
    left, right = st.columns(2)
    with left:
        st.text_input("Label", value="production", key="lib_label_name")
    with right:
        version_select("Version for the label", "lib_label_version", newest_first, data)
    st.button("Move label", key="lib_label_button", on_click=_on_move_label)


def draw_export(data: PageData, newest_first: list[int], ctx: Context) -> None:
    st.header("Export", anchor=False)
    left, right = st.columns(2)
    with left:
        fmt = st.radio("Format", list(FORMATS), format_func=FORMATS.get, key="lib_export_format", horizontal=True)
    with right:
        chosen = data.by_id[version_select("Version to export", "lib_export_version", newest_first, data)]
    # version_json_meta reads only .id and .number, which VersionInfo has (no database object kept).
    text = core_versions.export_version(chosen.experiences, fmt,
                                        meta=core_versions.version_json_meta(data.task, chosen))
    show_text(text, empty="(the version is empty: nothing to paste)")
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
    draw_text(data, newest_first)
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

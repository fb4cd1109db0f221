"""Display helpers for text and tables that came from a model, a dataset or a person.

Not a page (ui/, not pages/). Three rules, one place each:

- long text shows its first SHOWN_CHARS characters, and all of it only when asked (`show_long`);
- tables go through `table`, whose cells are clipped and made safe for a spreadsheet, and whose missing values
  (None, NaN, NaT: st.dataframe draws them as the word None) show as MISSING, "—";
- our own CSV downloads go through `csv_download`, with the same spreadsheet rule and full cells.

Names and other short user text inside Markdown (headings, expander labels) go through
ui.common.plain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st

from core.domain.code_runs import code_runs, is_code_run
from core.domain.conversation import SPEAKERS
from core.domain.datasets import spreadsheet_safe

SHOWN_CHARS = 4_000
ELLIPSIS = "…"
MISSING = "—"  # a table cell without a value: never None, nan or NaT
# A DatetimeColumn's moment.js format tokens, as strftime writes them (the formats the pages use).
_MOMENT_TOKENS = (("YYYY", "%Y"), ("MM", "%m"), ("DD", "%d"), ("HH", "%H"), ("mm", "%M"), ("ss", "%S"))


def show_long(text: str | None, key: str, *, empty: str = "(empty)", language: str | None = None,
              limit: int = SHOWN_CHARS) -> None:
    """Model or user text, verbatim as code (never Markdown), clipped to `limit` characters unless the
    person turns on "Show all": a 1 MB reply would otherwise go to every browser that opens the page.

    `key` names the toggle; it must be unique on the page (e.g. "rollout_12_response").
    """
    if not text or len(text) <= limit:
        st.code(text if text else empty, language=language, wrap_lines=True)
        return
    whole = st.toggle(f"Show all {len(text):,} characters", key=f"show_all_{key}")
    st.code(text if whole else clip(text, limit), language=language, wrap_lines=True)
    if not whole:
        st.caption(f"The first {limit:,} of {len(text):,} characters.")


def show_turns(messages: list[dict], key: str) -> None:
    """The agent's side of the conversation (after the system prompt and the query), each turn clipped like
    show_long; tool output is marked as such. `key` prefixes the turns' toggles."""
    turns = list(messages[2:]) if len(messages) >= 2 else list(messages)
    if not turns:
        st.caption("No model turn was recorded.")
    for index, message in enumerate(turns):
        role = str(message.get("role", "?"))
        content = str(message.get("content", ""))
        if role == "user" and (is_code_run(message) or content.startswith("Code output:")):  # the old form too
            role = "user (tool output)"
        st.caption(role if role in ("assistant", "user", "user (tool output)", "system", "tool") else "message")
        show_long(content, f"{key}_turn_{index}")


def show_code_runs(messages: list[dict], key: str) -> None:
    """The code a python-mode agent ran in the jail and the output it really printed, each run under a line
    with its exit status and seconds, code and output verbatim as code (st.code: never Markdown or HTML), so a
    reader sees what the model was told rather than what it might have invented. Draws nothing for a rollout
    without runs; uses no expander, so it fits inside one. `key` prefixes the toggles."""
    for index, run in enumerate(code_runs(messages)):
        st.caption(f"Code run {index + 1} · {run.status()} · {run.seconds:.2f} s")
        show_long(run.code, f"{key}_code_{index}", language="python", empty="(no code)")
        st.caption(f"Output of run {index + 1}")
        show_long(run.output, f"{key}_code_output_{index}", empty="(no output)")


def chat_turns(messages: list[dict]) -> list[dict]:
    """A conversation rollout's turns from its stored messages (the agent's request: the system prompt first,
    then the user's and the agent's turns alternating): the messages after the system prompt, so turn i here
    is turn i of core's rule results (0-based)."""
    return [m for index, m in enumerate(messages) if not (index == 0 and m.get("role") == "system")]


def speaker(role: str) -> str:
    """`User` (the simulated customer) or `Agent`, as core.domain.conversation renders a transcript."""
    return SPEAKERS.get(role, "Message")


def show_chat(messages: list[dict], key: str, *, under_turn: Callable[[int], None] | None = None) -> None:
    """A conversation as a chat transcript: each turn labelled "Turn N · User" or "Turn N · Agent", its text
    verbatim as code, clipped like show_long (never Markdown or HTML). `under_turn(i)` draws below turn i
    (0-based), e.g. a rule that failed there. `key` prefixes the turns' toggles."""
    turns = chat_turns(messages)
    if not turns:
        st.caption("No turn was recorded.")
    for index, turn in enumerate(turns):
        role = str(turn.get("role", "?"))
        st.caption(f"Turn {index + 1} · {speaker(role)}")
        last_user = role == "user" and index == len(turns) - 1 and index > 0
        show_long(str(turn.get("content") or ""), f"{key}_chat_{index}",
                  empty="(left the conversation)" if last_user else "(empty message)")
        if under_turn is not None:
            under_turn(index)


def clip(text: str, limit: int = SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + ELLIPSIS


def safe_cell(value: Any) -> Any:
    """A table cell as shown: text clipped to SHOWN_CHARS and made spreadsheet-safe; anything else as it is."""
    return spreadsheet_safe(clip(value)) if isinstance(value, str) else value


def safe_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with every text cell passed through safe_cell (numbers and dates keep their types).

    Why escape the displayed cells rather than switch the table's own "Download as CSV" off: that
    download (Streamlit 1.67) writes the cells as shown, unescaped, and the only switch,
    client.disableDataExport, is global, also removes copying to the clipboard, and is documented by
    Streamlit as no security control. Escaping the cells makes the download and the clipboard safe
    alike, for every table drawn through `table`; a formula-like cell shows with its leading apostrophe,
    the spreadsheet mark for "this is text".
    """
    safe = frame.copy()
    for column in safe.columns:
        values = safe[column]
        if not (pd.api.types.is_numeric_dtype(values) or pd.api.types.is_datetime64_any_dtype(values)):
            safe[column] = values.map(safe_cell)
    return safe


def table(data: pd.DataFrame | list[dict], *, columns: list[str] | None = None, **kwargs: Any) -> None:
    """st.dataframe (index hidden) of model or user text through safe_frame, missing values shown as MISSING
    (shown_missing); kwargs go to st.dataframe."""
    frame = data if isinstance(data, pd.DataFrame) else pd.DataFrame(data, columns=columns)
    kwargs.setdefault("hide_index", True)
    frame, kwargs["column_config"] = shown_missing(frame, kwargs.get("column_config"))
    st.dataframe(safe_frame(frame), **kwargs)


def shown_missing(frame: pd.DataFrame, column_config: dict | None) -> tuple[pd.DataFrame, dict]:
    """The frame with MISSING in every cell without a value, and the column configuration to draw it with.

    st.dataframe draws a missing value as the word None, which reads as data. A column with a missing value
    becomes text: its numbers and times written with the format its NumberColumn or DatetimeColumn gave (a text
    column cannot take those), the others as they are. Columns without a missing value are not touched."""
    frame, config = frame.copy(), dict(column_config or {})
    for column in frame.columns:
        values = frame[column]
        missing = values.isna().tolist()
        if not any(missing):
            continue
        given = config.get(column)
        settings = given if isinstance(given, dict) else {}
        fmt = (settings.get("type_config") or {}).get("format")
        write = _writer(values, fmt)
        frame[column] = [MISSING if gap else write(value) for value, gap in zip(values.tolist(), missing, strict=True)]
        if write is not _as_it_is:
            config[column] = st.column_config.TextColumn(settings.get("label") or (given if isinstance(given, str)
                                                                                   else None),
                                                         help=settings.get("help"), width=settings.get("width"),
                                                         alignment="right")
    return frame, config


def _as_it_is(value: Any) -> Any:
    return value


def _writer(values: pd.Series, fmt: str | None) -> Callable[[Any], Any]:
    """How a column's present values are written once the column is text."""
    if pd.api.types.is_bool_dtype(values):
        return _as_it_is
    if pd.api.types.is_numeric_dtype(values):
        if fmt and "%" in fmt:
            return lambda value: fmt % value
        return lambda value: str(int(value)) if float(value).is_integer() else f"{value:.6g}"
    if pd.api.types.is_datetime64_any_dtype(values):
        pattern = fmt or "YYYY-MM-DD HH:mm"
        for token, directive in _MOMENT_TOKENS:
            pattern = pattern.replace(token, directive)
        return lambda value: value.strftime(pattern)
    return _as_it_is


def csv_text(frame: pd.DataFrame) -> str:
    """The whole frame as CSV (cells not clipped), every text cell spreadsheet-safe."""
    return frame.map(spreadsheet_safe).to_csv(index=False)


def csv_download(frame: pd.DataFrame, label: str, file_name: str, key: str) -> None:
    """A download button for the frame as a spreadsheet-safe CSV (see csv_text)."""
    st.download_button(label, data=csv_text(frame), file_name=file_name, mime="text/csv", key=key,
                       on_click="ignore")


def tab_stop(label: str, note: str, key: str) -> None:
    """A harmless stop in the tab order, drawn right after a text field that comes before buttons that decide
    (a reason before Approve, a comment before the score keys, a reason before Decide): a collapsed expander
    with a short note. Tab out of the field lands on its summary, where Enter only opens it, instead of on
    the first deciding button, where Enter decided what the text was typed against. Shortcut keys still act
    from it. `key` must be unique on the page (name the item, e.g. "review_reason_stop_12")."""
    with st.expander(label, expanded=False, key=key):
        st.caption(note)

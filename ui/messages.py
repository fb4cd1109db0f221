"""How a message of core (an error, a refusal, a warning, a job's reason) reads on a page.

core writes each message once, for every face, and names a version by its number (#3) on every face. The CLI
prints it in a terminal, where a command in backticks (`python -m core eval --retry ID`) reads as a command. On a
page a backtick is Markdown: escaped for a Markdown element (ui.common.plain) or drawn by a widget that shows text as it is (st.code, a table cell, an
option's label), it shows literally. So a page shows a message of core through one of these two:

- `message_markdown`, for a Markdown element (st.error, st.warning, st.info, st.success, st.toast, st.caption):
  each `code` span becomes inline code (its content shown as it is), everything else is escaped, so names and
  quoted file content show as typed, never as emphasis, links or HTML;
- `message_text`, for a widget that shows text as it is: each `code` span between “ and ”.

Model output never goes through either (a flag quoting an experience, a learner's reason, a model's reply): it is text, shown through
ui.common.plain or as code, and its backticks are its own.

Not a page (pages/ holds only pages); imports nothing of the studio, so ui.common can use it.
"""

from __future__ import annotations

import re

CODE_SPAN = re.compile(r"`([^`\n]+)`")  # a command or a name as core quotes it: `python -m core task personas`
MARKDOWN = re.compile(r"([\\`*_\[\]<>#|~$])")  # the one escaping rule: ui.common.plain calls escaped


def escaped(text: str) -> str:
    """Text for a Markdown element, shown as typed (ui.common.plain is this rule)."""
    return MARKDOWN.sub(r"\\\1", str(text))


def message_markdown(message: object) -> str:
    """A message of core for a Markdown element: its `code` spans as inline code, the rest escaped."""
    text, parts, start = str(message), [], 0
    for span in CODE_SPAN.finditer(text):
        parts += [escaped(text[start:span.start()]), f"`{span.group(1)}`"]
        start = span.end()
    return "".join([*parts, escaped(text[start:])])


def message_text(message: object) -> str:
    """A message of core for a widget that shows text as it is: its `code` spans between “ and ”."""
    return CODE_SPAN.sub(r"“\1”", str(message))

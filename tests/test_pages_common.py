"""Display helpers shared by the pages."""

from __future__ import annotations

from pages._common import plain


def test_plain_keeps_markdown_and_html_from_core_messages_inert():
    message = "no task named '**boss** [click](http://x) <script>' `rm` $x$ under_score"
    escaped = plain(message)
    assert "**" not in escaped.replace("\\*", "") and "[click]" not in escaped and "<script>" not in escaped
    assert escaped.replace("\\", "") == message.replace("\\", "")  # nothing lost, only escaped

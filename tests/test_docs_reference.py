"""The manual's reference pages are what the code generates now (scripts/docs_reference.py): the command line
from its parser, the HTTP API from its OpenAPI document, the settings from core/settings.py. A command, a route
or a setting changed without regenerating them fails here, as simonw/llm's docs/help.md does under cog."""

from __future__ import annotations

import pytest

from scripts import docs_reference


@pytest.mark.parametrize("name", sorted(docs_reference.PAGES))
def test_the_committed_reference_page_is_what_the_code_generates(name):
    committed = (docs_reference.REFERENCE / name).read_text(encoding="utf-8")
    assert committed == docs_reference.PAGES[name](), (
        f"docs/reference/{name} is stale: run `PYTHONPATH=. .venv/bin/python scripts/docs_reference.py`")


def test_the_command_reference_names_every_command_and_its_arguments():
    from core.cli import build_parser

    page = docs_reference.cli_page()
    for name, _help, sub in docs_reference.subcommands(build_parser()):
        assert f"## `python -m core {name}`" in page
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in page or f", {option}" in page, (name, option)


def test_a_changed_setting_makes_the_settings_page_stale(monkeypatch):
    from core.settings import Settings

    before = docs_reference.settings_page()
    field = Settings.model_fields["concurrency"]
    monkeypatch.setattr(field, "description", "a changed meaning")
    assert docs_reference.settings_page() != before
    assert "a changed meaning" in docs_reference.settings_page()

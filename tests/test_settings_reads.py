"""Every environment variable the studio reads is read in core/settings.py (issue 30): a reader who wants to
know what configures the studio finds all of it there. Elsewhere the environment is only passed on whole to
a child process (the worker, the API) or written (the CLI's --api-base, litellm's offline price map)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.errors import InvalidInput
from core.settings import get_settings

ROOT = Path(__file__).resolve().parent.parent
READS = re.compile(r"os\.getenv\(|os\.environ\.get\(|os\.environ\.items\(|os\.environ\[[^\]]+\](?!\s*=[^=])")
OWNER = ROOT / "core" / "settings.py"


def studio_modules() -> list[Path]:
    files = [ROOT / "streamlit_app.py"]
    for folder in ("core", "storage", "api", "pages"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return files


def test_only_core_settings_reads_the_environment():
    readers = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
               for path in studio_modules() if path != OWNER
               for number, line in enumerate(path.read_text().splitlines(), 1) if READS.search(line)]
    assert readers == []


def test_the_check_would_find_a_read():
    assert READS.search('key = os.environ.get("OPENAI_API_KEY")')
    assert READS.search('x = os.environ["TFGRPO_MODEL"]')
    assert not READS.search('os.environ["STUDIO_API_BASE"] = api_base')


@pytest.mark.parametrize(("variable", "value"), [("TFGRPO_DB_POOL_SIZE", "abc"), ("TFGRPO_DB_POOL_SIZE", "0"),
                                                 ("TFGRPO_DB_MAX_OVERFLOW", "-1"), ("TFGRPO_CONCURRENCY", "2.5")])
def test_a_setting_that_cannot_be_used_is_refused_by_its_variable(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    get_settings.cache_clear()
    try:
        with pytest.raises(InvalidInput, match=f"{variable} .*got '{re.escape(value)}'"):
            get_settings()
    finally:
        get_settings.cache_clear()

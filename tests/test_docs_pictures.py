"""The manual's pictures stay in step with the studio: every page of the app has a tour page with its picture,
taken by `make screenshots` (docs/screenshots.py); every picture names a page that exists or a moment a tour page
shows; and no tour page describes a page the app no longer has. Cheap: it reads files, it opens no browser."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PICTURES = DOCS / "screenshots"


def app_pages() -> set[str]:
    """The file stems of the pages `streamlit_app.py` navigates to (pages/review.py -> review)."""
    text = (ROOT / "streamlit_app.py").read_text(encoding="utf-8")
    return set(re.findall(r'st\.Page\("pages/([a-z_]+)\.py"', text))


def moments() -> dict[str, str]:
    """docs/screenshots.py's MOMENTS: a picture of a moment -> the page whose tour shows it."""
    tree = ast.parse((DOCS / "screenshots.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "MOMENTS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("docs/screenshots.py has no MOMENTS")


def shot_names() -> set[str]:
    """The names docs/screenshots.py photographs (`shoot(page, url, "name", ...)`)."""
    return set(re.findall(r'shoot(?:_in_app)?\(page, [^\n]*?, "([a-z-]+)"', (DOCS / "screenshots.py").read_text(encoding="utf-8")))


def tour_pages() -> set[str]:
    return {path.stem for path in (DOCS / "tour").glob("*.md")} - {"index"}


def test_the_app_has_pages_to_check():
    assert {"overview", "review", "library"} <= app_pages()


def test_every_page_of_the_app_has_a_tour_page_with_its_picture():
    missing_tour = sorted(app_pages() - tour_pages())
    assert not missing_tour, f"pages without a tour page in docs/tour/: {missing_tour}"
    no_picture = sorted(page for page in app_pages()
                        if f"](../screenshots/{page}.png)" not in (DOCS / "tour" / f"{page}.md").read_text())
    assert not no_picture, f"tour pages that do not show their page's picture: {no_picture}"
    not_taken = sorted(app_pages() - shot_names())
    assert not not_taken, f"pages docs/screenshots.py does not photograph: {not_taken}"
    not_on_disk = sorted(page for page in app_pages() if not (PICTURES / f"{page}.png").exists())
    assert not not_on_disk, f"pictures missing from docs/screenshots/ (run make screenshots): {not_on_disk}"


def test_every_picture_names_a_page_that_exists_or_a_moment_its_tour_shows():
    known = app_pages() | set(moments())
    strays = sorted(path.name for path in PICTURES.glob("*.png") if path.stem not in known)
    assert not strays, f"pictures of no page of the app and no moment: {strays}"
    for moment, page in moments().items():
        assert page in app_pages(), f"moment {moment} belongs to {page}, which the app no longer has"
        assert moment in shot_names(), f"docs/screenshots.py does not photograph the moment {moment}"
        assert (PICTURES / f"{moment}.png").exists(), f"docs/screenshots/{moment}.png is missing"
        assert f"](../screenshots/{moment}.png)" in (DOCS / "tour" / f"{page}.md").read_text(), (
            f"docs/tour/{page}.md does not show the moment {moment}")


def test_no_tour_page_describes_a_page_the_app_no_longer_has():
    gone = sorted(tour_pages() - app_pages())
    assert not gone, f"tour pages of pages the app no longer has: {gone}"

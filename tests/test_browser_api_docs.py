"""The HTTP API's documentation in a real browser with the network blocked: /docs draws its scripts and
styles from the API itself (fastapi-offline), so it works on a machine without internet."""

from __future__ import annotations

import pytest

from tests.api_support import api_server
from tests.browser_support import browser_page, require_chromium, screenshot

pytestmark = pytest.mark.browser


def test_the_api_docs_render_with_every_outside_request_blocked(engine):
    require_chromium()
    outside: list[str] = []

    def block(route):
        outside.append(route.request.url)
        route.abort()

    with api_server(engine) as base, browser_page() as page:
        page.route(lambda url: not url.startswith(base) and not url.startswith("data:"), block)
        page.goto(f"{base}/docs")
        page.locator(".swagger-ui .info .title").filter(has_text="Training-Free GRPO studio").wait_for()
        page.get_by_text("/v1/traces").first.wait_for()  # the routes are listed: the schema loaded
        screenshot(page, "api-docs")
    assert outside == [], outside

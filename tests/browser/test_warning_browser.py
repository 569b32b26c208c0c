"""The warning page in Chromium: another site cannot frame it (its two clicks to
"continue anyway" were once reachable through an invisible frame), and its
Content-Security-Policy still lets its own style through."""

from __future__ import annotations

import pytest

from urlguard.hotpath.guard import reset_guard
from urlguard.models import ShortLink
from urlguard.writepath.changes import add_rule

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def warned(live_server, build_filter):
    """The URL of a short link whose destination is listed."""
    add_rule("framed-prize.example/", category="phishing", source="test")
    ShortLink.objects.create(slug="framed", destination="https://framed-prize.example/win")
    build_filter()
    reset_guard()
    yield f"{live_server.url}/framed"
    reset_guard()


def test_another_site_cannot_frame_the_warning_page(page, warned):
    refused = []
    page.on("console", lambda message: refused.append(message.text))
    # A page of another origin (about:blank's is opaque) frames the short link.
    page.set_content(f'<iframe id="f" src="{warned}" width="600" height="400"></iframe>')
    page.wait_for_timeout(300)
    page.wait_for_load_state("load")
    frame = page.frame_locator("#f")
    assert frame.locator("text=continue anyway").count() == 0
    assert any("frame" in text.lower() for text in refused), refused


def test_the_policy_lets_the_pages_own_style_through(page, warned):
    violations = []
    page.on("console", lambda message: violations.append(message.text))
    response = page.goto(warned)
    assert response.status == 403
    assert "Content-Security-Policy" in {name.title() for name in response.headers}
    # .card.danger has a 0.4rem top border in the inline style sheet (none unstyled).
    border = page.evaluate(
        "getComputedStyle(document.querySelector('.card.danger')).borderTopWidth"
    )
    assert float(border.removesuffix("px")) >= 5
    assert not [v for v in violations if "Content Security Policy" in v], violations

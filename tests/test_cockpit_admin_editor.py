"""Issue 12, the admin scenario editor: the most edited parts first (the values with their
synonyms, the rules, the actions), the rarely edited ones folded; a saved form still
round-trips unchanged with the sections moved. Persona: root (superuser)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.admin_helpers import admin_client
from tests.test_admin_scenarios import change_url


@pytest.fixture
def root(builtin: None) -> Client:
    return admin_client(User.objects.create_superuser("root", password="pw-for-tests"))


def headings(html: str) -> list[str]:
    return [
        re.sub(r"<[^>]+>", "", h).strip() for h in re.findall(r"<h2[^>]*>(.*?)</h2>", html, re.S)
    ]


def test_the_most_edited_sections_come_first_and_the_rest_is_folded(root: Client) -> None:
    html = root.get(change_url()).content.decode()
    order = headings(html)

    def at(prefix: str) -> int:
        return next(i for i, h in enumerate(order) if h.startswith(prefix))

    assert at("Values of enum and bool fields") < at("Risk rules") < at("Fields (the checklist")
    assert at("Fields (the checklist") < at("Report template")
    # Folded: <details> around the rarely edited sections; the most edited stay open.
    for folded in ("Fields (the checklist", "Report template", "Compliance state machine"):
        assert folded_at(html, html.index(folded)), folded
    for open_ in ("Values of enum and bool fields", "Risk rules", "Required actions"):
        assert not folded_at(html, html.index(open_)), open_


def folded_at(html: str, index: int) -> bool:
    return html.rfind("<details", 0, index) > html.rfind("</details>", 0, index)

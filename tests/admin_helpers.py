"""Admin tests submit what the page shows, as a browser would: every input, select and
textarea of the change form, then change only what the test is about."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

from django.contrib.auth.models import Permission, User
from django.test import Client


class _FormParser(HTMLParser):
    def __init__(self, form_id: str) -> None:
        super().__init__()
        self.form_id = form_id
        self.inside = False
        self.data: dict[str, Any] = {}
        self._select: str | None = None
        self._textarea: str | None = None
        self._options: list[tuple[str, bool]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and a.get("id") == self.form_id:
            self.inside = True
        if not self.inside:
            return
        name = a.get("name")
        if tag == "input" and name:
            kind = a.get("type", "text")
            if kind in ("checkbox", "radio"):
                if "checked" in a:
                    self._add(name, a.get("value", "on"))
            elif kind not in ("submit", "button", "file"):
                self._add(name, a.get("value", ""))
        elif tag == "select" and name:
            self._select, self._options = name, []
        elif tag == "option" and self._select is not None:
            self._options.append((a.get("value", ""), "selected" in a))
        elif tag == "textarea" and name:
            self._textarea = name
            self.data[name] = ""

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self.data[self._textarea] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self.inside:
            self.inside = False
        elif tag == "select" and self._select is not None:
            chosen = [v for v, selected in self._options if selected]
            if chosen:
                self._add(self._select, chosen[0])
            elif self._options:
                self._add(self._select, self._options[0][0])
            self._select = None
        elif tag == "textarea" and self._textarea is not None:
            # Browsers drop the one newline that follows <textarea>, and submit CRLF.
            text = self.data[self._textarea].removeprefix("\n")
            self.data[self._textarea] = text.replace("\r\n", "\n").replace("\n", "\r\n")
            self._textarea = None

    def _add(self, name: str, value: str) -> None:
        if name in self.data:
            existing = self.data[name]
            self.data[name] = (
                [*existing, value] if isinstance(existing, list) else [existing, value]
            )
        else:
            self.data[name] = value


def form_data(html: str, form_id: str) -> dict[str, Any]:
    parser = _FormParser(form_id)
    parser.feed(html)
    assert parser.data, f"no form #{form_id} on the page"
    return parser.data


def row_prefix(data: dict[str, Any], prefix: str, column: str, value: str) -> str:
    """The form prefix ("draft_rules-3") of the inline row whose `column` is `value`."""
    total = int(data[f"{prefix}-TOTAL_FORMS"])
    for i in range(total):
        if data.get(f"{prefix}-{i}-{column}") == value:
            return f"{prefix}-{i}"
    raise AssertionError(f"no {prefix} row with {column}={value!r}")


def add_row(data: dict[str, Any], prefix: str, **values: Any) -> str:
    total = int(data[f"{prefix}-TOTAL_FORMS"])
    for column, value in values.items():
        data[f"{prefix}-{total}-{column}"] = value
    data[f"{prefix}-TOTAL_FORMS"] = str(total + 1)
    return f"{prefix}-{total}"


def admin_client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def staff_with(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username=username, password="pw-for-tests", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user

"""The interface in zh-hans and en: every template string goes through translate, every
catalogue entry has its Chinese, zh-hans is what a user gets without choosing, the switch
is remembered per user (applied at sign-in), <html lang> follows, times carry date and
zone, scenario texts follow the language, and the live fragments speak the page's
language. The suite's other tests read English (tests/settings.py); these switch."""

from __future__ import annotations

import io
import re
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import translation
from django.utils.translation.template import templatize

import aero.settings as product_settings
from aero.i18n import SESSION_KEY
from aero.models import UserPreference
from aero.roles import user_roles
from diagnosis import presenters
from diagnosis.live_render import render_updates
from diagnosis.models import Event, Session
from tests.web_helpers import STAND_FUEL_LEAK, approval_for, login, waiting_session

ROOT = Path(settings.BASE_DIR)
# The core's templates and the packs' own (packs/<pack>/templates): a pack's part of a
# page speaks the reader's language as the core's does.
TEMPLATE_DIRS = [ROOT / "templates", *sorted((ROOT / "packs").glob("*/templates"))]
TEMPLATES = sorted(path for folder in TEMPLATE_DIRS for path in folder.rglob("*.html"))
# Markdown templates (the replay export): their strings go through translate as well;
# `makemessages -e html,txt,py,md` collects them (its defaults skip .md).
MARKDOWN_TEMPLATES = sorted(path for folder in TEMPLATE_DIRS for path in folder.rglob("*.md"))
CATALOGUE = ROOT / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po"

# What may stay as it is in a template: the product's name and units.
NOT_WORDS = {"AERO", "ms", "id", "sha"}
TEXT_ATTRIBUTES = ("title", "placeholder", "aria-label", "alt", "data-confirm")
TAG = re.compile(r"<[^>]+>")


def untranslated(source: str) -> list[str]:
    """English words a template shows outside translate/blocktranslate: in text nodes
    and in the attributes people read. Template variables are data (a title, a name),
    <code>/<pre> hold machine text (a command, a hash)."""
    s = re.sub(r"\{% comment %\}.*?\{% endcomment %\}", "", source, flags=re.S)
    s = re.sub(r"\{#.*?#\}", "", s, flags=re.S)
    s = re.sub(r"\{% blocktranslate.*?\{% endblocktranslate %\}", "", s, flags=re.S)
    s = re.sub(r"\{% translate .*?%\}", "", s)
    s = re.sub(r"\{\{.*?\}\}", "", s, flags=re.S)
    s = re.sub(r"\{%.*?%\}", "", s, flags=re.S)
    s = re.sub(r"<(code|pre|script|style)\b[^>]*>.*?</\1>", "", s, flags=re.S)
    words: list[str] = []
    for tag in TAG.findall(s):
        for attribute in TEXT_ATTRIBUTES:
            for value in re.findall(rf'\s{attribute}="([^"]*)"', tag):
                words += re.findall(r"[A-Za-z]{2,}", value)
        if tag.startswith("<input") and 'type="submit"' in tag:
            for value in re.findall(r'\svalue="([^"]*)"', tag):
                words += re.findall(r"[A-Za-z]{2,}", value)
    words += re.findall(r"[A-Za-z]{2,}", TAG.sub(" ", s))
    return [w for w in words if w not in NOT_WORDS]


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_template_string_goes_through_translate(path: Path) -> None:
    assert untranslated(path.read_text()) == []


def test_the_check_finds_a_string_left_untranslated() -> None:
    assert untranslated('<p class="muted">{% translate "Saved" %} Nothing new</p>') == [
        "Nothing",
        "new",
    ]
    assert untranslated('<input placeholder="Your answer">') == ["Your", "answer"]
    assert untranslated("{% blocktranslate %}Hello {{ who }}{% endblocktranslate %}") == []


PLURALS: set[str] = set()


def catalogue() -> dict[tuple[str | None, str], list[str]]:
    """msgctxt/msgid -> msgstr(s) of the zh_Hans .po, with fuzzy entries marked."""
    entries: dict[tuple[str | None, str], list[str]] = {}
    for block in CATALOGUE.read_text(encoding="utf-8").split("\n\n")[1:]:
        fields: dict[str, str] = {}
        current = ""
        for line in block.splitlines():
            found = re.match(r'(msgctxt|msgid|msgid_plural|msgstr(?:\[\d\])?) "(.*)"$', line)
            if found:
                current = found.group(1)
                fields[current] = found.group(2)
            elif line.startswith('"') and current:
                fields[current] += line[1:-1]
        if "msgid" not in fields:
            continue
        strs = [v for k, v in fields.items() if k.startswith("msgstr")]
        if "#, fuzzy" in block or ", fuzzy" in block:
            strs = []
        entries[(fields.get("msgctxt"), fields["msgid"])] = strs
        if "msgid_plural" in fields:  # the plural form is looked up by the singular
            PLURALS.add(fields["msgid_plural"])
    return entries


def test_every_catalogue_entry_has_its_chinese() -> None:
    missing = [key for key, strs in catalogue().items() if not strs or not all(strs)]
    assert missing == []


def template_messages(source: str) -> set[str]:
    """The msgids `makemessages` extracts from a template (via the same templatize)."""
    code = templatize(source)
    found = set()
    # templatize writes gettext(u'…') and ngettext(u'…', u'…', n)
    for call in re.findall(r"\bn?gettext\(((?:\s*u?'(?:[^'\\]|\\.)*'\s*,?)+)", code):
        found.update(re.findall(r"u?'((?:[^'\\]|\\.)*)'", call))
    return found


def test_the_catalogue_holds_every_template_string() -> None:
    """A string added to a template without `makemessages` (and its Chinese) shows in
    English to Chinese users: listed here instead."""
    known = {msgid.replace('\\"', '"') for _context, msgid in catalogue()} | PLURALS
    absent = [
        f"{path.name}: {message}"
        for path in [*TEMPLATES, *MARKDOWN_TEMPLATES]
        for message in sorted(template_messages(path.read_text()))
        if message.replace("\\'", "'") not in known
    ]
    assert absent == []


def test_zh_hans_is_the_product_default() -> None:
    assert product_settings.LANGUAGE_CODE == "zh-hans"
    assert ("zh-hans", "简体中文") in product_settings.LANGUAGES


@pytest.mark.services
def test_without_a_choice_the_interface_is_chinese_whatever_the_browser_says(
    alice: User,
) -> None:
    client = login(alice)
    with override_settings(LANGUAGE_CODE=product_settings.LANGUAGE_CODE):
        page = client.get(reverse("diagnosis:session-list"), HTTP_ACCEPT_LANGUAGE="en-US,en")
    html = page.content.decode()
    assert '<html lang="zh-Hans">' in html
    assert ">会话</a>" in html and ">机场状态</a>" in html and "退出" in html
    assert "Sign out" not in html and ">Sessions<" not in html


@pytest.mark.services
def test_the_switch_is_remembered_for_the_user_and_applied_at_sign_in(alice: User) -> None:
    first = login(alice)
    with override_settings(LANGUAGE_CODE="zh-hans"):
        response = first.post(reverse("set-language"), {"language": "en", "next": "/sessions/"})
        assert response.status_code == 302 and response["Location"] == "/sessions/"
        assert UserPreference.objects.get(user=alice).language == "en"
        page = first.get(reverse("diagnosis:session-list")).content.decode()
        assert '<html lang="en">' in page and ">Sessions</a>" in page

        # Another workstation, no cookie: signing in applies her choice.
        elsewhere = Client()
        elsewhere.force_login(alice)
        assert elsewhere.session[SESSION_KEY] == "en"
        page = elsewhere.get(reverse("diagnosis:session-list")).content.decode()
        assert '<html lang="en">' in page and "Sign out" in page

        # Back to Chinese, and it sticks as well.
        elsewhere.post(reverse("set-language"), {"language": "zh-hans", "next": "/sessions/"})
        assert UserPreference.objects.get(user=alice).language == "zh-hans"
        third = Client()
        third.force_login(alice)
        page = third.get(reverse("diagnosis:session-list")).content.decode()
        assert '<html lang="zh-Hans">' in page and "退出" in page


@pytest.mark.services
def test_a_choice_made_on_the_sign_in_page_becomes_the_users_preference(alice: User) -> None:
    client = Client()
    with override_settings(LANGUAGE_CODE="zh-hans"):
        assert "登录" in client.get(reverse("login")).content.decode()
        client.post(reverse("set-language"), {"language": "en", "next": reverse("login")})
        assert "Sign in to AERO" in client.get(reverse("login")).content.decode()
        assert not UserPreference.objects.filter(user=alice).exists()
        signed_in = client.post(reverse("login"), {"username": "alice", "password": "pw-for-tests"})
        assert signed_in.status_code == 302
        assert UserPreference.objects.get(user=alice).language == "en"
        assert "Sign out" in client.get(reverse("diagnosis:session-list")).content.decode()


@pytest.mark.services
def test_an_unknown_language_is_refused_and_changes_nothing(alice: User) -> None:
    client = login(alice)
    response = client.post(reverse("set-language"), {"language": "klingon", "next": "/"})
    assert response.status_code == 400
    assert response.content.decode() == "Unknown language."
    assert not UserPreference.objects.filter(user=alice).exists()
    assert SESSION_KEY not in client.session
    # GET never switches (a link or an image could otherwise change it)
    assert client.get(reverse("set-language"), {"language": "en"}).status_code == 405
    assert not UserPreference.objects.filter(user=alice).exists()


@pytest.mark.services
def test_the_switch_never_redirects_off_site(alice: User) -> None:
    response = login(alice).post(
        reverse("set-language"), {"language": "en", "next": "https://evil.example/"}
    )
    assert response.status_code == 302 and response["Location"] == "/"


@pytest.fixture
def zh(alice: User) -> Client:
    client = login(alice)
    client.post(reverse("set-language"), {"language": "zh-hans", "next": "/"})
    return client


@pytest.mark.services
def test_session_page_in_chinese_with_plain_words_and_dates_with_zone(
    builtin: None, alice: User, zh: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The whole timeline on the page: its first line is read below.
    monkeypatch.setattr(presenters, "SESSION_PAGE_EVENTS", presenters.TIMELINE_PAGE)
    session = waiting_session(alice)
    page = zh.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert '<html lang="zh-Hans">' in page
    for chinese in ("已知信息", "处置措施", "时间线", "风险", "影响范围", "显示智能体内部步骤"):
        assert chinese in page
    # scenario texts in the page's language: the field label and the scenario name
    assert "航班号" in page and "漏油" in page
    # plain words, the code in a tooltip
    assert '<strong title="HIGH">高</strong>' in page
    assert 'title="P1">必填<' in page
    assert 'title="dispatch_cleanup_crew">派遣清污队<' in page
    # the scenario by its name, the model call's provider, purpose and outcome in words
    assert 'title="oil_spill">alice 创建了会话（机坪漏油 第 1 版）<' in page
    assert 'title="offline">离线模型<' in page and 'title="extract">读取事实<' in page
    assert 'title="ok">已应答<' in page
    # the opening time with date and zone (Asia/Shanghai)
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d CST", page)
    for english in ("What is known", "Response actions", "Timeline", "Waiting for approvals"):
        assert english not in page


@pytest.mark.services
@pytest.mark.parametrize(
    ("persona", "name", "chinese"),
    [
        ("alice", "diagnosis:session-list", "新事件"),
        ("alice", "approvals:todo-list", "人工待办"),
        ("alice", "airport:board", "机场状态看板"),
        ("bob", "approvals:queue", "审批队列"),
        ("carol", "audit", "审计日志"),
        ("carol", "replay:history", "历史"),
        ("alice", "api-tokens:list", "您的令牌"),
    ],
)
def test_pages_speak_chinese(
    builtin: None, persona: str, name: str, chinese: str, request: pytest.FixtureRequest
) -> None:
    user: User = request.getfixturevalue(persona)
    client = login(user)
    client.post(reverse("set-language"), {"language": "zh-hans", "next": "/"})
    page = client.get(reverse(name)).content.decode()
    assert '<html lang="zh-Hans">' in page and chinese in page
    visible = re.sub(
        r"<[^>]+>", " ", re.sub(r"<(script|style|code)\b.*?</\1>", "", page, flags=re.S)
    )
    for english in ("Sessions", "Sign out", "Filter", "Status", "Approve", "Airport status"):
        assert not re.search(rf"\b{english}\b", visible), english


@pytest.mark.services
def test_live_fragments_speak_the_language_of_the_page(builtin: None, alice: User) -> None:
    session = waiting_session(alice)
    roles = user_roles(alice)
    chinese = render_updates(roles, session.pk, 0, None, "zh-hans")
    english = render_updates(roles, session.pk, 0, None, "en")
    assert chinese is not None and english is not None
    assert "建议：" in chinese.html and "Proposed:" not in chinese.html
    assert "Proposed:" in english.html
    # the page tells the socket its language
    page = login(alice).get(reverse("diagnosis:session-detail", args=[session.pk])).content
    assert b"&amp;lang=en" in page
    assert translation.get_language() == settings.LANGUAGE_CODE  # nothing leaked


@pytest.mark.services
def test_session_list_shows_date_and_zone(builtin: None, alice: User) -> None:
    session: Session = waiting_session(alice)
    page = login(alice).get(reverse("diagnosis:session-list")).content.decode()
    local = session.created_at.astimezone(ZoneInfo("Asia/Shanghai"))
    assert local.strftime("%Y-%m-%d %H:%M:%S CST") in page


@pytest.mark.services
def test_a_refusal_is_worded_in_the_users_language(builtin: None, alice: User, bob: User) -> None:
    session = waiting_session(alice)
    approval = approval_for(session, "dispatch_cleanup_crew", position="105")
    client = login(bob)
    client.post(reverse("set-language"), {"language": "zh-hans", "next": "/"})
    response = client.post(
        reverse("approvals:decide", args=[approval.pk]),
        {"decision": "reject", "digest": approval.digest, "next": "queue"},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "驳回必须填写理由。" in page and "A rejection needs a reason." not in page
    approval.refresh_from_db()
    assert approval.status == "pending"  # nothing decided


@pytest.mark.services
def test_the_json_api_answers_in_english_whatever_the_default(alice: User) -> None:
    client = login(alice)
    client.post(reverse("set-language"), {"language": "zh-hans", "next": "/"})
    with override_settings(LANGUAGE_CODE="zh-hans"):
        response = client.get("/api/v1/no-such-thing")
    assert response.status_code in (401, 404)
    assert response["Content-Language"] == "en"
    assert settings.LANGUAGE_COOKIE_NAME not in response.cookies  # her choice stays


def test_admin_help_texts_and_approval_states_speak_chinese() -> None:
    """Model help texts and choice labels are UI text too (the admin forms, the queue):
    a string there that is not in the catalogue shows in English to Chinese admins."""
    from django.apps import apps

    from approvals.models import ApprovalStatus

    same_in_both = {"0-100"}  # a range reads the same in either language
    english: list[str] = []
    for model in apps.get_app_config("scenarios_admin").get_models():
        for field in model._meta.get_fields():
            help_text = getattr(field, "help_text", "")
            if not help_text or str(help_text) in same_in_both:
                continue
            with translation.override("zh-hans"):
                chinese = str(help_text)
            with translation.override("en"):
                if chinese == str(help_text):
                    english.append(f"{model.__name__}.{field.name}: {help_text}")
    assert english == []
    with translation.override("zh-hans"):
        assert ApprovalStatus.CANCELED.label == "未经决定即关闭"
        assert ApprovalStatus.PENDING.label == "待审批"


# --- every word in the reader's language (issue 34) ----------------------------------

# Latin words a Chinese page may show: names and codes every reader uses as they are.
LATIN_ALLOWED = {
    "AERO",
    "ATC",
    "FOD",
    "CST",
    "API",
    "YAML",
    "JSON",
    "CSV",
    "HTTP",
    "HTTPS",
    "URL",
    "LLM",
    "ReAct",
    "MCP",
    "git",
    "token",
    "tokens",
    "JavaScript",
    "Markdown",
    "HMAC",
    "SHA",
    "sha256",
    "admin",
    "Django",
    "UTC",
    "PostgreSQL",
    "Redis",
    "OpenAI",
    "IT",
    "English",  # the language switch names each language in itself
}
CJK_ALLOWED = {"简体中文"}
TEXT = re.compile(r">([^<]+)<")
# A word or a code (notify_atc): letters and underscores, 3 or more; not part of a flight
# number, an id, a path or an address (CA1234, OS-01, /admin/).
LATIN_WORD = re.compile(r"(?<![\w./:@-])[A-Za-z][A-Za-z_]{2,}(?![\w./:@-])")
CJK = re.compile(r"[\u3400-\u9fff]+")


def visible_text(html: str) -> str:
    """The text a reader sees: no scripts, styles, code samples or tag attributes (codes
    live in tooltips)."""
    html = re.sub(r"<(script|style|code|pre|textarea|select)\b.*?</\1>", " ", html, flags=re.S)
    # Quoted data in its own language (a log line, a past case written in one language):
    # <samp>, or <q>/<blockquote> that say their language.
    html = re.sub(r"<samp\b.*?</samp>", " ", html, flags=re.S)
    html = re.sub(r"<(q|blockquote)\b[^>]*\blang=[^>]*>.*?</\1>", " ", html, flags=re.S)
    return " ".join(m.group(1) for m in TEXT.finditer(html))


def foreign_words(html: str, language: str, quoted: tuple[str, ...]) -> list[str]:
    """Words of the other language outside what users wrote (`quoted`)."""
    text = visible_text(html)
    for quote in sorted(quoted, key=len, reverse=True):
        text = text.replace(quote, " ")
    # What the page quotes (the words a fact was read from: “105机位”) is the user's.
    text = re.sub(r"“[^”]*”|「[^」]*」", " ", text)
    if language == "en":
        return sorted(set(CJK.findall(text)) - CJK_ALLOWED)
    return sorted({w for w in LATIN_WORD.findall(text) if w not in LATIN_ALLOWED})


def test_the_word_check_finds_the_other_language() -> None:
    zh_page = '<p title="completed">已完成</p><td>notify_atc</td><td>Waiting for people</td>'
    en_page = (
        '<p>Completed</p><p>“还在持续漏”</p><p>已驳回</p><q lang="zh">连接池耗尽</q><q>未标语言</q>'
    )

    assert foreign_words(zh_page, "zh-hans", ()) == ["Waiting", "for", "notify_atc", "people"]
    assert foreign_words(en_page, "en", ("还在持续漏",)) == ["已驳回", "未标语言"]


@pytest.fixture
def every_kind_of_session(builtin: None, alice: User, bob: User) -> dict[str, Session]:
    """A session waiting for approvals, one concluded through the CLI (its report
    written), and a concluded IT diagnosis."""
    from django.core.management import call_command

    running = waiting_session(alice)
    call_command(
        "incident",
        "run",
        "--scenario",
        "oil_spill",
        "--message",
        STAND_FUEL_LEAK,
        "--decide",
        "approve",
        "--json",
        stdout=io.StringIO(),
    )
    concluded = Session.objects.get(status="completed", scenario__slug="oil_spill")
    login(alice).post(reverse("diagnosis_pack:new"), {"demo": "ex-pool-inventory"})
    diagnosis = Session.objects.get(scenario__kind="diagnosis")
    return {"running": running, "concluded": concluded, "diagnosis": diagnosis}


def every_page(sessions: dict[str, Session]) -> list[tuple[str, str, str]]:
    """(what, persona, path): every page, live fragment, report and export."""
    paths = [
        ("sessions", "alice", reverse("diagnosis:session-list")),
        ("to-dos", "alice", reverse("approvals:todo-list")),
        ("airport", "alice", reverse("airport:board")),
        ("approvals", "bob", reverse("approvals:queue")),
        ("audit", "carol", reverse("audit")),
        ("history", "carol", reverse("replay:history")),
    ]
    for kind, session in sessions.items():
        pk = session.pk
        paths += [
            (f"session {kind}", "alice", reverse("diagnosis:session-detail", args=[pk])),
            (f"timeline {kind}", "alice", reverse("diagnosis:session-events", args=[pk])),
            (f"replay {kind}", "carol", reverse("replay:replay-step", args=[pk])),
            (f"chain {kind}", "carol", reverse("replay:replay-chain", args=[pk])),
        ]
        if session.status == "completed":  # its report, as the page links it
            report = reverse("diagnosis:session-report", args=[pk])
            paths.append((f"report {kind}", "alice", report))
    return paths


def data_names() -> set[str]:
    """Proper nouns that are data, shown as they are in every language (docs/i18n.md): the
    airlines and the destination airports' codes of the airport's flights, and the IT
    system's service names. Each word of them, as the check reads words."""
    import yaml

    from packs.diagnosis.system import demo_shop

    airport = yaml.safe_load((ROOT / "packs" / "airport" / "data" / "airport.yaml").read_text())
    nouns = [f[key] for f in airport["flights"] for key in ("airline", "destination")]
    nouns += list(demo_shop().services)
    return {word for noun in nouns for word in LATIN_WORD.findall(str(noun))}


def test_data_names_are_the_airports_and_the_systems_proper_nouns() -> None:
    names = data_names()
    assert {"Air", "China", "ZBAA", "inventory"} <= names
    assert not names & {"fuel", "FUEL", "HIGH", "completed", "restart_service"}


@pytest.mark.services
@pytest.mark.parametrize("language", ["zh-hans", "en"])
def test_every_page_is_in_the_readers_language(
    every_kind_of_session: dict[str, Session],
    language: str,
    request: pytest.FixtureRequest,
) -> None:
    for persona in ("alice", "bob", "carol"):
        request.getfixturevalue(persona)
    quoted = tuple(
        str(text)
        for text in Event.objects.filter(type="user.message").values_list(
            "payload__text", flat=True
        )
    ) + tuple(s.title for s in every_kind_of_session.values())
    # Who did what is shown by username: names, not words; proper nouns that are data
    # likewise (docs/i18n.md).
    names = set(User.objects.values_list("username", flat=True)) | data_names()
    found: dict[str, list[str]] = {}
    for what, persona, path in every_page(every_kind_of_session):
        client = login(request.getfixturevalue(persona))
        client.post(reverse("set-language"), {"language": language, "next": "/"})
        response = client.get(path)
        assert response.status_code == 200, path
        body = response.content.decode()
        if not response["Content-Type"].startswith("text/html"):
            body = ">" + body.replace("<", " ") + "<"  # a download: all of it is text
        words = [w for w in foreign_words(body, language, quoted) if w not in names]
        if words:
            found[what] = words
    for kind, session in every_kind_of_session.items():
        alice = request.getfixturevalue("alice")
        update = render_updates(user_roles(alice), session.pk, 0, None, language)
        assert update is not None
        words = [w for w in foreign_words(update.html, language, quoted) if w not in names]
        if words:
            found[f"live {kind}"] = words

    report = "\n".join(f"{what}: {' '.join(words[:30])}" for what, words in found.items())
    assert found == {}, report

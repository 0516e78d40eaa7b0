"""Hostile strings, and a check that a page shows them as text: no element, attribute or
link they could have made, and every one of them readable where it was put."""

from __future__ import annotations

from html.parser import HTMLParser

from aero.text import neutralise_bidi

# Each must come out as typed (escaped) or be refused with a clear message.
INERT = {
    "script": "<script>window.__xss=1</script>",
    "event": '<img src=x onerror="window.__xss=2">',
    "md_js_link": "[click me](javascript:window.__xss=3)",
    "md_data_link": "[open](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "md_image": "![x](javascript:window.__xss=4)",
    "html_js_link": '<a href="javascript:window.__xss=5">link</a>',
    "form": '<form action="javascript:window.__xss=6"><button>go</button></form>',
    "svg": '<svg onload="window.__xss=7"><script>window.__xss=8</script></svg>',
    "css": '<div style="background:url(javascript:x);width:expression(alert(9))">css</div>',
    "table_break": "a | b | c\n| --- | --- |\n# heading",
    "autolink": "<javascript:window.__xss=10>",
    "rtl": "invoice\u202egnp.exe",
    "attribute_break": '" onmouseover="window.__xss=11" x="',
    "entities": "&lt;script&gt;window.__xss=12&lt;/script&gt;",
}
NUL = "before\x00after"
ONE_MB = "x" * (1024 * 1024)
# YAML a scenario import must refuse: anchors, aliases and an alias bomb.
YAML_ANCHOR = "slug: &s oil_spill\nname: {zh: *s, en: *s}\n"
YAML_BOMB = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
)
DANGEROUS_SCHEMES = ("javascript:", "data:", "vbscript:")


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []
        self.text: list[str] = []
        self.attr_text: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {name for name, _ in attrs}
        if tag == "script":
            self._in_script = True
            if "src" not in names:
                self.problems.append("an inline <script>")
        if tag in ("style", "iframe", "object", "embed", "img"):
            self.problems.append(f"a <{tag}> element")
        for name, value in attrs:
            value = value or ""
            self.attr_text.append(value)
            if name.startswith("on"):
                self.problems.append(f"<{tag} {name}=...>")
            if name == "style":
                self.problems.append(f"<{tag} style=...>")
            if name in ("href", "src", "action", "formaction", "xlink:href") and (
                value.strip().lower().startswith(DANGEROUS_SCHEMES)
            ):
                self.problems.append(f"<{tag} {name}={value[:40]!r}>")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():  # whitespace in a script runs nothing
            self.problems.append("script content")
        self.text.append(data)


def inert_problems(html: str) -> list[str]:
    """What in the page could run or load: inline scripts, event attributes, styles,
    dangerous URL schemes, elements no AERO page has."""
    page = _Page()
    page.feed(html)
    return page.problems


def page_text(html: str) -> str:
    """The text a reader sees (and form values), whitespace collapsed."""
    page = _Page()
    page.feed(html)
    return " ".join(" ".join([*page.text, *page.attr_text]).split())


def shown(value: str, html: str) -> bool:
    """The value is on the page as text (whitespace collapsed), its bidirectional
    controls as their code points (aero.text.neutralise_bidi)."""
    return " ".join(neutralise_bidi(value).split()) in page_text(html)

"""Report text: user and model text made literal in Markdown, codes that read as words,
and the Markdown rendered to sanitised HTML for a page."""

from __future__ import annotations

import re
from typing import Any

import markdown as md
import nh3

from aero.text import neutralise_bidi


def display_value(spec: dict[str, Any], value: Any, language: str) -> str:
    if value is None:
        return "—"
    if spec["type"] in ("enum", "bool"):
        key = str(value).lower() if isinstance(value, bool) else str(value)
        label = spec.get("values", {}).get(key, {}).get("label", {}).get(language)
        if label:
            return str(label)
    return str(value)


# --- Markdown escaping ---------------------------------------------------------------
# Characters Python-Markdown (with the tables extension) gives a meaning inline and lets
# a backslash escape. "(" and ")" need none once "[" and "]" are escaped: no link starts;
# "_" inside a word never makes emphasis (lookup_flight_plan stays readable).
_MD_SPECIAL = re.compile(r"([\\`*\[\]|#!{}>]|(?<![^\W_])_|_(?![^\W_]))")
# "<" has no backslash escape in Python-Markdown: the entity shows it as typed and no
# autolink or tag can start.
_MD_LT = re.compile(r"<")
# At the start of a line these make lists, rules or setext headings; the value may start
# one. Only "-"/"+" after spaces, or "." / ")" after digits: "2026-11-25" and a session's
# id ("85533151-3817-...") start no list and stay as typed in the export.
_MD_LINE_START = re.compile(r"^(\s*)([-+])|^(\s*\d+)([.)])")
_MD_SETEXT = re.compile(r"^(\s*)=")
# An entity reference would display as the character it names, not as typed.
_MD_ENTITY = re.compile(r"&(?=#?\w+;)")


def md_escape(text: Any) -> str:
    """User or model text made literal for inline Markdown: what was typed is what shows.
    Newlines stay newlines (a reason may have paragraphs) but each line is escaped."""
    lines = str(text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(_escape_line(line) for line in lines)


def md_cell(text: Any) -> str:
    """User or model text made literal inside one Markdown table cell (or one list item):
    line breaks become spaces, so the value cannot end the row or start a block."""
    return _escape_line(str(text).replace("\r\n", " ").replace("\r", " ").replace("\n", " "))


def _escape_line(line: str) -> str:
    line = line.replace("\x00", "\ufffd")
    # Bidirectional controls would reorder the text around the value: their code points.
    line = neutralise_bidi(line)
    line = _MD_ENTITY.sub("&amp;", line)
    line = _MD_SPECIAL.sub(r"\\\1", line)
    line = _MD_LT.sub("&lt;", line)
    line = _MD_SETEXT.sub(r"\1&#61;", line)
    return _MD_LINE_START.sub(_escape_marker, line)


def _escape_marker(match: re.Match[str]) -> str:
    lead, marker = (match[1], match[2]) if match[2] else (match[3], match[4])
    return f"{lead}\\{marker}"


class Worded(str):
    """A code in a report's context that shows as its words: comparisons in a template
    ({% if risk.level == "HIGH" %}) still see the code, the text reads the words."""

    words: str

    def __new__(cls, code: Any, words: Any) -> Worded:
        made = super().__new__(cls, str(code))
        made.words = str(words)
        return made

    def __html__(self) -> str:
        return md_cell(self.words)


class MdText(str):
    """A context string that Django's autoescaping renders Markdown-escaped (md_cell):
    comparisons in the report template ({% if x == "y" %}) still see the raw value."""

    def __html__(self) -> str:
        return md_cell(self)


def as_markdown_text(value: Any) -> Any:
    """Every string in a report context (nested dicts and lists too) wrapped as MdText."""
    if isinstance(value, MdText | Worded):
        return value
    if isinstance(value, str):
        return MdText(value)
    if isinstance(value, dict):
        return {k: as_markdown_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_markdown_text(v) for v in value]
    return value


# --- Markdown to HTML ----------------------------------------------------------------
# What a report may contain once rendered: Python-Markdown's output for the syntax we
# use (headings, lists, tables, emphasis, code, links), nothing that runs or loads.
ALLOWED_TAGS = {
    "a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6",
    "hr", "li", "ol", "p", "pre", "strong", "table", "tbody", "td", "th", "thead", "tr",
    "ul",
}  # fmt: skip
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "td": {"align"},
    "th": {"align"},
    "ol": {"start"},
}
# No javascript:, data: or vbscript:; relative links (no scheme) stay allowed, but not
# the scheme-relative "//host/..." (another site, whatever the page's scheme), nor its
# backslash spellings, which browsers read the same way.
ALLOWED_URL_SCHEMES = {"http", "https", "mailto"}


def _no_other_host(tag: str, attribute: str, value: str) -> str | None:
    if attribute == "href" and value.strip().replace("\\", "/").startswith("//"):
        return None
    return value


def sanitize_html(html: str) -> str:
    """nh3 (ammonia) with the lists above: any other tag is dropped (script and style with
    their content), event attributes and style never pass, links get rel=noopener."""
    return nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes=ALLOWED_URL_SCHEMES,
        link_rel="noopener noreferrer nofollow",
        attribute_filter=_no_other_host,
        strip_comments=True,
    )


def markdown_to_html(text: str) -> str:
    """Render report Markdown for the page: raw HTML in it is shown as text (not passed
    through), and the result is sanitised with nh3 whatever the Markdown produced, so a
    scenario template or an escaping slip still cannot put a script or a javascript:
    link on the page."""
    renderer = md.Markdown(extensions=["tables"])
    renderer.preprocessors.deregister("html_block")
    renderer.inlinePatterns.deregister("html")
    return sanitize_html(renderer.convert(text))

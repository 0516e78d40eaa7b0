"""The playbook's codes in words (hypotheses, the conditions that support one, the
sources a bundle may lack, the similar-case search's strategies): the session page, its
timeline and replay show these, the code in a tooltip. A code not listed here (a
playbook's own new hypothesis) shows as it is named."""

from __future__ import annotations

import functools
import re
from typing import Any

from django.utils.functional import Promise
from django.utils.translation import get_language, gettext, pgettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

from diagnosis.wording import TOOL_LABELS, plain
from packs.diagnosis.playbook_data import default_playbook

HYPOTHESIS_LABELS: dict[str, Promise] = {
    "db_primary_down": _("database primary down"),
    "cert_expired": _("certificate expired"),
    "disk_full": _("disk full"),
    "db_pool_exhausted": _("database connection pool exhausted"),
    "memory_leak": _("memory leak"),
    "bad_deploy": _("a bad deploy"),
    "bad_commit": _("a bad commit"),
    "config_change": _("a config change"),
    "upstream_degraded": _("a degraded upstream"),
    "unknown": pgettext_lazy("hypothesis", "unknown"),
}

CONDITION_LABELS: dict[str, Promise] = {
    "anomaly_on_service": _("its metrics are anomalous"),
    "callers_point_at_it": _("its callers' errors point at it"),
    "new_signature_on_service": _("a new error signature on it"),
    "state_finding": _("a bad state found"),
    "change_in_stack_or_message": _("a change named in the errors"),
    "change_by_time": _("a change just before"),
}

SOURCE_LABELS: dict[str, Promise] = {
    "logs": pgettext_lazy("evidence source", "logs"),
    "metrics": pgettext_lazy("evidence source", "metrics"),
    "changes": pgettext_lazy("evidence source", "changes"),
    "deploys": pgettext_lazy("evidence source", "deploys"),
    "config_changes": pgettext_lazy("evidence source", "config changes"),
    "repo": pgettext_lazy("evidence source", "code repository"),
    "commits": pgettext_lazy("evidence source", "the repository's commits"),
}

STRATEGY_LABELS: dict[str, Promise] = {
    "pg_fts+trgm": _("full text and trigrams"),
    "sqlite_fts5+trgm": _("full text and trigrams"),
    "words+trgm": _("words and trigrams"),
}


def label(table: dict[str, Promise], code: object) -> str:
    found = table.get(str(code))
    return str(found) if found is not None else str(code)


# The system's metrics by name (a name not listed shows as it is).
METRIC_LABELS: dict[str, Promise] = {
    "http_error_ratio": _("error ratio of requests"),
    "latency_p99_ms": _("p99 latency (ms)"),
    "log_errors_per_minute": _("logged errors a minute"),
    "db_connections_in_use": _("database connections in use"),
    "db_connections_max": _("database connections allowed"),
    "disk_used_ratio": _("share of the disk used"),
    "memory_rss_mb": _("memory in use (MB)"),
    "memory_limit_mb": _("memory limit (MB)"),
    "restarts": _("restarts"),
    "up": _("up"),
    "tls_cert_days_left": _("days left on the certificate"),
}

KIND_LABELS: dict[str, Promise] = {
    "service": pgettext_lazy("service kind", "a service"),
    "database": pgettext_lazy("service kind", "a database"),
    "cache": pgettext_lazy("service kind", "a cache"),
    "external": pgettext_lazy("service kind", "a third party's service"),
}


def _services(rows: list[dict[str, Any]], key: str = "service") -> str:
    names = dict.fromkeys(str(r.get(key, "")) for r in rows if isinstance(r, dict))
    return pgettext("list separator", ", ").join(n for n in names if n)


def evidence_summary(tool: str, result: Any) -> str:
    """What an evidence call found, in the reader's words, from its result's values (the
    log keeps the English `summary`); the logged summary for a tool not worded here.
    Names of the system (services, files) and the log's own lines stay as they are."""
    if not isinstance(result, dict):
        return ""
    sep = pgettext("list separator", ", ")
    if tool == "read_bundle":
        sources = result.get("sources") or {}
        held = [label(SOURCE_LABELS, s) for s, present in sources.items() if present]
        lacking = [label(SOURCE_LABELS, s) for s, present in sources.items() if not present]
        text = gettext("%(lines)s log lines, %(samples)s metric samples; sources: %(held)s") % {
            "lines": result.get("log_lines", 0),
            "samples": result.get("metric_rows", 0),
            "held": sep.join(held) or "—",
        }
        return text + (
            gettext("; lacking: %(sources)s") % {"sources": sep.join(lacking)} if lacking else ""
        )
    if tool == "log_signatures":
        return gettext("%(n)s error signatures, %(new)s new") % {
            "n": result.get("total", len(result.get("signatures") or [])),
            "new": result.get("new", 0),
        }
    if tool == "anomalies":
        rows = result.get("anomalies") or []
        text = gettext("%(n)s metric anomalies") % {"n": len(rows)}
        return text + (gettext(", on %(services)s") % {"services": _services(rows)} if rows else "")
    if tool == "log_search":
        return gettext("%(n)s log lines") % {"n": len(result.get("lines") or [])}
    if tool == "metric_query":
        return gettext("%(service)s: %(n)s samples") % {
            "service": result.get("service", ""),
            "n": result.get("samples", 0),
        }
    if tool in ("deploys", "config_changes"):
        rows = result.get("changes") or []
        text = gettext("%(n)s changes, %(in)s in the window") % {
            "n": len(rows),
            "in": result.get("in_window", 0),
        }
        return text + (gettext(", on %(services)s") % {"services": _services(rows)} if rows else "")
    if tool == "topology":
        none = pgettext("nobody", "none")
        return gettext("%(kind)s; called by %(callers)s; depends on %(deps)s") % {
            "kind": label(KIND_LABELS, result.get("kind", "")),
            "callers": sep.join(result.get("callers") or []) or none,
            "deps": sep.join(result.get("depends_on") or []) or none,
        }
    if tool == "code":
        return gettext("%(path)s:%(line)s changed in commit %(commit)s") % {
            "path": result.get("path", ""),
            "line": result.get("line", ""),
            "commit": str(result.get("commit", ""))[:10],
        }
    if tool == "similar_cases":
        return gettext("%(n)s similar past cases") % {"n": len(result.get("cases") or [])}
    return str(result.get("summary", ""))


@functools.cache
def _problem_types() -> dict[str, dict[str, str]]:
    return {
        k: {str(lang): text for lang, text in v.items()}
        for k, v in default_playbook().problem_types.items()
    }


def problem_type_label(code: str) -> str:
    """A problem type by the playbook's own zh/en label; the code when it has none."""
    lang = "zh" if (get_language() or "").startswith("zh") else "en"
    return _problem_types().get(code, {}).get(lang) or code


# The pack's steps' logged summaries (English, in the log) read back and worded.
_STEP_SUMMARIES = (
    (re.compile(r"^root cause: (?P<h>\w+)$"), "cause"),
    (re.compile(r"^proposed (?P<tool>\w+) \((?P<risk>R\d)\)$"), "proposed"),
    (re.compile(r"^(?P<n>\d+) fixes sent$"), "sent"),
    (re.compile(r"^(?P<n>\d+) specialists in parallel$"), "parallel"),
    (re.compile(r"^(?P<n>\d+) of (?P<of>\d+) specialists reported$"), "reported"),
    (re.compile(r"^(?P<n>\d+) calls planned$"), "planned"),
    (re.compile(r"^(?P<n>\d+) evidence calls$"), "calls"),
    (re.compile(r"^reported$"), "reported_one"),
    # An evidence call's summary repeated by the step that made it: the call's own line
    # says what it found, in words.
    (
        re.compile(
            r"^(\d+ (log lines|error signatures|metric anomalies|similar past cases|"
            r"config changes|deploys|changes)\b|\S+ \(\w+\): called by |\S+:\d+ changed by )"
        ),
        "evidence",
    ),
)


def step_summary(text: str) -> str | None:
    """One of the pack's steps' summaries in the reader's words; None for any other."""
    for pattern, kind in _STEP_SUMMARIES:
        found = pattern.match(text)
        if found is None:
            continue
        values = found.groupdict()
        if kind == "cause":
            return gettext("root cause: %(h)s") % {"h": label(HYPOTHESIS_LABELS, values["h"])}
        if kind == "proposed":
            return gettext("proposed %(tool)s (%(risk)s)") % {
                "tool": plain(TOOL_LABELS, values["tool"]),
                "risk": values["risk"],
            }
        if kind == "sent":
            return gettext("%(n)s fixes sent") % values
        if kind == "parallel":
            return gettext("%(n)s specialists in parallel") % values
        if kind == "reported":
            return gettext("%(n)s of %(of)s specialists reported") % values
        if kind == "planned":
            return gettext("%(n)s calls planned") % values
        if kind == "calls":
            return gettext("%(n)s evidence calls") % values
        if kind == "reported_one":
            return pgettext("specialist", "reported")
        return gettext("evidence read (its call above says what it found)")
    return None

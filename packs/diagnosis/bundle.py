"""Incident bundles: one incident's evidence as a folder (or a .zip / .tar.gz of one).

`open_bundle` checks everything a diagnosis reads before anything is created: a bad
bundle raises `BundleError` naming the file, line and field. Logs and metrics are
checked by DuckDB over the files (never loaded into Python row by row), so a bundle of a
million log lines is checked in about a second.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import duckdb
import yaml
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

INCIDENT = "incident.yaml"
LOGS = "logs.jsonl"
METRICS = "metrics.csv"
DEPLOYS = "deploys.yaml"
CONFIG_CHANGES = "config_changes.yaml"
REPO = "repo"
LEVELS = ("DEBUG", "INFO", "WARN", "ERROR")
MODES = ("react", "plan_execute", "hierarchical")
# An ISO 8601 timestamp with its offset: a time without one names no instant.
OFFSET_RE = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})$"


class BundleError(ValueError):
    """A bundle that cannot be read, with where: file, line (1-based) and field."""

    def __init__(self, file: str, message: str, *, line: int | None = None, field: str = ""):
        self.file, self.line, self.field, self.message = file, line, field, message
        where = file + (f" line {line}" if line else "") + (f", {field}" if field else "")
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 200 * 1024 * 1024  # unpacked
    max_log_lines: int = 2_000_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class Window(_Strict):
    start: AwareDatetime
    end: AwareDatetime


class Incident(_Strict):
    description: str = Field(min_length=1)
    reported_at: AwareDatetime
    id: str = ""
    title: str = ""
    problem_type: str = ""
    services: list[str] = []
    window: Window | None = None
    preferred_mode: Literal["react", "plan_execute", "hierarchical"] | None = None

    def window_bounds(self, minutes: int) -> tuple[datetime, datetime]:
        if self.window is not None:
            return self.window.start, self.window.end
        return self.reported_at - timedelta(minutes=minutes), self.reported_at


class Deploy(_Strict):
    id: str = Field(min_length=1)
    service: str = Field(min_length=1)
    version: str = ""
    at: AwareDatetime
    author: str = ""
    commit: str = ""
    files: list[str] = []
    description: str = ""


class ConfigChange(_Strict):
    id: str = Field(min_length=1)
    service: str = Field(min_length=1)
    key: str = Field(min_length=1)
    old: str | int | float | bool | None = None
    new: str | int | float | bool | None = None
    at: AwareDatetime
    author: str = ""


class Hunk(_Strict):
    """Where a commit changed a file: the first changed line of a hunk (its new side)
    and the function git's hunk header names there."""

    line: int = Field(ge=1)
    function: str = ""


class Commit(_Strict):
    """A commit read from a system's repository (through its MCP git server): the change
    a session without a deploy record blames (packs.diagnosis.code.recent_commits)."""

    commit: str = Field(min_length=4)
    at: AwareDatetime
    author: str = ""
    message: str = ""
    # path -> the hunks it changed, in file order
    files: dict[str, list[Hunk]] = {}

    @property
    def id(self) -> str:
        return self.commit[:10]


@dataclass
class Bundle:
    """A checked bundle in a folder of its own (kept until `close`)."""

    root: Path
    incident: Incident
    deploys: list[Deploy]
    config_changes: list[ConfigChange]
    has_logs: bool
    has_metrics: bool
    has_repo: bool
    log_lines: int = 0
    metric_rows: int = 0
    # Sources the agent did not read (a failed or skipped evidence call): the playbook
    # reads the bundle as if they were absent (see `read_only`).
    unread: frozenset[str] = frozenset()
    # Metrics read from a configured source (packs.diagnosis.prometheus) instead of
    # metrics.csv: its rows, (ts, service, metric, value). None: the file, if any.
    metric_samples: list[tuple[datetime, str, str, float]] | None = None
    # Commits read from the system's repository (a session on the system's sources whose
    # bundle holds no deploys): the changes the playbook may blame. None: none were read.
    commits: list[Commit] | None = None
    _scratch: Path | None = field(default=None, repr=False)

    @property
    def logs_path(self) -> Path:
        return self.root / LOGS

    @property
    def metrics_path(self) -> Path:
        return self.root / METRICS

    @property
    def sources(self) -> dict[str, bool]:
        """Which evidence the bundle carries (a missing source lowers confidence)."""
        held = {
            "logs": self.has_logs,
            "metrics": self.has_metrics,
            "deploys": (self.root / DEPLOYS).is_file(),
            "config_changes": (self.root / CONFIG_CHANGES).is_file(),
            "repo": self.has_repo,
        }
        if self.commits is not None:  # only a session that read its system's repository
            held["commits"] = True
        return {name: present and name not in self.unread for name, present in held.items()}

    def read_only(self, sources: set[str]) -> Bundle:
        """The bundle as far as the agent read it: only `sources` (names of `sources`)
        present. A view: it shares the folder and never removes it."""
        unread = frozenset(name for name in self.sources if name not in sources) | self.unread
        return replace(
            self,
            has_logs=self.has_logs and "logs" not in unread,
            has_metrics=self.has_metrics and "metrics" not in unread,
            has_repo=self.has_repo and "repo" not in unread,
            deploys=[] if "deploys" in unread else self.deploys,
            config_changes=[] if "config_changes" in unread else self.config_changes,
            commits=[] if "commits" in unread and self.commits is not None else self.commits,
            unread=unread,
            _scratch=None,
        )

    def close(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


@contextmanager
def opened(path: str | Path, limits: Limits | None = None) -> Iterator[Bundle]:
    bundle = open_bundle(path, limits)
    try:
        yield bundle
    finally:
        bundle.close()


def open_bundle(path: str | Path, limits: Limits | None = None) -> Bundle:
    """Check a bundle folder or archive; archives are unpacked into a scratch folder."""
    limits = limits or Limits()
    path = Path(path)
    if path.is_dir():
        _refuse_links_and_size(path, limits)
        return _read(path, limits, scratch=None)
    if not path.is_file():
        raise BundleError(path.name, "no such bundle folder or archive")
    scratch = Path(tempfile.mkdtemp(prefix="aero-bundle-"))
    try:
        _unpack(path, scratch, limits)
        return _read(_bundle_root(scratch), limits, scratch=scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def _refuse_links_and_size(root: Path, limits: Limits) -> None:
    total = 0
    for item in root.rglob("*"):
        rel = item.relative_to(root).as_posix()
        if rel.startswith(f"{REPO}/") and "/.git/" in f"/{rel}/":
            # git's own object store: its size counts, its internals are git's business.
            if item.is_file() and not item.is_symlink():
                total += item.stat().st_size
            continue
        if item.is_symlink():
            raise BundleError(rel, "links are not allowed in a bundle")
        if item.is_file():
            total += item.stat().st_size
        if total > limits.max_bytes:
            raise BundleError(rel, f"the bundle is larger than {limits.max_bytes} bytes unpacked")


def _safe_member(name: str) -> PurePosixPath:
    member = PurePosixPath(name)
    if member.is_absolute() or ".." in member.parts or name.startswith("\\"):
        raise BundleError(name, "path outside the bundle's folder")
    return member


def _unpack(archive: Path, into: Path, limits: Limits) -> None:
    total = 0
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                member = _safe_member(info.filename)
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    raise BundleError(info.filename, "links are not allowed in a bundle")
                total += info.file_size
                if total > limits.max_bytes:
                    raise BundleError(
                        archive.name, f"larger than {limits.max_bytes} bytes unpacked"
                    )
                target = into / member
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
        return
    try:
        tf = tarfile.open(archive)  # noqa: SIM115 - closed by the `with` below
    except tarfile.TarError:
        raise BundleError(archive.name, "not a folder, .zip or .tar.gz bundle") from None
    with tf:
        for tinfo in tf.getmembers():
            _safe_member(tinfo.name)
            if tinfo.issym() or tinfo.islnk():
                raise BundleError(tinfo.name, "links are not allowed in a bundle")
            if not (tinfo.isfile() or tinfo.isdir()):
                raise BundleError(tinfo.name, "only files and folders are allowed in a bundle")
            total += tinfo.size
            if total > limits.max_bytes:
                raise BundleError(archive.name, f"larger than {limits.max_bytes} bytes unpacked")
        # The members are checked above; the "data" filter refuses anything else unsafe.
        tf.extractall(into, filter="data")


def _bundle_root(scratch: Path) -> Path:
    """The folder holding incident.yaml: the archive's root or its one top folder."""
    if (scratch / INCIDENT).is_file():
        return scratch
    tops = [p for p in scratch.iterdir() if not p.name.startswith(".")]
    if len(tops) == 1 and tops[0].is_dir() and (tops[0] / INCIDENT).is_file():
        return tops[0]
    raise BundleError(INCIDENT, "missing: a bundle needs incident.yaml at its top")


class _StringLoader(yaml.SafeLoader):
    """YAML with timestamps kept as text: the models decide what a time without an
    offset is (an error), not PyYAML (a naive datetime)."""


_StringLoader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _load_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    text = path.read_text(encoding="utf-8", errors="strict")
    try:
        data = yaml.load(text, Loader=_StringLoader)
        node = yaml.compose(text, Loader=_StringLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise BundleError(
            path.name,
            f"not valid YAML ({getattr(exc, 'problem', exc)})",
            line=mark.line + 1 if mark else None,
        ) from None
    return data, node


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The line of the value at `loc` (pydantic's error location) in the composed YAML."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == part), None)
            if match is None:
                break
            node = match
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value)
        ):
            node = node.value[part]
        else:
            break
        line = node.start_mark.line + 1
    return line


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _model_error(
    file: str, exc: ValidationError, node: yaml.Node | None, prefix: tuple[Any, ...] = ()
) -> BundleError:
    first = exc.errors()[0]
    loc = prefix + tuple(first["loc"])
    message = first["msg"]
    if first["type"] == "timezone_aware":
        message = "a timestamp needs its offset (e.g. +08:00)"
    elif first["type"] == "extra_forbidden":
        message = "unknown field"
    return BundleError(file, message, line=_line_of(node, loc), field=_field_path(loc))


def _read(root: Path, limits: Limits, *, scratch: Path | None) -> Bundle:
    if not (root / INCIDENT).is_file():
        raise BundleError(INCIDENT, "missing: a bundle needs incident.yaml at its top")
    data, node = _load_yaml(root / INCIDENT)
    if not isinstance(data, dict):
        raise BundleError(INCIDENT, "must be a mapping of fields", line=1)
    try:
        incident = Incident.model_validate(data)
    except ValidationError as exc:
        raise _model_error(INCIDENT, exc, node) from None
    deploys = _read_list(root / DEPLOYS, Deploy)
    changes = _read_list(root / CONFIG_CHANGES, ConfigChange)
    has_repo = (root / REPO).is_dir()
    _check_commits(root, deploys, has_repo)
    bundle = Bundle(
        root=root,
        incident=incident,
        deploys=deploys,
        config_changes=changes,
        has_logs=(root / LOGS).is_file(),
        has_metrics=(root / METRICS).is_file(),
        has_repo=has_repo,
        _scratch=scratch,
    )
    con = duckdb.connect()
    try:
        if bundle.has_logs:
            bundle.log_lines = _check_logs(con, bundle.logs_path, limits)
        if bundle.has_metrics:
            bundle.metric_rows = _check_metrics(con, bundle.metrics_path)
    finally:
        con.close()
    return bundle


def _read_list(path: Path, model: type[Deploy] | type[ConfigChange]) -> list[Any]:
    if not path.is_file():
        return []
    data, node = _load_yaml(path)
    if data is None:
        return []
    if not isinstance(data, list):
        raise BundleError(path.name, "must be a list", line=1)
    out = []
    for index, item in enumerate(data):
        try:
            out.append(model.model_validate(item))
        except ValidationError as exc:
            raise _model_error(path.name, exc, node, (index,)) from None
    return out


def _check_commits(root: Path, deploys: list[Deploy], has_repo: bool) -> None:
    for index, deploy in enumerate(deploys):
        if not deploy.commit:
            continue
        if not has_repo:
            raise BundleError(
                DEPLOYS, "names a commit but the bundle has no repo/", field=f"[{index}].commit"
            )
        found = subprocess.run(
            ["git", "-C", str(root / REPO), "cat-file", "-e", f"{deploy.commit}^{{commit}}"],
            capture_output=True,
            timeout=30,
        )
        if found.returncode != 0:
            raise BundleError(
                DEPLOYS, f"commit {deploy.commit} is not in repo/", field=f"[{index}].commit"
            )


def _lines_sql(path: Path) -> str:
    """The file as (line number, text) rows; DuckDB keeps the file's order."""
    return (
        f"SELECT row_number() OVER () AS lineno, line FROM read_csv({_quote(path)}, "
        "columns={'line': 'VARCHAR'}, header=false, delim=chr(1), quote='', escape='', "
        "auto_detect=false, strict_mode=false)"
    )


def _quote(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _check_logs(con: duckdb.DuckDBPyConnection, path: Path, limits: Limits) -> int:
    levels = ", ".join(f"'{level}'" for level in LEVELS)
    bad = (
        f"ts IS NULL OR NOT regexp_matches(ts, '{OFFSET_RE}')"
        " OR try_cast(ts AS TIMESTAMPTZ) IS NULL"
        f" OR coalesce(service, '') = '' OR level IS NULL OR level NOT IN ({levels})"
        " OR msg IS NULL OR (stack IS NOT NULL AND json_type(stack) <> 'ARRAY')"
    )
    columns = "{ts: 'VARCHAR', service: 'VARCHAR', level: 'VARCHAR', msg: 'VARCHAR', stack: 'JSON'}"
    try:
        # One parallel scan for a good file; the line-by-line scan below only names the
        # first bad line of a bad one.
        row = con.execute(
            f"SELECT count(*), count(*) FILTER (WHERE {bad}) FROM read_json({_quote(path)}, "
            f"format='newline_delimited', columns={columns})"
        ).fetchone()
    except duckdb.Error:
        row = None
    if row is not None and row[1] == 0:
        if row[0] > limits.max_log_lines:
            raise BundleError(LOGS, f"more than {limits.max_log_lines} lines ({row[0]})")
        return int(row[0])
    _first_bad_log_line(con, path)
    raise BundleError(LOGS, "cannot be read as JSON lines")


def _first_bad_log_line(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    levels = ", ".join(f"'{level}'" for level in LEVELS)
    bad = con.execute(
        f"""
        WITH l AS ({_lines_sql(path)}), j AS (
          SELECT lineno, line, json_valid(line) AS ok FROM l WHERE trim(line) <> ''
        )
        SELECT lineno, CASE
          WHEN NOT ok OR json_type(line) <> 'OBJECT' THEN 'not a JSON object|'
          WHEN line->>'ts' IS NULL THEN 'missing|ts'
          WHEN NOT regexp_matches(line->>'ts', '{OFFSET_RE}')
            OR try_cast(line->>'ts' AS TIMESTAMPTZ) IS NULL
            THEN 'a timestamp with its offset (e.g. +08:00) is needed|ts'
          WHEN coalesce(line->>'service', '') = '' THEN 'missing|service'
          WHEN line->>'level' IS NULL OR line->>'level' NOT IN ({levels})
            THEN 'must be one of DEBUG, INFO, WARN, ERROR|level'
          WHEN line->>'msg' IS NULL THEN 'missing|msg'
          WHEN json_type(line, '$.stack') IS NOT NULL AND json_type(line, '$.stack') <> 'ARRAY'
            THEN 'must be a list of "path:line in function"|stack'
        END AS why
        FROM j WHERE NOT ok OR why IS NOT NULL ORDER BY lineno LIMIT 1
        """
    ).fetchone()
    if bad is not None:
        message, _, field_name = str(bad[1]).partition("|")
        raise BundleError(LOGS, message, line=int(bad[0]), field=field_name)


def _check_metrics(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    with path.open(encoding="utf-8") as f:
        header = f.readline().strip().replace(" ", "")
    if header != "ts,service,metric,value":
        raise BundleError(METRICS, "the header must be ts,service,metric,value", line=1)
    try:
        bad = _first_bad_metric_row(con, path)
        rows = con.execute(f"SELECT count(*) FROM read_csv({_quote(path)}, header=true)").fetchone()
    except duckdb.Error as exc:
        raise BundleError(METRICS, f"cannot be read as CSV ({str(exc).splitlines()[0]})") from None
    if bad is not None:
        message, _, field_name = str(bad[1]).partition("|")
        raise BundleError(METRICS, message, line=int(bad[0]), field=field_name)
    return int(rows[0]) if rows else 0


def _first_bad_metric_row(con: duckdb.DuckDBPyConnection, path: Path) -> tuple[Any, ...] | None:
    return con.execute(
        f"""
        WITH r AS (
          SELECT row_number() OVER () + 1 AS lineno, * FROM read_csv({_quote(path)}, header=true,
            columns={{'ts': 'VARCHAR', 'service': 'VARCHAR', 'metric': 'VARCHAR',
                      'value': 'VARCHAR'}},
            auto_detect=false, null_padding=true)
        )
        SELECT lineno, CASE
          WHEN ts IS NULL OR NOT regexp_matches(ts, '{OFFSET_RE}')
            OR try_cast(ts AS TIMESTAMPTZ) IS NULL
            THEN 'a timestamp with its offset (e.g. +08:00) is needed|ts'
          WHEN coalesce(service, '') = '' THEN 'missing|service'
          WHEN coalesce(metric, '') = '' THEN 'missing|metric'
          WHEN try_cast(value AS DOUBLE) IS NULL OR isnan(try_cast(value AS DOUBLE))
            THEN 'not a number|value'
        END AS why
        FROM r WHERE why IS NOT NULL ORDER BY lineno LIMIT 1
        """
    ).fetchone()

"""Incident bundles in: every bad bundle gets an error naming the file, line and field,
and archives cannot reach outside their folder, carry links or exceed the limits."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from packs.diagnosis.bundle import BundleError, Limits, open_bundle, opened
from tests.bundles import ONSET, BundleWriter, deploy, iso


def good(tmp_path: Path) -> Path:
    return BundleWriter().write(tmp_path / "bundle")


def error_of(path: Path, limits: Limits | None = None) -> BundleError:
    with pytest.raises(BundleError) as caught:
        open_bundle(path, limits)
    return caught.value


def test_a_good_bundle_opens_as_a_folder_a_zip_and_a_tar(tmp_path: Path) -> None:
    root = good(tmp_path)
    with opened(root) as bundle:
        assert bundle.incident.description and bundle.has_logs and bundle.has_metrics
        lines = bundle.log_lines
    tgz = tmp_path / "b.tar.gz"
    with tarfile.open(tgz, "w:gz") as tf:
        tf.add(root, arcname="bundle")
    zipped = tmp_path / "b.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        for path in root.rglob("*"):
            zf.write(path, f"bundle/{path.relative_to(root)}")
    for archive in (tgz, zipped):
        bundle = open_bundle(archive)
        scratch = bundle.root
        assert bundle.log_lines == lines
        bundle.close()
        assert not scratch.exists()


def test_an_incident_file_alone_is_a_valid_bundle(tmp_path: Path) -> None:
    (tmp_path / "incident.yaml").write_text(
        "description: slow\nreported_at: '2026-10-20T12:00:00+08:00'\n", "utf-8"
    )
    with opened(tmp_path) as bundle:
        assert bundle.sources == {
            "logs": False,
            "metrics": False,
            "deploys": False,
            "config_changes": False,
            "repo": False,
        }


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        ("reported_at: '2026-10-20T12:00:00+08:00'\n", 1, "description", "Field required"),
        ("description: x\nreported_at: '2026-10-20T12:00:00'\n", 2, "reported_at", "offset"),
        (
            "description: x\nreported_at: '2026-10-20T12:00:00+08:00'\n"
            "window:\n  start: soon\n  end: later\n",
            4,
            "window.start",
            "datetime",
        ),
        (
            "description: x\nreported_at: '2026-10-20T12:00:00+08:00'\nmood: bad\n",
            3,
            "mood",
            "unknown field",
        ),
        ("description: [x\n", 2, "", "not valid YAML"),
    ],
)
def test_a_bad_incident_file_is_named_with_line_and_field(
    tmp_path: Path, text: str, line: int, field: str, message: str
) -> None:
    (tmp_path / "incident.yaml").write_text(text, "utf-8")
    error = error_of(tmp_path)
    assert (error.file, error.line, error.field) == ("incident.yaml", line, field)
    assert message in error.message


def test_a_missing_incident_file(tmp_path: Path) -> None:
    root = good(tmp_path)
    (root / "incident.yaml").unlink()
    assert error_of(root).file == "incident.yaml"


def _replace_line(path: Path, number: int, text: str) -> None:
    lines = path.read_text("utf-8").splitlines(keepends=True)
    lines[number - 1] = text + "\n"
    path.write_text("".join(lines), "utf-8")


@pytest.mark.parametrize(
    ("record", "field", "message"),
    [
        ("{not json", "", "not a JSON object"),
        (
            json.dumps({"ts": "2026-10-20T10:00:00", "service": "a", "level": "INFO", "msg": "m"}),
            "ts",
            "offset",
        ),
        (json.dumps({"ts": iso(ONSET), "level": "INFO", "msg": "m"}), "service", "missing"),
        (
            json.dumps({"ts": iso(ONSET), "service": "a", "level": "LOUD", "msg": "m"}),
            "level",
            "one of",
        ),
        (json.dumps({"ts": iso(ONSET), "service": "a", "level": "INFO"}), "msg", "missing"),
        (
            json.dumps(
                {"ts": iso(ONSET), "service": "a", "level": "ERROR", "msg": "m", "stack": "x"}
            ),
            "stack",
            "list",
        ),
    ],
)
def test_a_bad_log_line_is_named_with_its_line_and_field(
    tmp_path: Path, record: str, field: str, message: str
) -> None:
    root = good(tmp_path)
    _replace_line(root / "logs.jsonl", 17, record)
    error = error_of(root)
    assert (error.file, error.line, error.field) == ("logs.jsonl", 17, field)
    assert message in error.message


@pytest.mark.parametrize(
    ("row", "field", "message"),
    [
        ("2026-10-20T10:00:00.000+08:00,orders,up,lots", "value", "not a number"),
        ("2026-10-20T10:00:00.000,orders,up,1", "ts", "offset"),
        ("2026-10-20T10:00:00.000+08:00,,up,1", "service", "missing"),
    ],
)
def test_a_bad_metric_row_is_named_with_its_line_and_field(
    tmp_path: Path, row: str, field: str, message: str
) -> None:
    root = good(tmp_path)
    _replace_line(root / "metrics.csv", 40, row)
    error = error_of(root)
    assert (error.file, error.line, error.field) == ("metrics.csv", 40, field)
    assert message in error.message


def test_a_bad_metrics_header(tmp_path: Path) -> None:
    root = good(tmp_path)
    _replace_line(root / "metrics.csv", 1, "time,service,name,value")
    assert (error_of(root).file, error_of(root).line) == ("metrics.csv", 1)


def test_a_deploy_naming_a_commit_not_in_the_repo(tmp_path: Path) -> None:
    writer = BundleWriter(repo_files={"a.py": "x = 1\n"})
    writer.deploys = [
        deploy("D-1", "payments", ONSET, ["a.py"], commit="HEAD"),
        deploy("D-2", "payments", ONSET, ["a.py"], commit="0" * 40),
    ]
    error = error_of(writer.write(tmp_path / "bundle"))
    assert (error.file, error.field) == ("deploys.yaml", "[1].commit")
    assert "not in repo/" in error.message


def test_a_bad_deploy_field_is_named_with_its_line(tmp_path: Path) -> None:
    root = good(tmp_path)
    (root / "deploys.yaml").write_text("- id: D-1\n  service: orders\n  at: yesterday\n", "utf-8")
    error = error_of(root)
    assert (error.file, error.line, error.field) == ("deploys.yaml", 3, "[0].at")


def _tar_with(tmp_path: Path, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        incident = b"description: x\nreported_at: '2026-10-20T12:00:00+08:00'\n"
        info = tarfile.TarInfo("incident.yaml")
        info.size = len(incident)
        tf.addfile(info, io.BytesIO(incident))
        tf.addfile(member, io.BytesIO(data) if data else None)
    return archive


def test_archives_cannot_reach_outside_or_carry_links(tmp_path: Path) -> None:
    outside = tarfile.TarInfo("../escape.txt")
    outside.size = 2
    assert "outside" in error_of(_tar_with(tmp_path, outside, b"hi")).message
    link = tarfile.TarInfo("logs.jsonl")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    assert "links" in error_of(_tar_with(tmp_path, link)).message
    zipped = tmp_path / "evil.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("incident.yaml", "description: x\nreported_at: '2026-10-20T12:00:00+08:00'\n")
        zf.writestr("/abs/path.txt", "x")
    assert "outside" in error_of(zipped).message
    assert not (tmp_path.parent / "escape.txt").exists()


def test_a_folder_with_a_link_is_refused(tmp_path: Path) -> None:
    root = good(tmp_path)
    (root / "extra.txt").symlink_to("/etc/passwd")
    assert "links" in error_of(root).message


def test_size_and_line_limits(tmp_path: Path) -> None:
    root = good(tmp_path)
    assert "larger than" in error_of(root, Limits(max_bytes=10_000)).message
    error = error_of(root, Limits(max_log_lines=100))
    assert (error.file, "more than 100 lines") == ("logs.jsonl", error.message.split(" (")[0])

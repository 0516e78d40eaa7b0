"""Skills as an admin uploads them and as they run: a zip is checked whole before
anything is kept (each refusal named), and a skill runs in bubblewrap with no network,
the bundle and its own files read-only, under CPU, memory, time and output limits, its
result checked against its schema. Each misbehaviour is a real tiny skill run by real
bwrap, failing with a reason that names it; the worker and the bundle are untouched."""

from __future__ import annotations

import io
import json
import socket
import stat
import zipfile
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from aero.models import AuditLog
from tests.skill_helpers import COUNT_ERRORS, skill_zip
from tools.models import Skill, SkillFile, SkillVersion
from tools.sandbox import run_skill, sandbox_kind
from tools.skills import MAX_ZIP_BYTES, SkillRejected, save_upload

pytestmark = pytest.mark.services
# Small limits so a misbehaving skill is stopped soon (a loaded machine: the deadline is
# wall-clock, the CPU limit is not).
FAST = {"timeout_seconds": 20, "cpu_seconds": 1, "memory_mb": 128, "output_bytes": 4096}


@pytest.fixture
def root(db: None) -> User:
    return User.objects.create_superuser("root", password="pw-for-tests")


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    folder = tmp_path / "bundle"
    folder.mkdir()
    lines = [
        {"level": "ERROR", "msg": "pool exhausted"},
        {"level": "INFO", "msg": "ok"},
        {"level": "ERROR", "msg": "timeout"},
    ]
    (folder / "logs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def upload(root: User, script: str, **fields: Any) -> SkillVersion:
    fields.setdefault("limits", FAST)
    return save_upload(skill_zip(script, **fields), root)


def refused(root: User, data: bytes) -> SkillRejected:
    with pytest.raises(SkillRejected) as caught:
        save_upload(data, root)
    assert not Skill.objects.exists() and not SkillFile.objects.exists()
    return caught.value


# --- uploading --------------------------------------------------------------------------


def test_an_upload_is_kept_with_its_files_active_and_audited(root: User) -> None:
    version = save_upload(skill_zip(COUNT_ERRORS, files={"lib/words.txt": b"x"}), root)
    skill = Skill.objects.get(name="count-errors")
    assert skill.active_version == version and skill.risk_class == "R0"
    assert sorted(f.path for f in version.files.all()) == ["lib/words.txt", "main.py", "skill.yaml"]
    assert version.tool_name == "skill:count-errors" and version.uploaded_by == root
    assert AuditLog.objects.filter(action="skill.uploaded", object_id=str(skill.pk)).exists()
    later = save_upload(skill_zip(COUNT_ERRORS, version="1.1"), root)
    skill.refresh_from_db()
    assert skill.active_version == version  # a later version waits to be chosen
    save_upload(skill_zip(COUNT_ERRORS, version="1.2", risk="R2"), root, activate=True)
    skill.refresh_from_db()
    assert skill.active_version.version == "1.2" and skill.risk_class == "R2"
    assert later.risk_class == "R0"
    assert AuditLog.objects.filter(action="skill.activated").count() == 2


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("../escape.py", "unsafe_path"),
        ("/etc/evil.py", "unsafe_path"),
        ("a/../../b.py", "unsafe_path"),
    ],
)
def test_a_path_leaving_the_folder_is_refused(root: User, name: str, code: str) -> None:
    assert refused(root, skill_zip(COUNT_ERRORS, files={name: b"x"})).code == code


def test_a_symbolic_link_is_refused(root: User) -> None:
    buffer = io.BytesIO(skill_zip(COUNT_ERRORS))
    with zipfile.ZipFile(buffer, "a") as archive:
        link = zipfile.ZipInfo("data")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
    assert refused(root, buffer.getvalue()).code == "unsafe_path"


def test_a_zip_bomb_and_a_too_large_zip_are_refused(root: User) -> None:
    bomb = skill_zip(COUNT_ERRORS, files={"zeros.bin": b"\0" * (3 * 1024 * 1024)})
    assert len(bomb) < 64 * 1024
    assert refused(root, bomb).code == "zip_bomb"
    assert refused(root, b"PK" + b"x" * MAX_ZIP_BYTES).code == "too_large"
    assert refused(root, b"not a zip at all").code == "not_a_zip"


def test_a_bad_manifest_a_missing_entry_or_a_bad_schema_is_refused(root: User) -> None:
    assert refused(root, skill_zip(COUNT_ERRORS, entry="run.py")).code == "missing_entry"
    bad_schema = refused(root, skill_zip(COUNT_ERRORS, result={"type": "thing"}))
    assert bad_schema.code == "bad_schema" and "result" in bad_schema.message
    no_object = refused(root, skill_zip(COUNT_ERRORS, arguments={"type": "string"}))
    assert no_object.code == "bad_schema"
    bad_risk = refused(root, skill_zip(COUNT_ERRORS, risk="R9"))
    assert bad_risk.code == "bad_manifest" and "risk" in bad_risk.message
    assert refused(root, skill_zip(COUNT_ERRORS, raw_manifest="name: [")).code == "bad_manifest"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("main.py", "print(1)")
    assert refused(root, buffer.getvalue()).code == "no_manifest"


def test_a_duplicate_version_or_a_lowered_risk_is_refused(root: User) -> None:
    save_upload(skill_zip(COUNT_ERRORS, risk="R1"), root)
    with pytest.raises(SkillRejected) as again:
        save_upload(skill_zip(COUNT_ERRORS, risk="R1"), root)
    assert again.value.code == "duplicate_version"
    with pytest.raises(SkillRejected) as lowered:
        save_upload(skill_zip(COUNT_ERRORS, version="2", risk="R0"), root)
    assert lowered.value.code == "risk_lowered"
    assert SkillVersion.objects.count() == 1


# --- running ----------------------------------------------------------------------------


def test_this_machine_runs_skills_in_bubblewrap() -> None:
    assert sandbox_kind() == "bwrap"


def test_a_good_skill_reads_the_bundle_and_returns_a_finding(root: User, bundle: Path) -> None:
    version = upload(root, COUNT_ERRORS)
    result = run_skill(version, {"problem_type": "db_pool"}, bundle)
    assert result.ok, result.error
    assert result.result == {"summary": "2 ERROR lines (db_pool)", "lines": 2}
    assert result.sandbox == "bwrap"


def test_arguments_breaking_the_schema_run_nothing(root: User, bundle: Path) -> None:
    version = upload(root, "raise SystemExit('must not run')")
    result = run_skill(version, {"services": "not-a-list"}, bundle)
    assert not result.ok and result.reason == "bad_arguments"
    assert "services" in result.error and "must not run" not in result.error


def test_a_skill_that_loops_is_stopped_at_its_cpu_limit(root: User, bundle: Path) -> None:
    result = run_skill(upload(root, "while True:\n    pass\n"), {}, bundle)
    assert not result.ok and result.reason == "cpu_limit"
    assert result.error == "skill count-errors: stopped at its CPU limit (1 s)"


def test_a_skill_that_waits_forever_is_stopped_at_its_deadline(root: User, bundle: Path) -> None:
    limits = {**FAST, "timeout_seconds": 2}
    result = run_skill(upload(root, "import time\ntime.sleep(600)\n", limits=limits), {}, bundle)
    assert not result.ok and result.reason == "timed_out"
    assert "no answer within 2 s" in result.error


def test_a_skill_that_allocates_without_end_runs_out_of_memory(root: User, bundle: Path) -> None:
    script = "hoard = []\nwhile True:\n    hoard.append(bytearray(10**7))\n"
    result = run_skill(upload(root, script), {}, bundle)
    assert not result.ok and result.reason == "memory_limit"
    assert "MemoryError" in result.error and "128 MB" in result.error


def test_a_skill_writing_outside_its_work_folder_is_refused(root: User, bundle: Path) -> None:
    script = """
        import json
        open("/tmp/scratch.txt", "w").write("its own work folder is writable")
        print(json.dumps({"summary": "wrote /tmp"}), flush=True)
        open("/bundle/planted.txt", "w").write("never")
    """
    result = run_skill(upload(root, script), {}, bundle)
    assert not result.ok and result.reason == "crashed"
    assert "Read-only file system: '/bundle/planted.txt'" in result.error
    assert sorted(p.name for p in bundle.iterdir()) == ["logs.jsonl"]
    skill_files = run_skill(upload(root, "open('/skill/main.py', 'a')", version="2"), {}, bundle)
    assert "Read-only file system" in skill_files.error


def test_a_skill_that_opens_a_socket_reaches_nothing(root: User, bundle: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    script = f"""
        import socket
        socket.create_connection(("127.0.0.1", {port}), timeout=5)
    """
    try:
        result = run_skill(upload(root, script), {}, bundle)
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody came
    finally:
        listener.close()
    assert not result.ok and result.reason == "crashed"
    assert "Network is unreachable" in result.error or "Connection refused" in result.error


def test_a_skill_printing_garbage_is_refused(root: User, bundle: Path) -> None:
    garbage = run_skill(upload(root, "print('hello, not json')"), {}, bundle)
    assert not garbage.ok and garbage.reason == "not_json"
    assert "not JSON" in garbage.error and "hello" in garbage.error
    script = "import json\nprint(json.dumps({'summary': 3}))"
    lying = run_skill(upload(root, script, version="2"), {}, bundle)
    assert not lying.ok and lying.reason == "breaks_schema"
    assert "summary: 3 is not of type 'string'" in lying.error


def test_a_skill_printing_too_much_is_stopped(root: User, bundle: Path) -> None:
    script = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    result = run_skill(upload(root, script), {}, bundle)
    assert not result.ok and result.reason == "too_much_output"
    assert "more than 4096 bytes" in result.error


def test_where_bwrap_cannot_run_unshare_still_takes_the_network_away(
    root: User, bundle: Path, settings: Any
) -> None:
    settings.AERO_SKILL_SANDBOX = "unshare"
    sandbox_kind.cache_clear()
    try:
        assert sandbox_kind() == "unshare"
        good = run_skill(upload(root, COUNT_ERRORS), {}, bundle)
        assert good.ok and good.sandbox == "unshare" and good.result["lines"] == 2
        script = "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=5)\n"
        offline = run_skill(upload(root, script, version="2"), {}, bundle)
        assert offline.reason == "crashed" and "Network is unreachable" in offline.error
    finally:
        sandbox_kind.cache_clear()

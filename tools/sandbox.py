"""Running one skill version: `run_skill(version, args, bundle_dir) -> SkillResult`.

The skill's script runs in a process of its own, under tools/launch.py's limits
(RLIMIT_AS, RLIMIT_CPU, death with its parent), inside bubblewrap: every namespace
unshared (no network: only a loopback that is down), the system's /usr and the
interpreter read-only, the skill's files at /skill and the session's bundle at /bundle
read-only, a small tmpfs at /tmp as its work folder, no environment but a few names. The
arguments go on stdin as JSON; the result is the JSON object on stdout, checked against
the skill's result schema. A wall-clock deadline and an output cap stop it from outside.
Where bwrap cannot make its namespaces, `unshare --net --map-root-user` still takes the
network away (the files are then only as protected as the worker's user makes them);
with neither, no skill runs. Nothing here raises for a skill's misbehaviour: the answer
says what went wrong (`reason`, `error`)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from jsonschema import Draft202012Validator

from tools.models import SkillVersion

LAUNCH = Path(__file__).with_name("launch.py")
# stderr kept to say why a skill failed (its last line)
STDERR_TAIL = 4096
# exit codes of a process killed by a signal, as a shell (and launch.py) report them
SIGNALLED = 128


@dataclass(frozen=True)
class SkillResult:
    """One run: `result` when ok, else `reason` (a code) and `error` (in words)."""

    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    error: str = ""
    seconds: float = 0.0
    sandbox: str = ""


class SkillError(RuntimeError):
    """A failed run, for callers that record failures as exceptions (a recorded call)."""

    def __init__(self, result: SkillResult) -> None:
        super().__init__(result.error)
        self.result = result


def _interpreter() -> Path:
    """The interpreter AERO runs on, with links resolved (the sandbox binds its prefix)."""
    return Path(os.path.realpath(sys.executable))


def _system_binds() -> list[str]:
    """/usr read-only, the top-level links into it kept as links (merged /usr) or bound."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        path = Path(top)
        if path.is_symlink():
            args += ["--symlink", str(path.readlink()), top]
        elif path.exists():
            args += ["--ro-bind", top, top]
    prefix = Path(os.path.realpath(sys.base_prefix))
    if not str(prefix).startswith("/usr/"):
        args += ["--ro-bind", str(prefix), str(prefix)]
    return args


def bwrap_prefix(skill_dir: Path, bundle_dir: Path | None, tmp_mb: int) -> list[str]:
    args = [
        "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "PYTHONDONTWRITEBYTECODE",
        "1",
        "--setenv",
        "AERO_BUNDLE",
        "/bundle",
        *_system_binds(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(tmp_mb * 1024 * 1024),
        "--tmpfs",
        "/tmp",
        "--ro-bind",
        str(skill_dir),
        "/skill",
    ]
    if bundle_dir is not None:
        args += ["--ro-bind", str(bundle_dir), "/bundle"]
    return [*args, "--chdir", "/tmp"]


@functools.cache
def sandbox_kind() -> str:
    """`bwrap`, `unshare` or "" (none works here): tried once per process with a command
    that must fail to reach the network."""
    setting = settings.AERO_SKILL_SANDBOX
    probe = [str(_interpreter()), "-I", "-c", "print(1)"]
    with tempfile.TemporaryDirectory(prefix="aero-skill-probe-") as empty:
        candidates = {
            "bwrap": [*bwrap_prefix(Path(empty), None, 1), *probe],
            "unshare": ["unshare", "--net", "--map-root-user", *probe],
        }
        for kind, command in candidates.items():
            if setting not in ("auto", kind):
                continue
            try:
                done = subprocess.run(command, capture_output=True, timeout=30, check=False)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if done.returncode == 0 and done.stdout.strip() == b"1":
                return kind
    return ""


def _command(kind: str, version: SkillVersion, skill_dir: Path, bundle: Path | None) -> list[str]:
    limits = version.manifest.get("limits") or {}
    memory, cpu = int(limits.get("memory_mb", 256)), int(limits.get("cpu_seconds", 10))
    launch = [sys.executable, str(LAUNCH), "--mem", str(memory), "--cpu", str(cpu), "--"]
    entry = f"/skill/{version.entry}"
    if kind == "bwrap":
        prefix = bwrap_prefix(skill_dir, bundle, tmp_mb=min(64, memory))
    else:  # no network only: the paths are the real ones
        prefix = ["unshare", "--net", "--map-root-user"]
        entry = str(skill_dir / version.entry)
    return [*launch, *prefix, str(_interpreter()), "-I", entry]


def _pump(stream: IO[bytes], sink: bytearray, cap: int, over: threading.Event) -> None:
    """Read `stream` into `sink` until EOF or `cap` bytes; past the cap, set `over`."""
    while chunk := stream.read1(65536):  # type: ignore[attr-defined]
        if len(sink) + len(chunk) > cap:
            sink.extend(chunk[: cap - len(sink)])
            over.set()
            return
        sink.extend(chunk)


def _tail(stream: IO[bytes], sink: bytearray) -> None:
    while chunk := stream.read1(65536):  # type: ignore[attr-defined]
        sink.extend(chunk)
        del sink[:-STDERR_TAIL]


def _last_line(stderr: bytes) -> str:
    lines = [
        line
        for line in stderr.decode("utf-8", "replace").splitlines()
        if line.strip() and not line.startswith("aero-launch:")
    ]
    return lines[-1].strip()[:300] if lines else ""


def _materialize(version: SkillVersion, into: Path) -> None:
    for skill_file in version.files.all():
        target = into / skill_file.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(bytes(skill_file.content))
        target.chmod(0o444)
    into.chmod(0o555)


def _failed(name: str, reason: str, words: str, started: float, kind: str) -> SkillResult:
    return SkillResult(
        ok=False,
        reason=reason,
        error=f"skill {name}: {words}",
        seconds=time.monotonic() - started,
        sandbox=kind,
    )


def run_skill(version: SkillVersion, args: dict[str, Any], bundle_dir: Path | None) -> SkillResult:
    """Run `version` on `args` over `bundle_dir` (read-only) in the sandbox: the checked
    result, or why there is none."""
    started = time.monotonic()
    name = version.skill.name
    faults = sorted(
        Draft202012Validator(version.arguments_schema).iter_errors(args), key=lambda e: e.path
    )
    if faults:
        words = "; ".join(
            f"{'.'.join(map(str, e.path)) or 'arguments'}: {e.message}" for e in faults
        )
        return _failed(name, "bad_arguments", f"bad arguments: {words}", started, "")
    kind = sandbox_kind()
    if not kind:
        return _failed(name, "no_sandbox", "no sandbox works here (bwrap nor unshare)", started, "")
    limits = version.manifest.get("limits") or {}
    timeout = float(limits.get("timeout_seconds", 20.0))
    cap = int(limits.get("output_bytes", 256 * 1024))
    cpu = int(limits.get("cpu_seconds", 10))
    memory = int(limits.get("memory_mb", 256))
    with tempfile.TemporaryDirectory(prefix="aero-skill-") as work:
        skill_dir = Path(work) / "skill"
        skill_dir.mkdir()
        _materialize(version, skill_dir)
        bundle = Path(bundle_dir).resolve() if bundle_dir is not None else None
        process = subprocess.Popen(
            _command(kind, version, skill_dir, bundle),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=work,
            start_new_session=True,
            # bwrap clears it again; under unshare this is all the skill gets
            env={
                "PATH": "/usr/bin:/bin",
                "LANG": "C.UTF-8",
                "AERO_BUNDLE": "/bundle" if kind == "bwrap" or bundle is None else str(bundle),
            },
        )
        out, err, over = bytearray(), bytearray(), threading.Event()
        assert process.stdin and process.stdout and process.stderr
        readers = [
            threading.Thread(target=_pump, args=(process.stdout, out, cap, over), daemon=True),
            threading.Thread(target=_tail, args=(process.stderr, err), daemon=True),
        ]
        for reader in readers:
            reader.start()
        try:
            process.stdin.write(json.dumps(args).encode())
            process.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # it did not read its arguments: its answer says the rest
        deadline = started + timeout
        while process.poll() is None and not over.is_set() and time.monotonic() < deadline:
            over.wait(0.05)
        stopped = process.poll() is None
        if stopped:
            os.killpg(process.pid, signal.SIGKILL)
        code = process.wait()
        for reader in readers:
            reader.join(5)
    if over.is_set():
        return _failed(
            name, "too_much_output", f"printed more than {cap} bytes (stopped)", started, kind
        )
    if stopped:
        return _failed(
            name, "timed_out", f"no answer within {timeout:g} s (stopped)", started, kind
        )
    why = _last_line(bytes(err))
    if code == SIGNALLED + signal.SIGXCPU:
        return _failed(name, "cpu_limit", f"stopped at its CPU limit ({cpu} s)", started, kind)
    if "MemoryError" in why or "Cannot allocate memory" in why:
        return _failed(
            name, "memory_limit", f"out of its memory ({memory} MB): {why}", started, kind
        )
    if code > SIGNALLED and code - SIGNALLED in signal.valid_signals():
        killed = signal.Signals(code - SIGNALLED).name
        return _failed(name, "crashed", f"killed by {killed}: {why or 'no message'}", started, kind)
    if code != 0:
        return _failed(
            name, "crashed", f"exited with code {code}: {why or 'no message'}", started, kind
        )
    return _checked(version, bytes(out), started, kind)


def _checked(version: SkillVersion, out: bytes, started: float, kind: str) -> SkillResult:
    name = version.skill.name
    try:
        result = json.loads(out.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        shown = out[:60].decode("utf-8", "replace")
        return _failed(
            name, "not_json", f"its output is not JSON ({exc}): {shown!r}", started, kind
        )
    if not isinstance(result, dict):
        return _failed(name, "breaks_schema", "its result is not a JSON object", started, kind)
    faults = sorted(
        Draft202012Validator(version.result_schema).iter_errors(result), key=lambda e: e.path
    )
    if faults:
        words = "; ".join(f"{'.'.join(map(str, e.path)) or 'result'}: {e.message}" for e in faults)
        return _failed(
            name, "breaks_schema", f"its result breaks its schema: {words}", started, kind
        )
    return SkillResult(ok=True, result=result, seconds=time.monotonic() - started, sandbox=kind)

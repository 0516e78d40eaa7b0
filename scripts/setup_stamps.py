"""Whether a set-up step of scripts/run.sh may be skipped: its inputs are unchanged since
it last succeeded. A step's key hashes its input files' contents, the installed packages,
the settings that point it somewhere and, for steps that write the database, which
database that is and how far it is migrated; the key of its last success is kept in
`<data dir>/stamps/<step>`.

    setup_stamps.py check STEP   exit 0 when STEP's stamp matches (skip it), 1 otherwise
    setup_stamps.py save STEP    record STEP's key after it succeeded
    setup_stamps.py run STEP...  run the STEPs in order, each unless its stamp matches
                                 (AERO_SETUP_ALWAYS=1: all), and save each one's key

Plain Python until a step has to run: skipped steps cost tens of milliseconds, not a
Django start, and the steps that run share one Django process (a start is ~3 s of CPU).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIGRATIONS = ("*/migrations/*.py", "packs/**/migrations/*.py")


@dataclass(frozen=True)
class Step:
    globs: tuple[str, ...]
    database: bool = False  # writes the database: keyed on which one, and its migrations
    packages: bool = False  # reads installed packages (their migrations, their static files)
    static_root: bool = False  # writes STATIC_ROOT: keyed on what is there


STEPS = {
    "migrate": Step(MIGRATIONS, database=True, packages=True),
    "load_builtin": Step(
        ("scenarios_admin/**/*", "packs/**/*", "aero/packs.py"), database=True, packages=True
    ),
    "seed_demo": Step(("aero/management/commands/seed_demo.py", "aero/roles.py"), database=True),
    "collectstatic": Step(
        ("static/**/*", "*/static/**/*", "packs/**/static/**/*", "aero/settings.py"),
        packages=True,
        static_root=True,
    ),
}


def data_dir() -> Path:
    return Path(os.environ.get("AERO_DATA_DIR") or ROOT / "var").resolve()


def _files(globs: tuple[str, ...]) -> list[Path]:
    found = {
        path
        for pattern in globs
        for path in ROOT.glob(pattern)
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    return sorted(found)


def _database_identity() -> str:
    """Which database the step writes and how far it is migrated: the number of applied
    migrations and when the last was applied (a recreated database differs even where
    it got the old one's oid or inode). Unreadable: a value no stamp holds."""
    url = os.environ.get("DATABASE_OWNER_URL") or os.environ.get("DATABASE_URL")
    try:
        if url:
            import psycopg

            with psycopg.connect(url, connect_timeout=5) as conn:
                row = conn.execute(
                    "SELECT d.oid, (SELECT count(*) || ' ' || max(applied) FROM django_migrations) "
                    "FROM pg_database d WHERE d.datname = current_database()"
                ).fetchone()
            return f"postgresql {url} {row}"
        path = data_dir() / "aero.sqlite3"
        stat = path.stat()
        lite = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            applied = lite.execute(
                "SELECT count(*), max(applied) FROM django_migrations"
            ).fetchone()
        finally:
            lite.close()
        return f"sqlite {path} {stat.st_dev} {stat.st_ino} {applied}"
    except Exception as error:  # any failure means "run the step"
        return f"unknown {error!r} {os.urandom(16).hex()}"


def key(name: str) -> str:
    step = STEPS[name]
    digest = hashlib.sha256(name.encode())
    for path in _files(step.globs):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    if step.packages:
        # make install touches .venv/.installed after every pip install.
        installed = ROOT / ".venv" / ".installed"
        mtime = installed.stat().st_mtime_ns if installed.exists() else "none"
        digest.update(f"packages {mtime} {sys.version}".encode())
        digest.update((ROOT / "pyproject.toml").read_bytes())
    if step.database:
        digest.update(_database_identity().encode())
    if step.static_root:
        # What collectstatic left: a removed or edited copy makes it run again.
        static_root = ROOT / "staticfiles"
        if not static_root.is_dir():
            digest.update(os.urandom(16))
        for path in sorted(static_root.rglob("*")):
            stat = path.stat()
            digest.update(
                f"{path.relative_to(static_root)} {stat.st_size} {stat.st_mtime_ns}".encode()
            )
    return digest.hexdigest()


def matches(name: str) -> bool:
    stamp = data_dir() / "stamps" / name
    return stamp.is_file() and stamp.read_text().strip() == key(name)


def save(name: str) -> None:
    stamp = data_dir() / "stamps" / name
    stamp.parent.mkdir(parents=True, exist_ok=True)
    # Written whole or not at all: another run.sh may be reading it.
    partial = stamp.with_name(f".{name}.{os.getpid()}")
    partial.write_text(key(name) + "\n")
    partial.replace(stamp)


# Each step's manage.py command. seed_demo's output is kept (run.sh prints the demo users'
# table again when the step is skipped).
COMMANDS = {
    "migrate": ("migrate", {"interactive": False, "verbosity": 0}),
    "load_builtin": ("load_builtin", {}),
    "seed_demo": ("seed_demo", {}),
    "collectstatic": ("collectstatic", {"interactive": False, "verbosity": 0}),
}
SEED_DEMO_OUTPUT = "seed_demo.out"


def run(names: list[str]) -> int:
    always = os.environ.get("AERO_SETUP_ALWAYS", "0") == "1"

    def skipped(name: str) -> bool:
        # Checked right before the step: one run before it may have changed its inputs
        # (migrate changes the database that load_builtin's key reads).
        if always or not matches(name):
            return False
        print(f"Set-up: {name} skipped (inputs unchanged)", flush=True)
        return True

    if not always and all(matches(name) for name in names):
        for name in names:
            skipped(name)
        return 0
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "aero.settings")
    sys.path.insert(0, str(ROOT))
    import django
    from django.core.management import call_command

    django.setup()
    for name in names:
        if skipped(name):
            continue
        command, options = COMMANDS[name]
        # The system checks run as `manage.py <command>` runs them.
        if name == "seed_demo":
            output = data_dir() / "stamps" / SEED_DEMO_OUTPUT
            output.parent.mkdir(parents=True, exist_ok=True)
            partial = output.with_name(f"{output.name}.new")
            with partial.open("w") as out:
                call_command(command, skip_checks=False, stdout=out, **options)
            partial.replace(output)
        else:
            call_command(command, skip_checks=False, **options)
        sys.stdout.flush()
        save(name)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[1] == "run" and set(argv[2:]) <= set(STEPS):
        return run(argv[2:])
    if len(argv) != 3 or argv[1] not in ("check", "save") or argv[2] not in STEPS:
        print(__doc__, file=sys.stderr)
        return 2
    action, name = argv[1], argv[2]
    if action == "check":
        return 0 if matches(name) else 1
    save(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

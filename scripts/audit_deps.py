"""Audit the installed (locked) dependencies for known vulnerabilities with pip-audit.

CI runs this after `make install`: the project has no lock file, so the exact versions
installed for this run are what is audited. Exit 1 when any has a known vulnerability
(each listed with its id and the versions that fix it).

pip-audit asks a vulnerability service (PyPI's JSON API by default, AERO_AUDIT_SERVICE=osv
for OSV). A dependency the service cannot answer for is NOT audited: that is printed,
never passed off as clean, and with AERO_AUDIT_STRICT=1 it fails the run (exit 2).

Where PyPI answers only its project JSON (`/pypi/<name>/json`, not the per-version
`/pypi/<name>/<version>/json` pip-audit asks for), a dependency pip-audit skipped is
audited from it when the installed version is the project's latest release: that
document's `vulnerabilities` list is PyPI's own advisory data (the PyPA advisory
database and OSV) for exactly that release. An older installed version stays NOT
AUDITED, with the latest release named.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
PYPI_JSON = os.environ.get("AERO_AUDIT_PYPI_URL", "https://pypi.org/pypi").rstrip("/")
TIMEOUT = 30


def same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def installed_versions() -> dict[str, str]:
    """pip-audit's report names a skipped dependency without its version: read it from
    the environment pip-audit audited (this interpreter's, CI runs both from .venv)."""
    return {
        canonicalize_name(d.metadata["Name"]): d.version
        for d in importlib.metadata.distributions()
        if d.metadata["Name"]
    }


def from_project_json(dep: dict[str, Any]) -> dict[str, Any]:
    """The dependency audited from PyPI's project JSON, or still skipped with a reason."""
    name, version = dep["name"], dep.get("version", "")
    url = f"{PYPI_JSON}/{canonicalize_name(name)}/json"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
            data = json.load(response)
        latest = str(data["info"]["version"])
        advisories = data["vulnerabilities"]
    except (OSError, urllib.error.URLError, ValueError, KeyError, TypeError) as exc:
        reason = f"{dep['skip_reason']}; the project JSON failed too ({type(exc).__name__})"
        return {**dep, "skip_reason": reason}
    if not version or not same_version(version, latest):
        reason = (
            f"{version or 'its version'} is not the latest release ({latest}), and only the "
            "latest one's advisories are reachable here"
        )
        return {**dep, "skip_reason": reason}
    vulns = [
        {"id": v.get("id", "?"), "fix_versions": v.get("fixed_in") or []}
        for v in advisories
        if isinstance(v, dict) and not v.get("withdrawn")
    ]
    return {"name": name, "version": version, "vulns": vulns, "source": "project JSON"}


def main() -> int:
    pip_audit = os.environ.get("PIP_AUDIT", str(Path(sys.executable).parent / "pip-audit"))
    service = os.environ.get("AERO_AUDIT_SERVICE", "pypi")
    command = [
        pip_audit,
        "--format",
        "json",
        "--progress-spinner",
        "off",
        "--skip-editable",  # AERO itself
        "--vulnerability-service",
        service,
    ]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    try:
        report = json.loads(run.stdout)
    except json.JSONDecodeError:
        print(f"pip-audit failed (exit {run.returncode}):\n{run.stderr.strip()}")
        return 2
    dependencies = report.get("dependencies", [])
    audited = [d for d in dependencies if "skip_reason" not in d]
    skipped = [d for d in dependencies if "skip_reason" in d and d["name"] != "aero"]
    if skipped:
        versions = installed_versions()
        for dep in skipped:
            dep.setdefault("version", versions.get(canonicalize_name(dep["name"]), ""))
        with ThreadPoolExecutor(max_workers=8) as pool:
            retried = list(pool.map(from_project_json, skipped))
        from_json = [d for d in retried if "skip_reason" not in d]
        audited += from_json
        skipped = [d for d in retried if "skip_reason" in d]
        print(f"PyPI project JSON: {len(from_json)} dependencies pip-audit skipped audited there.")
    vulnerable = [d for d in audited if d.get("vulns")]
    for dep in vulnerable:
        for vuln in dep["vulns"]:
            fixed = ", ".join(vuln.get("fix_versions") or []) or "no fixed version yet"
            print(f"VULNERABLE {dep['name']} {dep['version']}: {vuln['id']} (fixed in {fixed})")
    print(
        f"pip-audit ({service}): {len(audited)} of {len(audited) + len(skipped)} dependencies "
        f"audited, {len(vulnerable)} with known vulnerabilities."
    )
    if skipped:
        print(
            f"NOT AUDITED: {len(skipped)} dependencies, the vulnerability service could not "
            f"answer for them (first: {skipped[0]['name']}: {skipped[0]['skip_reason']})."
        )
        print("  " + ", ".join(f"{d['name']} {d.get('version', '')}".strip() for d in skipped))
    if vulnerable:
        return 1
    if skipped and os.environ.get("AERO_AUDIT_STRICT") == "1":
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

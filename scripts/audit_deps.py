"""Audit the installed (locked) dependencies for known vulnerabilities with pip-audit.

CI runs this after `make install`: the project has no lock file, so the exact versions
installed for this run are what is audited. Exit 1 when any has a known vulnerability
(each listed with its id and the versions that fix it).

pip-audit asks a vulnerability service (PyPI's JSON API by default, AERO_AUDIT_SERVICE=osv
for OSV). A dependency the service cannot answer for is NOT audited: that is printed,
never passed off as clean, and with AERO_AUDIT_STRICT=1 it fails the run (exit 2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
    if vulnerable:
        return 1
    if skipped and os.environ.get("AERO_AUDIT_STRICT") == "1":
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Start one MCP server under limits: `python launch.py --mem MB --cpu S -- command args`.

The `mcp` SDK's stdio client spawns a command (in a process group of its own, which it
kills when the exchange ends); AERO spawns this launcher, which runs the server as its
child with an address-space limit (RLIMIT_AS) and a CPU-time limit (RLIMIT_CPU), passes
stdin and stdout straight through, and says on stderr how the server ended when it did
not end well. Both die with their parent (PR_SET_PDEATHSIG): a worker killed mid-call
leaves no server behind. Standard library only: it runs before Django, in any cwd.
"""

from __future__ import annotations

import argparse
import ctypes
import resource
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
NOT_FOUND = 127


def die_with_parent() -> None:
    """SIGKILL this process when its parent exits (Linux; elsewhere a no-op)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def limit(memory_mb: int, cpu_seconds: int) -> None:
    """In the server's process, before it runs: its limits, and death with the launcher."""
    die_with_parent()
    if memory_mb > 0:
        size = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size, size))
    if cpu_seconds > 0:
        # SIGXCPU at the soft limit, SIGKILL one second later if it is caught.
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="launch")
    parser.add_argument("--mem", type=int, default=0, help="address space, MB (0: no limit)")
    parser.add_argument("--cpu", type=int, default=0, help="CPU seconds (0: no limit)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("no command to run")
    die_with_parent()
    # The launcher's own signals reach the server (the SDK signals the whole group too).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        child = subprocess.Popen(
            command, preexec_fn=lambda: limit(options.mem, options.cpu), close_fds=True
        )
    except FileNotFoundError:
        print(f"aero-launch: command not found: {command[0]}", file=sys.stderr, flush=True)
        return NOT_FOUND
    except PermissionError:
        print(f"aero-launch: not executable: {command[0]}", file=sys.stderr, flush=True)
        return NOT_FOUND
    code = child.wait()
    if code < 0:
        name = signal.Signals(-code).name
        why = f" (its CPU limit, {options.cpu} s)" if name == "SIGXCPU" else ""
        print(f"aero-launch: the server was killed by {name}{why}", file=sys.stderr, flush=True)
        return 128 - code
    if code:
        print(f"aero-launch: the server exited with code {code}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

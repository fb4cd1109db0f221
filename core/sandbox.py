"""Run model-written Python in a separate, resource-limited process.

Model output is untrusted, so code runs in a child interpreter with a scrubbed environment (no API
keys), a throwaway working directory, memory/CPU/file-size limits and a wall-clock timeout that kills
the whole process group. This is damage limitation, not a jail: the child still runs as the same
user and can read and write whatever that user can outside its working directory.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass

__all__ = ["SandboxResult", "arun_python", "extract_code_blocks", "run_python"]

_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
_PYTHON_TAGS = {"", "python", "py", "python3"}

_FILE_SIZE_LIMIT = 10 * 1024 * 1024
_TRUNCATED = "[... truncated]"
_SIGNAL_HINTS = {
    signal.SIGKILL: "killed",
    signal.SIGXCPU: "CPU time limit exceeded",
    signal.SIGXFSZ: "output/file size limit exceeded",
    signal.SIGSEGV: "segmentation fault",
}

# Limits are applied by a tiny launcher that then execs the real interpreter. Doing this in a
# preexec_fn is unsafe when run_python is called from several threads (the forked child can deadlock
# on locks held by other threads); the launcher avoids Python code between fork and exec entirely.
_LAUNCHER = """
import os, resource, sys

def lower(res, soft, hard):
    _, cur_hard = resource.getrlimit(res)
    if cur_hard != resource.RLIM_INFINITY:
        hard = min(hard, cur_hard)
    resource.setrlimit(res, (min(soft, hard), hard))

mem, cpu, fsize, script = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lower(resource.RLIMIT_AS, mem, mem)
lower(resource.RLIMIT_CPU, cpu, cpu + 1)
lower(resource.RLIMIT_FSIZE, fsize, fsize)
lower(resource.RLIMIT_CORE, 0, 0)
os.execv(sys.executable, [sys.executable, "-I", "-B", "-X", "utf8", script])
"""


def extract_code_blocks(text: str) -> list[str]:
    """Return the code of fenced blocks tagged python/py (or untagged), in order of appearance.

    Blocks tagged with another language (```bash, ```output) are skipped so tool results echoed
    back into the transcript are never re-executed.
    """
    blocks = []
    for match in _FENCE_RE.finditer(text or ""):
        if match.group(1).lower() in _PYTHON_TAGS:
            blocks.append(textwrap.dedent(match.group(2)).rstrip("\n"))
    return blocks


def _truncate(text: str, limit: int) -> str:
    """Keep the head and the tail (where tracebacks end) and mark the cut."""
    if len(text) <= limit:
        return text
    marker = f"\n{_TRUNCATED}\n"
    room = max(limit - len(marker), 0)
    head = room * 2 // 3
    tail = room - head
    return text[:head] + marker + (text[-tail:] if tail else "")


@dataclass
class SandboxResult:
    """Outcome of one sandboxed run; exit_code is None when the run was killed for timing out."""

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    timeout_s: float = 0.0
    max_output_chars: int = 4000

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def status_note(self) -> str:
        if self.timed_out:
            return f"[timed out after {self.timeout_s:g} s]"
        if self.exit_code is None or self.exit_code == 0:
            return ""
        if self.exit_code < 0:
            sig = -self.exit_code
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"signal {sig}"
            hint = _SIGNAL_HINTS.get(sig)
            return f"[killed by {name}{': ' + hint if hint else ''}]"
        return f"[exit code {self.exit_code}]"

    def as_text(self) -> str:
        """What the model sees: stdout, then stderr, then a status note, within max_output_chars."""
        parts = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append("[stderr]\n" + self.stderr.rstrip("\n"))
        body = "\n".join(parts)
        note = self.status_note()
        if not body and not note:
            return "[no output]"
        body = _truncate(body, max(self.max_output_chars - len(note) - 1, 0))
        return "\n".join(p for p in (body, note) if p)


def _child_env(workdir: str) -> dict[str, str]:
    """An allow-list environment: nothing from the parent leaks (API keys, tokens, proxies)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }


def _read_capped(fileobj, max_chars: int) -> str:
    """Read a possibly huge output file without loading all of it; keeps head and tail."""
    cap = max_chars * 4 + 1024
    size = fileobj.seek(0, os.SEEK_END)
    fileobj.seek(0)
    if size <= 2 * cap:
        data = fileobj.read()
    else:
        head = fileobj.read(cap)
        fileobj.seek(size - cap)
        data = head + f"\n{_TRUNCATED}\n".encode() + fileobj.read(cap)
    return data.decode("utf-8", errors="replace")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_python(
    code: str, *, timeout_s: float = 10.0, memory_mb: int = 512, max_output_chars: int = 4000
) -> SandboxResult:
    """Execute untrusted Python in a fresh, limited child process and capture its output.

    Safe to call from several threads at once; each call gets its own process group, working
    directory and output files.
    """
    cpu_limit = max(1, math.ceil(timeout_s) + 1)
    with (
        tempfile.TemporaryDirectory(prefix="sandbox-") as workdir,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        script = os.path.join(workdir, "main.py")
        with open(script, "w", encoding="utf-8") as fh:
            fh.write(code)
        limits = [str(memory_mb * 1024 * 1024), str(cpu_limit), str(_FILE_SIZE_LIMIT)]
        cmd = [sys.executable, "-I", "-c", _LAUNCHER, *limits, script]
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            env=_child_env(workdir),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            close_fds=True,
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # Also reaps anything the code left running in the background.
            _kill_group(proc.pid)
            proc.wait()
        return SandboxResult(
            stdout=_read_capped(out, max_output_chars),
            stderr=_read_capped(err, max_output_chars),
            exit_code=None if timed_out else proc.returncode,
            timed_out=timed_out,
            timeout_s=timeout_s,
            max_output_chars=max_output_chars,
        )


async def arun_python(
    code: str, *, timeout_s: float = 10.0, memory_mb: int = 512, max_output_chars: int = 4000
) -> SandboxResult:
    """Async wrapper so an event loop is never blocked while the child runs."""
    return await asyncio.to_thread(
        run_python, code, timeout_s=timeout_s, memory_mb=memory_mb, max_output_chars=max_output_chars
    )

"""Run model-written Python inside a bubblewrap jail.

Model output is untrusted, so each run happens in a child interpreter launched through bubblewrap
(`bwrap`) with its own user, pid, network, ipc, uts and cgroup namespaces: it sees a read-only
system (/usr and the Python installation), a fresh /proc that lists only its own processes, a
minimal read-only /dev, no network at all and no project folder, database, home or host /tmp. The
only writable place is a size-limited tmpfs at /tmp. It runs as an unprivileged user with a
scrubbed environment, under memory/CPU/file-size/process-count limits and a wall-clock timeout;
killing the jail's init process ends every process inside it. Without a working bwrap, python mode
refuses to run rather than fall back to something weaker (see `require_jail`).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import json
import math
import os
import re
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from core.errors import InvalidInput

__all__ = [
    "JailStatus",
    "SandboxResult",
    "arun_python",
    "extract_code_blocks",
    "harden_process",
    "jail_status",
    "require_jail",
    "run_python",
]

_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
_PYTHON_TAGS = {"", "python", "py", "python3"}

BWRAP_PATH = "/usr/bin/bwrap"
SANDBOX_UID = 65534
SANDBOX_GID = 65534
# Processes plus threads of one run (RLIMIT_NPROC, counted per jail): stops a fork bomb at once
# and still leaves room for a small pool. With 512 MB of address space each, a run's worst case stays
# near 8 GB; only a cgroup could bound the sum.
PROCESS_LIMIT = 16
# Everything a run may write (the tmpfs at /tmp, which lives in RAM until the jail ends): room for
# several files of the per-file limit, little enough for many runs in parallel.
DISK_LIMIT = 64 * 1024 * 1024
_FILE_SIZE_LIMIT = 10 * 1024 * 1024
_HANDSHAKE_TIMEOUT_S = 10.0
_PROJECT_DIR = Path(__file__).resolve().parents[2]
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives")
_BWRAP_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
_PR_SET_DUMPABLE = 4
_TRUNCATED = "[... truncated]"
_SIGNAL_HINTS = {
    signal.SIGKILL: "killed",
    signal.SIGXCPU: "CPU time limit exceeded",
    signal.SIGXFSZ: "output/file size limit exceeded",
    signal.SIGSEGV: "segmentation fault",
}

# The launcher runs inside the jail and execs the real interpreter, so no Python code runs between
# fork and exec in the (threaded) parent. When the studio runs as root, bwrap leaves it uid 0 of
# the jail's own user namespace (see _RootMapping); it drops to the sandbox user before anything
# else, because the kernel exempts host root from RLIMIT_NPROC. It refuses to go on if its user is not
# mapped (a user namespace left without maps would run the code as host root under another name).
_LAUNCHER = """
import os, resource, sys

def lower(res, soft, hard):
    _, cur_hard = resource.getrlimit(res)
    if cur_hard != resource.RLIM_INFINITY:
        hard = min(hard, cur_hard)
    resource.setrlimit(res, (min(soft, hard), hard))

def mapped(uid):
    with open("/proc/self/uid_map") as fh:
        for line in fh:
            inside, _, count = map(int, line.split())
            if inside <= uid < inside + count:
                return True
    return False

mem, cpu, fsize, nproc, uid, gid = map(int, sys.argv[1:7])
script = sys.argv[7]
if os.getuid() == 0:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
if os.getuid() != uid or not mapped(uid):
    sys.exit("sandbox: refusing to run without an unprivileged sandbox user")
lower(resource.RLIMIT_AS, mem, mem)
lower(resource.RLIMIT_CPU, cpu, cpu + 1)
lower(resource.RLIMIT_FSIZE, fsize, fsize)
lower(resource.RLIMIT_NPROC, nproc, nproc)
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
            hint = _SIGNAL_HINTS.get(-self.exit_code)
            return f"[killed by {signal_name(-self.exit_code)}{': ' + hint if hint else ''}]"
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


def child_environment(**extra: str) -> dict[str, str]:
    """An allow-list environment for a child that runs untrusted input (model code here, patterns and
    answers in core/domain/scoring.py): nothing from the parent leaks (API keys, tokens, proxies)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **extra}


def _child_env(workdir: str) -> dict[str, str]:
    return child_environment(HOME=workdir, TMPDIR=workdir, MPLBACKEND="Agg")


def signal_name(number: int) -> str:
    """"SIGKILL" for 9; "signal N" for a number Python has no name for."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


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
    """Kill bwrap's process group: the jail's init dies with bwrap (--die-with-parent) and the kernel
    then kills every process left in the jail's pid namespace, setsid or not."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _exit_code(returncode: int) -> int:
    """bwrap reports a child killed by signal N as 128+N, like a shell; turn that back into -N."""
    if returncode > 128:
        try:
            return -signal.Signals(returncode - 128).value
        except ValueError:
            pass
    return returncode


def harden_process() -> bool:
    """Make this process non-dumpable, so other processes of the same user can neither attach to it
    nor read its /proc/<pid>/environ or mem (API keys). False where that is unavailable (not Linux).

    Once per process, at its start: `python -m core` (the CLI and the worker), worker.serve and the app.
    Jailed code needs no call per run: its own pid namespace shows it no other process."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def _private_dirs() -> tuple[Path, ...]:
    return (_PROJECT_DIR, Path.home(), Path(tempfile.gettempdir()))


def _python_roots() -> list[tuple[str, str]]:
    """(host source, jail path) of the Python installation that runs the studio: its virtualenv and
    base installation, unless /usr already holds them. Refuses a root that would also expose the
    project, home or temp folder (a virtualenv created in the project folder itself, say)."""
    seen = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            str(Path(os.path.realpath(sys.executable)).parent.parent)}
    roots: list[tuple[str, str]] = []
    for dest in sorted(os.path.abspath(p) for p in seen if p):
        if any(Path(dest).is_relative_to(done) for done in ["/usr", *(d for _, d in roots)]):
            continue
        exposed = [str(d) for d in _private_dirs() if d.resolve().is_relative_to(os.path.realpath(dest))]
        if exposed:
            raise InvalidInput(f"python mode cannot isolate model-written code: the Python installation at "
                               f"{dest} contains {exposed[0]}; use a virtual environment outside it")
        roots.append((os.path.realpath(dest), dest))
    return roots


def _parent_dirs_args(path: str) -> list[str]:
    """Create the parents of a bind target traversable; bwrap would copy the host's modes, and /root
    (0700) would hide a Python installed under it from the sandbox user."""
    args = []
    for parent in reversed(Path(path).parents[:-1]):
        args += ["--perms", "0755", "--dir", str(parent)]
    return args


@functools.cache
def _system_args() -> tuple[str, ...]:
    """Read-only binds of what the interpreter needs: /usr and the merged-/usr links, the dynamic
    loader's files and the Python installation; nothing else of the host is visible."""
    args = ["--ro-bind", "/usr", "/usr"]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in _ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for source, dest in _python_roots():
        args += [*_parent_dirs_args(dest), "--ro-bind", source, dest]
    return tuple(args)


def _jail_args(workdir: str, script_fd: int, as_root: bool) -> list[str]:
    """bwrap options for one run: every namespace new (no network), a read-only system, a fresh /proc,
    a read-only minimal /dev and a size-limited tmpfs at /tmp as the only writable place."""
    if as_root:
        identity = ["--uid", "0", "--gid", "0"]
    else:
        identity = ["--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    env = [arg for name, value in _child_env(workdir).items() for arg in ("--setenv", name, value)]
    return [
        "--unshare-all", "--unshare-user", *identity, "--die-with-parent", "--new-session",
        "--hostname", "sandbox",
        # The tmpfs first: a Python installed under /tmp (a CI checkout's virtualenv) is bound over it.
        "--perms", "1777", "--size", str(DISK_LIMIT), "--tmpfs", "/tmp", *_system_args(),
        "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
        "--perms", "1777", "--dir", workdir,
        "--perms", "0444", "--file", str(script_fd), f"{workdir}/main.py",
        "--chdir", workdir, "--remount-ro", "/",
        "--clearenv", *env,
    ]


def _read_all(fd: int, timeout_s: float) -> bytes:
    """Read a pipe to its end, but give up after timeout_s so a stuck bwrap cannot hang the caller."""
    data = b""
    while True:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        if not ready:
            raise TimeoutError("bwrap did not report its child")
        chunk = os.read(fd, 4096)
        if not chunk:
            return data
        data += chunk


class _RootMapping:
    """How a jail started by root gets an unprivileged user. bwrap waits (--userns-block-fd) while this
    process writes the jail's user map: host root, which bwrap's own setup needs (to bind a Python
    under /root, say), and SANDBOX_UID, to which the launcher then drops. Without it the code would
    run as host root, which the kernel exempts from RLIMIT_NPROC. A studio not running as root needs
    none of this: bwrap maps the sandbox user to the caller itself."""

    def __init__(self, active: bool) -> None:
        self.active = active
        self._fds: dict[str, int] = {}
        if active:
            self._fds["info_r"], self._fds["info_w"] = os.pipe()
            self._fds["block_r"], self._fds["block_w"] = os.pipe()

    def __enter__(self) -> _RootMapping:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._close(*self._fds)

    def _close(self, *names: str) -> None:
        for name in names:
            fd = self._fds.pop(name, None)
            if fd is not None:
                os.close(fd)

    def args(self) -> list[str]:
        if not self.active:
            return []
        return ["--info-fd", str(self._fds["info_w"]), "--userns-block-fd", str(self._fds["block_r"])]

    def child_fds(self) -> tuple[int, ...]:
        return (self._fds["info_w"], self._fds["block_r"]) if self.active else ()

    def release(self) -> None:
        """Write the maps of the jail's user namespace, then let bwrap go on; raises if that fails,
        and the caller must then kill bwrap rather than let it continue unmapped."""
        if not self.active:
            return
        self._close("info_w", "block_r")
        pid = int(json.loads(_read_all(self._fds["info_r"], _HANDSHAKE_TIMEOUT_S))["child-pid"])
        for name, jail_id in (("uid_map", SANDBOX_UID), ("gid_map", SANDBOX_GID)):
            with open(f"/proc/{pid}/{name}", "w") as fh:
                fh.write(f"0 0 1\n{jail_id} {jail_id} 1\n")
        os.write(self._fds["block_w"], b"1")


def _spawn(bwrap: str, code: str, *, timeout_s: float, memory_mb: int, max_output_chars: int) -> SandboxResult:
    """One jailed run: bwrap sets the jail up, the launcher inside sets the limits and execs Python."""
    workdir = f"/tmp/sandbox-{secrets.token_hex(6)}"
    cpu_limit = max(1, math.ceil(timeout_s) + 1)
    limits = [memory_mb * 1024 * 1024, cpu_limit, _FILE_SIZE_LIMIT, PROCESS_LIMIT, SANDBOX_UID, SANDBOX_GID]
    as_root = os.geteuid() == 0
    with (
        tempfile.TemporaryFile() as script,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        _RootMapping(as_root) as mapping,
    ):
        script.write(code.encode("utf-8"))
        script.flush()
        script.seek(0)
        cmd = [bwrap, *mapping.args(), *_jail_args(workdir, script.fileno(), as_root), "--",
               sys.executable, "-I", "-c", _LAUNCHER, *map(str, limits), f"{workdir}/main.py"]
        proc = subprocess.Popen(
            cmd,
            cwd="/",
            env=_BWRAP_ENV,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            close_fds=True,
            pass_fds=(script.fileno(), *mapping.child_fds()),
        )
        timed_out = False
        setup_error = ""
        try:
            mapping.release()
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        except (OSError, ValueError, KeyError, TypeError) as exc:
            setup_error = f"\nsandbox: could not set up the jail's user ({exc})"
        finally:
            _kill_group(proc.pid)
            proc.wait()
        return SandboxResult(
            stdout=_read_capped(out, max_output_chars),
            stderr=_read_capped(err, max_output_chars) + setup_error,
            exit_code=None if timed_out else _exit_code(proc.returncode),
            timed_out=timed_out,
            timeout_s=timeout_s,
            max_output_chars=max_output_chars,
        )


@dataclass(frozen=True)
class JailStatus:
    """Whether python mode can isolate code here; `message` says what to install or enable if not."""

    available: bool
    message: str = ""


_WORKING_JAILS: dict[str, JailStatus] = {}
_USERNS_SYSCTLS = (
    ("kernel/unprivileged_userns_clone", "0", "sysctl -w kernel.unprivileged_userns_clone=1"),
    ("user/max_user_namespaces", "0", "sysctl -w user.max_user_namespaces=10000"),
    ("kernel/apparmor_restrict_unprivileged_userns", "1", "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"),
)


def _userns_fixes() -> list[str]:
    """The sysctls that currently forbid unprivileged user namespaces, as the commands that allow them."""
    fixes = []
    for name, blocking, fix in _USERNS_SYSCTLS:
        try:
            value = Path("/proc/sys", name).read_text().strip()
        except OSError:
            continue
        if value == blocking:
            fixes.append(fix)
    return fixes


def _probe_failure(result: SandboxResult) -> str:
    """One line from the failed probe: bwrap's own complaint if any, and the sysctl to change when
    user namespaces are what is missing."""
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    own = [line for line in lines if line.startswith("bwrap:")]
    detail = (own or lines[-1:] or [result.status_note() or "no output"])[0]
    if "unknown option" in detail.lower():
        return f"python mode cannot start its bubblewrap sandbox ({detail}): it needs bubblewrap 0.8.0 or newer"
    fixes = _userns_fixes()
    if fixes or "namespace" in detail.lower():
        fix = " and ".join(fixes) or "sysctl -w kernel.unprivileged_userns_clone=1"
        return f"python mode cannot start its bubblewrap sandbox ({detail}): enable user namespaces ({fix})"
    return f"python mode cannot start its bubblewrap sandbox ({detail})"


def _probe(bwrap: str) -> JailStatus:
    """Run a trivial program in the real jail; a failure says what to fix."""
    if not sys.platform.startswith("linux"):
        return JailStatus(False, "python mode needs Linux with bubblewrap to isolate model-written code; "
                                 "use direct mode on this system")
    if not os.access(bwrap, os.X_OK):
        return JailStatus(False, f"python mode needs bubblewrap to isolate model-written code and {bwrap} "
                                 "is missing: install it (apt-get install bubblewrap)")
    try:
        result = _spawn(bwrap, "print('jail ok')", timeout_s=10.0, memory_mb=512, max_output_chars=2000)
    except InvalidInput as exc:
        return JailStatus(False, str(exc))
    if result.ok and result.stdout == "jail ok\n":
        return JailStatus(True)
    return JailStatus(False, _probe_failure(result))


def jail_status() -> JailStatus:
    """Whether model-written code can be jailed on this machine. A working jail is probed once per
    process; a failure is probed again next time, so installing bwrap needs no restart."""
    status = _WORKING_JAILS.get(BWRAP_PATH)
    if status is None:
        status = _probe(BWRAP_PATH)
        if status.available:
            _WORKING_JAILS[BWRAP_PATH] = status
    return status


def require_jail() -> None:
    """Raise InvalidInput, saying what to install or enable, unless the jail works here. Python mode
    has no weaker fallback: without the jail it refuses to start."""
    status = jail_status()
    if not status.available:
        raise InvalidInput(status.message)


def run_python(
    code: str, *, timeout_s: float = 10.0, memory_mb: int = 512, max_output_chars: int = 4000
) -> SandboxResult:
    """Execute untrusted Python in a fresh jail and capture its output.

    Safe to call from several threads at once; each call gets its own jail, working directory and
    output files. Raises InvalidInput when the jail is unavailable (see require_jail).
    """
    require_jail()
    return _spawn(BWRAP_PATH, code, timeout_s=timeout_s, memory_mb=memory_mb, max_output_chars=max_output_chars)


async def arun_python(
    code: str, *, timeout_s: float = 10.0, memory_mb: int = 512, max_output_chars: int = 4000
) -> SandboxResult:
    """Async wrapper so an event loop is never blocked while the child runs."""
    return await asyncio.to_thread(
        run_python, code, timeout_s=timeout_s, memory_mb=memory_mb, max_output_chars=max_output_chars
    )

import asyncio
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from core.domain import sandbox
from core.domain.sandbox import SandboxResult, arun_python, extract_code_blocks, run_python
from core.errors import InvalidInput

PROJECT_DIR = Path(__file__).resolve().parent.parent


# What runs no code in the jail (text handling, the refusals, hardening); every other test needs it.
NO_JAIL_NEEDED = {"test_as_text_notes", "test_extract_code_blocks",
                  "test_extract_code_blocks_ignores_unclosed_and_empty_text",
                  "test_python_mode_refuses_without_bubblewrap",
                  "test_refusal_names_the_sysctl_when_user_namespaces_are_disabled",
                  "test_python_mode_agent_refuses_before_calling_the_model",
                  "test_harden_process_makes_the_process_non_dumpable"}


@pytest.fixture(autouse=True)
def _needs_the_jail(request):
    if request.node.name not in NO_JAIL_NEEDED:
        request.getfixturevalue("jail")


def test_prints_output():
    result = run_python("print(6 * 7)")
    assert result.stdout == "42\n"
    assert result.stderr == ""
    assert result.exit_code == 0
    assert result.timed_out is False
    assert result.as_text() == "42"


def test_exception_gives_stderr_and_exit_code():
    result = run_python("print('before')\nraise ValueError('bad value')")
    assert result.exit_code == 1
    assert "ValueError: bad value" in result.stderr
    text = result.as_text()
    assert text.startswith("before\n[stderr]\nTraceback")
    assert text.endswith("[exit code 1]")


def test_stdin_is_closed():
    result = run_python("print(input())")
    assert "EOFError" in result.stderr


def test_infinite_loop_times_out():
    start = time.monotonic()
    result = run_python("while True:\n    pass", timeout_s=1)
    elapsed = time.monotonic() - start
    assert result.timed_out is True
    assert result.exit_code is None
    assert elapsed < 3
    assert result.as_text() == "[timed out after 1 s]"


def test_sleeping_code_times_out_and_background_children_are_killed():
    token = f"bg-child-{uuid.uuid4().hex}"
    code = (
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{token}'])\n"
        "import time; time.sleep(60)\n"
    )
    start = time.monotonic()
    try:
        result = run_python(code, timeout_s=1)
        assert time.monotonic() - start < 3
        assert result.timed_out
        assert _wait_until_gone(token) == []
    finally:
        _kill_all(token)


def _host_pids_with(token: str) -> list[int]:
    """Host processes whose command line holds token (pids inside the jail mean nothing out here)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if token.encode() in fh.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def _wait_until_gone(token: str, seconds: float = 2.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (pids := _host_pids_with(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def _kill_all(token: str) -> None:
    for pid in _host_pids_with(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_memory_bomb_is_stopped():
    start = time.monotonic()
    result = run_python("x = bytearray(4 * 1024 ** 3)\nprint('allocated')", memory_mb=256, timeout_s=5)
    assert time.monotonic() - start < 5
    assert not result.timed_out
    assert result.exit_code != 0
    assert "MemoryError" in result.stderr
    assert "allocated" not in result.stdout


def test_scientific_stack_imports_under_memory_limit():
    result = run_python("import numpy as np\nprint(int(np.arange(5).sum()))")
    assert result.stdout.strip() == "10", result.as_text()


def test_environment_does_not_leak(monkeypatch):
    monkeypatch.setenv("FAKE_API_KEY", "sk-should-not-leak")
    result = run_python("import os\nprint(os.environ.get('FAKE_API_KEY'))\nprint(sorted(os.environ))")
    lines = result.stdout.splitlines()
    assert lines[0] == "None"
    assert "FAKE_API_KEY" not in lines[1]
    assert "sk-should-not-leak" not in result.stdout


def test_output_is_truncated():
    result = run_python("print('x' * 100_000)\nprint('END')", max_output_chars=500)
    text = result.as_text()
    assert len(text) <= 500
    assert "[... truncated]" in text
    assert text.startswith("xxx")
    assert text.endswith("END")


def test_output_flood_is_bounded():
    result = run_python("while True:\n    print('y' * 10_000)", timeout_s=5, max_output_chars=1000)
    assert len(result.stdout) < 20_000
    assert len(result.as_text()) <= 1000


def test_cwd_is_fresh_temp_dir_and_removed():
    result = run_python("import os\nprint(os.getcwd())\nopen('scratch.txt', 'w').write('hi')")
    cwd = result.stdout.strip()
    assert os.path.basename(cwd).startswith("sandbox-")
    assert cwd != os.getcwd()
    assert not os.path.exists(cwd)


def test_concurrent_calls_are_isolated():
    codes = [f"import os\nprint({i}, os.getcwd())" for i in range(6)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(run_python, codes))
    assert [r.stdout.split()[0] for r in results] == [str(i) for i in range(6)]
    assert len({r.stdout.split()[1] for r in results}) == 6


def test_arun_python():
    result = asyncio.run(arun_python("print('async ok')", timeout_s=5))
    assert result.stdout == "async ok\n"


def test_as_text_notes():
    assert SandboxResult("", "", 0, False).as_text() == "[no output]"
    assert SandboxResult("", "", -9, False).as_text() == "[killed by SIGKILL: killed]"
    assert SandboxResult("hi\n", "", None, True, timeout_s=2.5).as_text() == "hi\n[timed out after 2.5 s]"


def test_extract_code_blocks():
    text = (
        "Let me compute.\n"
        "```python\nx = 1\nprint(x)\n```\n"
        "Some shell:\n"
        "```bash\nls -la\n```\n"
        "```output\n1\n```\n"
        "```py\nprint(2)\n```\n"
        "```\nprint(3)\n```\n"
        "  ```Python\n  if True:\n      print(4)\n  ```\n"
    )
    assert extract_code_blocks(text) == ["x = 1\nprint(x)", "print(2)", "print(3)", "if True:\n    print(4)"]


def test_extract_code_blocks_ignores_unclosed_and_empty_text():
    assert extract_code_blocks("```python\nprint('never closed')") == []
    assert extract_code_blocks("") == []


def test_signal_deaths_are_reported_as_signals():
    result = run_python("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert result.exit_code == -signal.SIGSEGV
    assert result.as_text() == "[killed by SIGSEGV: segmentation fault]"


# The jail: each test below shows one thing model-written code could do before bubblewrap.


def test_code_cannot_read_the_environment_or_memory_of_other_processes(monkeypatch):
    secret = f"sk-parent-{uuid.uuid4().hex}"
    monkeypatch.setenv("FAKE_API_KEY", secret)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                              env={**os.environ, "HOLDER_KEY": secret})
    code = textwrap.dedent(f"""
        import glob, os
        paths = ["/proc/%d/environ" % os.getppid(), "/proc/{os.getpid()}/environ",
                 "/proc/{holder.pid}/environ", *glob.glob("/proc/*/environ")]
        for path in paths:
            try:
                if b"{secret}" in open(path, "rb").read():
                    print("LEAK", path)
            except OSError:
                pass
        try:
            maps = open("/proc/{holder.pid}/maps").read().splitlines()
            stack = next(line for line in maps if line.endswith("[stack]"))
            low, high = (int(x, 16) for x in stack.split()[0].split("-"))
            with open("/proc/{holder.pid}/mem", "rb") as mem:
                mem.seek(low)
                if b"{secret}" in mem.read(high - low):
                    print("LEAK mem")
        except (OSError, StopIteration):
            pass
        print("done")
    """)
    try:
        time.sleep(0.2)
        result = run_python(code, timeout_s=5)
    finally:
        holder.kill()
        holder.wait()
    assert result.stdout.endswith("done\n"), result.as_text()
    assert "LEAK" not in result.stdout
    assert secret not in result.stdout + result.stderr


def test_code_cannot_read_the_database_or_the_project_folder(tmp_path):
    database = tmp_path / "studio.db"
    database.write_bytes(b"SQLite format 3\x00 api_key=sk-in-the-database")
    files = [database, PROJECT_DIR / "README.md", PROJECT_DIR / "core" / "settings.py"]
    home = Path.home()
    code = textwrap.dedent(f"""
        import json, os
        seen = {{}}
        for path in {[str(f) for f in files]!r}:
            try:
                open(path, "rb").read()
                seen[path] = "opened"
            except OSError as exc:
                seen[path] = type(exc).__name__
        for path in [{str(PROJECT_DIR)!r}, {str(home)!r}]:
            try:
                seen[path] = sorted(os.listdir(path))
            except OSError:
                seen[path] = []
        print(json.dumps(seen))
    """)
    result = run_python(code)
    assert result.ok, result.as_text()
    seen = json.loads(result.stdout)
    assert [seen[str(f)] for f in files] == ["FileNotFoundError"] * len(files)
    # Only the mount points of the (read-only) Python installation may show, nothing of their own.
    assert set(seen[str(PROJECT_DIR)]) <= _python_mount_points(PROJECT_DIR)
    assert set(seen[str(home)]) <= _python_mount_points(home)


def _python_mount_points(folder: Path) -> set[str]:
    inside = [Path(p) for p in (sys.prefix, sys.base_prefix) if Path(p).is_relative_to(folder)]
    return {p.relative_to(folder).parts[0] for p in inside if p != folder}


def test_code_cannot_write_outside_its_temp_dir(tmp_path):
    database = tmp_path / "studio.db"
    database.write_bytes(b"original")
    outside = tmp_path / "outside"
    outside.mkdir()
    name = f"sandbox-escape-{uuid.uuid4().hex}"
    # Host paths only, each removed afterwards: run unjailed (as before bubblewrap) this plants them.
    targets = [outside / name, PROJECT_DIR / name, Path("/") / name, Path("/usr") / name, Path("/dev/shm") / name]
    code = textwrap.dedent(f"""
        for path in {[str(t) for t in targets]!r}:
            try:
                with open(path, "w") as fh:
                    fh.write("x")
                print("WROTE", path)
            except OSError as exc:
                print("DENIED", path, type(exc).__name__)
        try:
            with open({str(database)!r}, "ab") as fh:
                fh.write(b"tampered")
            print("WROTE database")
        except OSError as exc:
            print("DENIED database", type(exc).__name__)
        open("scratch.txt", "w").write("fine")
        open("/tmp/scratch.txt", "w").write("fine")
        print("own temp ok")
    """)
    try:
        result = run_python(code)
    finally:
        for target in targets:
            target.unlink(missing_ok=True)
    assert "WROTE" not in result.stdout, result.as_text()
    assert result.stdout.count("DENIED") == len(targets) + 1
    assert "own temp ok" in result.stdout
    assert database.read_bytes() == b"original"
    assert list(outside.iterdir()) == []


def test_code_cannot_open_network_connections():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        code = textwrap.dedent(f"""
            import socket
            for address in [("127.0.0.1", {port}), ("1.1.1.1", 53)]:
                try:
                    socket.create_connection(address, timeout=1).close()
                    print("CONNECTED", address)
                except OSError as exc:
                    print("BLOCKED", address, type(exc).__name__)
        """)
        result = run_python(code, timeout_s=5)
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()
    assert "CONNECTED" not in result.stdout, result.as_text()
    assert result.stdout.count("BLOCKED") == 2


def test_no_process_outlives_the_time_limit_even_after_setsid():
    token = f"setsid-survivor-{uuid.uuid4().hex}"
    survivor = "print('grandchild up', flush=True); import time; time.sleep(30)"
    code = textwrap.dedent(f"""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", {survivor!r}, "{token}"])
            os._exit(0)
        time.sleep(60)
    """)
    try:
        start = time.monotonic()
        result = run_python(code, timeout_s=1)
        assert time.monotonic() - start < 3
        assert result.timed_out
        assert "grandchild up" in result.stdout
        assert _wait_until_gone(token) == []
    finally:
        _kill_all(token)


def test_fork_loop_is_stopped_by_the_process_limit():
    code = textwrap.dedent("""
        import os, time
        n = 0
        try:
            while n < 200:
                if os.fork() == 0:
                    time.sleep(3)
                    os._exit(0)
                n += 1
            print("forked", n)
        except OSError as exc:
            print("stopped", n, exc.errno)
    """)
    start = time.monotonic()
    result = run_python(code, timeout_s=5)
    assert time.monotonic() - start < 3
    assert result.stdout.startswith("stopped"), result.as_text()
    _, count, code_ = result.stdout.split()
    assert int(count) < sandbox.PROCESS_LIMIT
    assert int(code_) == errno.EAGAIN


def test_total_disk_use_is_limited():
    code = textwrap.dedent("""
        import errno, os
        chunk = b"x" * (4 * 1024 * 1024)
        total = 0
        try:
            for i in range(50):
                with open(f"part-{i}.bin", "wb") as fh:
                    fh.write(chunk)
                total += len(chunk)
            print("wrote", total, 0)
        except OSError as exc:
            print("stopped", total, exc.errno)
    """)
    result = run_python(code, timeout_s=10)
    assert result.stdout.startswith("stopped"), result.as_text()
    _, total, code_ = result.stdout.split()
    assert int(total) <= sandbox.DISK_LIMIT
    assert int(code_) == errno.ENOSPC


def test_python_mode_refuses_without_bubblewrap(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "BWRAP_PATH", str(tmp_path / "bwrap"))
    status = sandbox.jail_status()
    assert not status.available
    assert "apt-get install bubblewrap" in status.message and "\n" not in status.message
    with pytest.raises(InvalidInput, match="apt-get install bubblewrap"):
        sandbox.require_jail()
    with pytest.raises(InvalidInput, match="apt-get install bubblewrap"):
        run_python("print('must not run')")


def test_refusal_names_the_sysctl_when_user_namespaces_are_disabled(tmp_path, monkeypatch):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace, likely because the kernel "
                    "does not allow non-privileged user namespaces.' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox, "BWRAP_PATH", str(fake))
    status = sandbox.jail_status()
    assert not status.available
    assert "sysctl -w" in status.message and "user namespaces" in status.message
    assert "\n" not in status.message


def test_python_mode_agent_refuses_before_calling_the_model(engine, tmp_path, monkeypatch):
    from core.grpo.agent import AgentSettings, run_agent
    from core.models.gateway import Gateway, Scope
    from tests.conftest import ScriptedModel

    monkeypatch.setattr(sandbox, "BWRAP_PATH", str(tmp_path / "bwrap"))
    model = ScriptedModel({"rollout": "```python\nprint(1)\n```"})
    with pytest.raises(InvalidInput, match="bubblewrap"):
        asyncio.run(run_agent(Gateway(engine, mock=model), AgentSettings(model="openai/gpt-4o-mini", mode="python"),
                              instructions="", answer_format="", experiences=[], query="1+1?", sample_index=0,
                              scope=Scope()))
    assert model.calls == []


def test_harden_process_makes_the_process_non_dumpable():
    code = ("import ctypes\nfrom core.domain.sandbox import harden_process\n"
            "print(harden_process(), ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))")
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_DIR, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "0"]

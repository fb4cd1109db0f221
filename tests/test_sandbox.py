import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor

from core.sandbox import SandboxResult, arun_python, extract_code_blocks, run_python


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
    code = (
        "import subprocess, sys\n"
        "p = subprocess.Popen(['sleep', '60'])\n"
        "print(p.pid, flush=True)\n"
        "import time; time.sleep(60)\n"
    )
    start = time.monotonic()
    result = run_python(code, timeout_s=1)
    assert time.monotonic() - start < 3
    assert result.timed_out
    child_pid = int(result.stdout.split()[0])
    time.sleep(0.2)
    assert _proc_state(child_pid) in {"gone", "Z"}


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0]
    except FileNotFoundError:
        return "gone"


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

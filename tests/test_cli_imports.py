"""The command line answers `--help` and a usage mistake before anything heavy loads (issue 35): its parser
imports no litellm, scipy, sympy, math-verify, Streamlit or llama.cpp, which a command imports when it runs.
Checked on the import graph of a fresh process, not on the clock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("litellm", "scipy", "sympy", "math_verify", "streamlit", "xllamacpp")

# Runs `python -m core ARGS` as __main__ does, then prints on its last stderr line which heavy modules it loaded.
AS_MAIN = f"""
import json, runpy, sys
sys.argv = ["python -m core", *sys.argv[1:]]
try:
    runpy.run_module("core", run_name="__main__", alter_sys=True)
except SystemExit as stop:
    code = stop.code
sys.stderr.write("\\n" + json.dumps({{"code": code, "heavy": [n for n in {HEAVY!r} if n in sys.modules]}}) + "\\n")
"""


def python(code: str, *args: str) -> subprocess.CompletedProcess:
    """`python -c CODE ARGS` in the environment a person starts it from: without the price-map variable this
    test process got when conftest imported core.models."""
    env = {name: value for name, value in os.environ.items() if name != "LITELLM_LOCAL_MODEL_COST_MAP"}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_building_the_parser_imports_no_heavy_library():
    probe = python(f"import sys, core.cli; core.cli.build_parser(); print([n for n in {HEAVY!r} if n in sys.modules])")
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"


@pytest.mark.parametrize("argv, code, stream, expected", [
    (["--help"], 0, "stdout", "usage: python -m core"),
    (["train", "--epochs", "x"], 2, "stderr", "error: python -m core train: argument --epochs: invalid int value: 'x'"),
])
def test_help_and_a_usage_mistake_answer_before_anything_heavy_loads(argv, code, stream, expected):
    probe = python(AS_MAIN, *argv)
    *output, verdict = probe.stderr.rstrip("\n").split("\n")
    assert json.loads(verdict) == {"code": code, "heavy": []}, probe.stderr
    assert expected in (probe.stdout if stream == "stdout" else "\n".join(output))


# Records LITELLM_LOCAL_MODEL_COST_MAP each time litellm itself is looked up, so an import that comes first
# from outside core.models (which sets it) would show up as None.
COST_MAP_AT_IMPORT = """
import os, sys
seen = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "litellm":
            seen.append(os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP"))
sys.meta_path.insert(0, Watch())
from core.records.connections import check_connection
check_connection("my-openai", "litellm", None, "openai", None, None)
print(seen)
"""


def test_litellm_loads_its_bundled_price_map_when_a_record_module_imports_it_first():
    """core.records.connections is the one module outside core.models that uses litellm: imported first, it
    must still leave litellm to read the price map it ships with instead of fetching one."""
    probe = python(COST_MAP_AT_IMPORT)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "['True']"

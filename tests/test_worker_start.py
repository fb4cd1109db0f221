"""What a worker's start costs before its first job (issue 52, item 6): the A/B guard's statistics (scipy) and the
webhook sender (httpx, the signing library) are not imported on the way to a run's first model call; on a
paper-scale run they were 1.2 s of CPU before every run's first call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = """
import json, sys
from storage.db import make_engine
from core.jobs.worker import serve
engine = make_engine(sys.argv[1])
serve(engine, once=True, poll=0.01)
print(json.dumps({name: name in sys.modules for name in ("scipy", "core.records.notifications.webhooks")}))
"""


def test_a_worker_with_nothing_to_do_imports_neither_the_guards_statistics_nor_the_webhook_sender(tmp_path):
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "TFGRPO_NO_AUTOWORKER": "1",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, f"sqlite:///{tmp_path / 'w.db'}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"scipy": False, "core.records.notifications.webhooks": False}

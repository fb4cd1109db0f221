"""The first run after the app starts shows no page list but the studio's own navigation.

A folder called `pages/` beside streamlit_app.py puts a fresh Streamlit process in its legacy multipage mode
(streamlit/runtime/pages_manager.py) until some session calls st.navigation: the script runner then runs
`_mpa_v1` (streamlit/runtime/scriptrunner/script_runner.py) instead of the entry script, which sends the browser
a navigation listing the entry script and every `pages/*.py` file by its file name, and only then runs
streamlit_app.py, whose st.navigation replaces that list after its imports and the database's preparation
(seconds on a cold start). That first list must not be shown, and it must hold no module that is not a page.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import PurePosixPath

from tests.ui_support import APP, ROOT

NAVIGATION = ["Overview", "Train", "Rollouts", "Review", "Library", "Evaluate", "Labeling", "Production", "Tasks",
              "People", "Notifications", "Models", "Audit"]

# A fresh process (Streamlit reads .streamlit/config.toml itself, nothing set by other tests) runs the app once
# as AppTest does, in the legacy mode a server starts in, and prints every navigation message sent to the browser.
COLD_RUN = """
import json, sys
from streamlit.proto.Navigation_pb2 import Navigation
from streamlit.runtime.forward_msg_queue import ForwardMsgQueue
from streamlit.testing.v1 import AppTest

sent = []

def record(msg):
    if msg.WhichOneof("type") == "navigation":
        sent.append({"position": Navigation.Position.Name(msg.navigation.position),
                     "titles": [p.page_name for p in msg.navigation.app_pages],
                     "paths": [p.url_pathname for p in msg.navigation.app_pages]})

ForwardMsgQueue.on_before_enqueue_msg(record)
at = AppTest.from_file(sys.argv[1], default_timeout=120).run()
assert not at.exception, [e.value for e in at.exception]
print(json.dumps(sent))
"""


def cold_navigation() -> list[dict]:
    """The navigation messages of the app's first run in a new process, in the order they are sent."""
    done = subprocess.run([sys.executable, "-c", COLD_RUN, str(APP)], cwd=ROOT, env=os.environ.copy(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def studio_page_names() -> set[str]:
    """The file names (without .py) of the pages in streamlit_app.PAGES, read from its source: a page listed by
    file (Streamlit's legacy list) is known by that name, a page of the studio's navigation by its URL path."""
    tree = ast.parse(APP.read_text(encoding="utf-8"))
    pages = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and [getattr(t, "id", None) for t in node.targets] == ["PAGES"])
    return {PurePosixPath(node.args[0].value).stem for node in ast.walk(pages)
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)}


def test_the_first_run_shows_only_the_studios_navigation(app_engine):
    sent = cold_navigation()
    assert sent, "the app sent no navigation"
    shown = [message["titles"] for message in sent if message["position"] != "HIDDEN"]
    assert shown == [NAVIGATION] * len(shown), f"a page list other than the studio's is shown: {shown}"
    assert sent[-1]["position"] == "SIDEBAR" and sent[-1]["titles"] == NAVIGATION
    # Every page of a list, shown or not, is a page of the studio or the entry script (whose path is ""): in the
    # legacy mode a listed file is also a URL that runs it, so a helper module in pages/ would be one.
    assert len(studio_page_names()) == len(NAVIGATION)
    studio = studio_page_names() | set(sent[-1]["paths"]) | {""}
    assert [sorted(set(m["paths"]) - studio) for m in sent] == [[]] * len(sent), "a listed module is no page"

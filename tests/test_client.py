"""The stand-alone client package (client/tfgrpo_client) against a stub of the studio's HTTP API, over real
HTTP on loopback: the library cache and its revalidation, what an agent gets while the studio is down, and
traces that survive outages, rate limits, invalid batches and process exit.

The stub speaks the contract the client relies on (Bearer key, ETag / If-None-Match / 304, `POST /v1/traces`
taking at most 100 traces, storing each id once, refusing an invalid batch whole with 422, 429 with
Retry-After); it can be stopped and started again on the same port to play "the studio comes back".
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from core.domain.selection import DEFAULT_K
from core.records.library.versions import export_version
from core.records.production.serving import ServedLibrary, ServedSelection

CLIENT_DIR = Path(__file__).resolve().parents[1] / "client"
sys.path.insert(0, str(CLIENT_DIR))

from tfgrpo_client import Client, ClientError, Library  # noqa: E402
from tfgrpo_client.library import render_prompt  # noqa: E402

KEY = "sk-test-4f1c9e"
TASK = "Bike shop"  # a space: the client must quote it in the path


class Stub:
    """The studio's API, as far as the client needs it, with a request log and switchable faults."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys = {KEY}
        self.versions: dict[tuple[str, str, str], ServedLibrary] = {}
        self.selections: dict[tuple[str, str, str, str], ServedSelection] = {}  # ... and the query
        self.arms: dict[str, str] = {}  # user id -> arm name, when the A/B split is on
        self.arm_versions: dict[str, ServedLibrary] = {}
        self.log: list[dict] = []
        self.stored: dict[str, dict] = {}  # trace id -> trace, in the order stored
        self.duplicates = 0
        self.fault: int | str | None = None  # 503, 429 or "hang" for every request
        self.scripted: list[tuple[int, dict]] = []  # answers for the next POSTs, before anything else
        self.port = 0
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stub.handle(self)

            def do_POST(self) -> None:
                stub.handle(self)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)  # allow_reuse_address is set
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join()
            self.server = None

    def publish(self, version_id: int, experiences: list[str], *, library: str = "default",
                label: str = "production") -> ServedLibrary:
        served = ServedLibrary(task=TASK, library=library, version_id=version_id, number=version_id - 100,
                               label=label, experiences=experiences,
                               prompt=export_version([{"text": text} for text in experiences], "prompt"))
        with self.lock:
            self.versions[(TASK, library, label)] = served
        return served

    def publish_selection(self, version_id: int, query: str, chosen: list[tuple[str, str]], *,
                          library: str = "default", label: str = "production") -> ServedSelection:
        """The entries (id, text) the studio's selection chose for `query`, as its selection route serves them."""
        entries = [{"id": entry_id, "text": text, "score": 1.0} for entry_id, text in chosen]
        served = ServedSelection(task=TASK, library=library, version_id=version_id, number=version_id - 100,
                                 label=label, query=query, selection={"mode": "top_k", "k": len(chosen)},
                                 entries=entries, prompt=export_version(entries, "prompt"))
        with self.lock:
            self.selections[(TASK, library, label, query)] = served
        return served

    def gets(self) -> list[dict]:
        with self.lock:
            return [entry for entry in self.log if entry["method"] == "GET"]

    def posts(self) -> list[dict]:
        with self.lock:
            return [entry for entry in self.log if entry["method"] == "POST"]

    # --- the request handler ---

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        split = urllib.parse.urlsplit(handler.path)
        entry = {"method": handler.command, "raw_path": split.path, "t": time.monotonic(),
                 "query": dict(urllib.parse.parse_qsl(split.query)),
                 "if_none_match": handler.headers.get("If-None-Match"), "ids": None, "status": None}
        body = b""
        if handler.command == "POST":
            body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        with self.lock:
            self.log.append(entry)
        if self.fault == "hang":
            time.sleep(1.0)
        status, headers, payload = self.answer(handler, split.path, entry, body)
        entry["status"] = status
        data = b"" if payload is None else json.dumps(payload).encode()
        try:
            handler.send_response(status)
            for name, value in headers.items():
                handler.send_header(name, value)
            if payload is not None:
                handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
        except OSError:  # the client gave up (a timeout test)
            pass

    def answer(self, handler, path: str, entry: dict, body: bytes) -> tuple[int, dict, dict | None]:
        if self.fault in (503, 429, "hang"):
            status = 503 if self.fault == "hang" else self.fault
            return status, {"Retry-After": "1"} if status == 429 else {}, {"error": "busy"}
        auth = handler.headers.get("Authorization", "")
        if not (auth.startswith("Bearer ") and auth[len("Bearer "):] in self.keys):
            return 401, {}, {"error": "unknown or revoked API key"}
        parts = [urllib.parse.unquote(part) for part in path.split("/")]
        if handler.command == "GET" and len(parts) == 6 and parts[1:3] == ["v1", "tasks"] \
                and parts[4] == "libraries":
            return self.library(parts[3], parts[5], entry)
        if handler.command == "GET" and len(parts) == 7 and parts[1:3] == ["v1", "tasks"] \
                and parts[4] == "libraries" and parts[6] == "select":
            return self.selection(parts[3], parts[5], entry)
        if handler.command == "POST" and path == "/v1/traces":
            return self.traces(body, entry)
        return 404, {}, {"error": f"no route {path}"}

    def library(self, task: str, library: str, entry: dict) -> tuple[int, dict, dict | None]:
        label = entry["query"].get("label", "production")
        user = entry["query"].get("user")
        with self.lock:
            served = self.versions.get((task, library, label))
            arm = self.arms.get(user) if user else None
            if arm is not None:
                served = self.arm_versions[arm]
        if served is None:
            return 404, {}, {"error": f"task {task!r} has no library {library!r} with label {label!r}"}
        entry["etag"] = served.etag
        headers = {"ETag": served.etag, "Cache-Control": "no-cache"}
        if entry["if_none_match"] == served.etag:
            return 304, headers, None
        return 200, headers, {**served.as_dict(), "arm": arm}

    def selection(self, task: str, library: str, entry: dict) -> tuple[int, dict, dict | None]:
        label, query = entry["query"].get("label", "production"), entry["query"].get("query")
        with self.lock:
            served = self.selections.get((task, library, label, query))
        if served is None:
            return 404, {}, {"error": f"task {task!r} has no library {library!r} with label {label!r}"}
        entry["etag"] = served.etag
        headers = {"ETag": served.etag, "Cache-Control": "no-cache"}
        if entry["if_none_match"] == served.etag:
            return 304, headers, None
        return 200, headers, served.as_dict()

    def traces(self, body: bytes, entry: dict) -> tuple[int, dict, dict | None]:
        with self.lock:
            if self.scripted:
                status, headers = self.scripted.pop(0)
                return status, headers, {"error": "scripted"}
        traces = json.loads(body)["traces"]
        entry["ids"] = [trace.get("id") for trace in traces]
        if len(traces) > 100:
            return 413, {}, {"error": "at most 100 traces a request"}
        for number, trace in enumerate(traces):
            missing = [name for name in ("id", "task", "input") if not isinstance(trace.get(name), str)]
            if missing or trace["input"].startswith("bad"):  # "bad...": the stub's stand-in for an invalid trace
                return 422, {}, {"error": f"traces.{number}: invalid"}
        with self.lock:
            stored = 0
            for trace in traces:
                if trace["id"] in self.stored:
                    self.duplicates += 1
                else:
                    self.stored[trace["id"]] = trace
                    stored += 1
            return 200, {}, {"stored": stored, "duplicates": len(traces) - stored}


@pytest.fixture
def stub():
    server = Stub()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def make_client(stub):
    made: list[Client] = []

    def make(**kwargs) -> Client:
        kwargs.setdefault("api_key", KEY)
        kwargs.setdefault("timeout_s", 1.0)
        client = Client(stub.url, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close(timeout_s=0.2)


def child_env(stub: Stub) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("TFGRPO_")}
    env.update(PYTHONPATH=str(CLIENT_DIR), TFGRPO_URL=stub.url, TFGRPO_API_KEY=KEY)
    return env


# --- the library ---------------------------------------------------------------------------------------


def test_cache_serves_within_ttl_then_revalidates_with_the_etag(stub, make_client):
    stub.publish(107, ["Ask for the frame size first.", "Quote prices with tax."])
    client = make_client(ttl_s=0.3)

    first = client.get_library(TASK)
    assert (first.source, first.version_id, first.number, first.label) == ("server", 107, 7, "production")
    assert first.experiences == ("Ask for the frame size first.", "Quote prices with tax.")
    assert "[E2] Quote prices with tax." in first.prompt
    [request] = stub.gets()
    assert request["raw_path"] == "/v1/tasks/Bike%20shop/libraries/default"
    assert request["query"] == {"label": "production"} and request["if_none_match"] is None
    old_etag = request["etag"]

    for _ in range(5):  # within the TTL: the copy in memory, no request at all
        assert client.get_library(TASK).source == "cache"
    assert len(stub.gets()) == 1

    time.sleep(0.35)
    again = client.get_library(TASK)
    assert (again.source, again.version_id, again.experiences) == ("cache", 107, first.experiences)
    assert [(r["if_none_match"], r["status"]) for r in stub.gets()] == [(None, 200), (old_etag, 304)]
    client.get_library(TASK)  # the 304 refreshed the TTL
    assert len(stub.gets()) == 2

    stub.publish(108, ["Ask for the frame size first."])
    time.sleep(0.35)
    changed = client.get_library(TASK)
    assert (changed.source, changed.version_id, changed.experiences) == ("server", 108,
                                                                        ("Ask for the frame size first.",))
    assert stub.gets()[-1]["if_none_match"] == old_etag and stub.gets()[-1]["status"] == 200
    new_etag = stub.gets()[-1]["etag"]
    assert new_etag != old_etag

    time.sleep(0.35)
    assert client.get_library(TASK).version_id == 108
    assert (stub.gets()[-1]["if_none_match"], stub.gets()[-1]["status"]) == (new_etag, 304)


def test_each_user_gets_and_keeps_their_own_arm(stub, make_client):
    stub.publish(107, ["A"])
    stub.arm_versions = {"control": stub.versions[(TASK, "default", "production")],
                         "candidate": ServedLibrary(TASK, "default", 109, 9, "production", ["B"],
                                                    export_version([{"text": "B"}], "prompt"))}
    stub.arms = {"u1": "control", "u2": "candidate"}
    client = make_client(ttl_s=5)

    one, two = client.get_library(TASK, user_id="u1"), client.get_library(TASK, user_id="u2")
    assert (one.arm, one.version_id, two.arm, two.version_id) == ("control", 107, "candidate", 109)
    assert [r["query"].get("user") for r in stub.gets()] == ["u1", "u2"]
    assert client.get_library(TASK, user_id="u2").version_id == 109 and len(stub.gets()) == 2


@pytest.mark.parametrize("fault", ["down", 503, 429, "hang"])
def test_studio_unreachable_serves_the_last_good_copy(stub, make_client, fault, caplog):
    stub.publish(107, ["Ask for the frame size first."])
    client = make_client(ttl_s=0.3, timeout_s=0.3)
    good = client.get_library(TASK)
    if fault == "down":
        stub.stop()
    else:
        stub.fault = fault
    time.sleep(0.35)

    started = time.monotonic()
    stale = client.get_library(TASK)
    assert time.monotonic() - started < 1.0  # a hung studio costs at most the request timeout
    assert stale.source == "stale"
    assert (stale.version_id, stale.experiences, stale.prompt) == (good.version_id, good.experiences, good.prompt)
    warned = [r.getMessage() for r in caplog.records if "serving the last good copy" in r.getMessage()]
    assert warned and warned[-1].endswith("(version #7)")  # the version's number, as every page names it
    asked = len(stub.gets())
    assert client.get_library(TASK).source == "stale" and len(stub.gets()) == asked  # no retry before the TTL

    if fault == "down":
        stub.start()  # the same port
    stub.fault = None
    time.sleep(1.05 if fault == 429 else 0.35)  # 429 said Retry-After: 1
    back = client.get_library(TASK)
    assert (back.source, back.version_id) == ("cache", 107)
    assert stub.gets()[-1]["status"] == 304


def test_concurrent_first_calls_make_one_request(stub, make_client):
    stub.publish(107, ["Ask for the frame size first."])
    client = make_client(ttl_s=5)
    start = threading.Barrier(16)
    got: list[Library] = []

    def agent() -> None:
        start.wait()
        got.append(client.get_library(TASK))

    threads = [threading.Thread(target=agent) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(stub.gets()) == 1
    assert len(got) == 16 and {lib.version_id for lib in got} == {107}
    assert sorted(lib.source for lib in got) == ["cache"] * 15 + ["server"]


def test_no_copy_serves_the_fallback_or_an_empty_library(stub, make_client, caplog):
    stub.publish(107, ["Ask for the frame size first."])
    stub.stop()

    from_text = make_client().get_library(TASK, fallback="Be kind to cyclists.")
    assert (from_text.source, from_text.prompt, from_text.experiences) == ("fallback", "Be kind to cyclists.", ())

    from_list = make_client().get_library(TASK, fallback=["Check the tyres.", "Smile."])
    assert (from_list.source, from_list.experiences) == ("fallback", ("Check the tyres.", "Smile."))
    assert from_list.prompt == export_version([{"text": "Check the tyres."}, {"text": "Smile."}], "prompt")

    own = Library(version_id=None, number=None, label=None, experiences=("x",), prompt="x", source="server")
    assert make_client().get_library(TASK, fallback=own).source == "fallback"

    with caplog.at_level(logging.WARNING, logger="tfgrpo_client"):
        empty = make_client().get_library(TASK)
    assert (empty.source, empty.experiences, empty.prompt, empty.version_id) == ("fallback", (), "", None)
    assert "EMPTY library" in caplog.text
    assert KEY not in caplog.text


def test_refused_key_raises_when_there_is_nothing_else_to_serve(stub, make_client, caplog):
    stub.publish(107, ["Ask for the frame size first."])
    wrong = make_client(api_key="sk-wrong")
    with pytest.raises(ClientError) as refused:
        wrong.get_library(TASK)
    assert refused.value.status == 401 and "unknown or revoked API key" in str(refused.value)
    assert "sk-wrong" not in str(refused.value)
    assert wrong.get_library(TASK, fallback="Be kind.").source == "fallback"

    with pytest.raises(ClientError) as missing:
        make_client().get_library("No such task")
    assert missing.value.status == 404

    good = make_client(ttl_s=0.1)
    good.get_library(TASK)
    stub.keys.clear()  # the key is revoked: keep serving what we have, loudly
    time.sleep(0.15)
    with caplog.at_level(logging.ERROR, logger="tfgrpo_client"):
        assert good.get_library(TASK).source == "stale"
    assert "401" in caplog.text and KEY not in caplog.text


TRAIN_QUERY = "How far does a train at 60 mph go in 2 hours?"
PRICE_QUERY = "What does a 40 dollar bike cost with a 25% discount?"


def test_entries_for_a_query_are_cached_per_query_and_revalidated_with_the_etag(stub, make_client):
    stub.publish(107, ["Ask for the frame size first."])
    stub.publish_selection(107, TRAIN_QUERY, [("E4", "Distance is speed times time."), ("E1", "Hours to minutes.")])
    stub.publish_selection(107, PRICE_QUERY, [("E3", "Price times one minus the discount.")])
    client = make_client(ttl_s=0.3)

    assert client.get_library(TASK).selection == {"mode": "all", "k": DEFAULT_K}
    train = client.get_entries(TASK, TRAIN_QUERY)
    assert (train.source, train.version_id, train.query) == ("server", 107, TRAIN_QUERY)
    assert train.entry_ids == ("E4", "E1") and train.experiences == ("Distance is speed times time.",
                                                                      "Hours to minutes.")
    assert train.selection == {"mode": "top_k", "k": 2} and "[E4] Distance is speed times time." in train.prompt
    request = stub.gets()[-1]
    assert request["raw_path"] == "/v1/tasks/Bike%20shop/libraries/default/select"
    assert request["query"] == {"query": TRAIN_QUERY, "label": "production"}

    assert client.get_entries(TASK, TRAIN_QUERY).source == "cache" and len(stub.gets()) == 2
    price = client.get_entries(TASK, PRICE_QUERY)  # another query: its own request, its own entries
    assert (price.source, price.entry_ids) == ("server", ("E3",)) and len(stub.gets()) == 3

    time.sleep(0.35)
    again = client.get_entries(TASK, TRAIN_QUERY)
    assert (again.source, again.entry_ids) == ("cache", ("E4", "E1"))
    assert (stub.gets()[-1]["if_none_match"], stub.gets()[-1]["status"]) == (request["etag"], 304)
    with pytest.raises(ValueError):
        client.get_entries(TASK, "  ")


def test_entries_while_the_studio_is_down_are_that_querys_last_good_copy_never_another_querys(stub, make_client):
    stub.publish_selection(107, TRAIN_QUERY, [("E4", "Distance is speed times time.")])
    client = make_client(ttl_s=0.2, timeout_s=0.3)
    good = client.get_entries(TASK, TRAIN_QUERY)
    stub.fault = 503
    time.sleep(0.25)

    stale = client.get_entries(TASK, TRAIN_QUERY)
    assert (stale.source, stale.entry_ids, stale.prompt) == ("stale", ("E4",), good.prompt)
    other = client.get_entries(TASK, PRICE_QUERY, fallback=["Quote prices with tax."])
    assert (other.source, other.experiences, other.entry_ids) == ("fallback", ("Quote prices with tax.",), ())
    assert other.query == PRICE_QUERY
    empty = make_client().get_entries(TASK, PRICE_QUERY)
    assert (empty.source, empty.prompt, empty.version_id) == ("fallback", "", None)


def test_fallback_prompt_matches_the_studio_rendering():
    texts = ["Ask for  the frame\nsize.", "Quote prices with tax."]
    assert render_prompt(texts) == export_version([{"text": text} for text in texts], "prompt")
    assert render_prompt([]) == export_version([], "prompt") == ""


# --- traces ----------------------------------------------------------------------------------------------


def test_log_trace_rejects_invalid_fields_at_the_call(make_client):
    client = make_client()
    with pytest.raises(ValueError, match="score"):
        client.log_trace(task=TASK, input="q", score=1.5, version_id=107)
    with pytest.raises(ValueError, match="thumbs"):
        client.log_trace(task=TASK, input="q", thumbs="meh", version_id=107)
    with pytest.raises(ValueError, match="turn"):
        client.log_trace(task=TASK, input="q", turns=[{"role": "bot", "text": "hi"}], version_id=107)
    with pytest.raises(ValueError, match="metadata"):
        client.log_trace(task=TASK, input="q", metadata={"when": object()}, version_id=107)
    with pytest.raises(ValueError, match="not both"):
        client.log_trace(task=TASK, input="q", version_id=1, label="production")
    with pytest.raises(ValueError, match="give the version the agent used"):
        client.log_trace(task=TASK, input="q")  # the studio would refuse it later, in the background
    assert client.pending == 0


def test_trace_fields_as_the_studio_receives_them(stub, make_client):
    client = make_client(flush_interval_s=10)
    meta = {"channel": "chat"}
    trace_id = client.log_trace(task=TASK, input="Which frame?", output="A 56.", score=1, thumbs="up",
                                turns=[{"role": "user", "text": "Which frame?"}, {"role": "agent", "text": "A 56."}],
                                user_id="u1", segment="road", metadata=meta, version_id=107)
    meta["channel"] = "changed after the call"
    assert len(trace_id) == 32
    assert client.flush(5)
    trace = stub.stored[trace_id]
    assert {k: v for k, v in trace.items() if k != "created_at"} == {
        "id": trace_id, "task": TASK, "library": "default", "version_id": 107, "input": "Which frame?",
        "output": "A 56.", "turns": [{"role": "user", "text": "Which frame?"}, {"role": "agent", "text": "A 56."}],
        "score": 1.0, "thumbs": "up", "comment": None, "segment": "road", "user_id": "u1",
        "metadata": {"channel": "chat"}}
    assert datetime.fromisoformat(trace["created_at"]).tzinfo is not None


def test_traces_logged_while_down_arrive_in_order_when_the_studio_returns(stub, make_client):
    stub.stop()
    client = make_client(batch_size=10, flush_interval_s=0.05)
    ids = [client.log_trace(task=TASK, input=f"q{i}", output=f"a{i}", version_id=107) for i in range(35)]
    assert not client.flush(0.3)  # still down
    assert client.pending == 35 and not stub.stored

    stub.start()  # the same port
    assert client.flush(5)
    assert list(stub.stored) == ids and stub.duplicates == 0
    delivered = [r for r in stub.posts() if r["status"] == 200]
    assert sum(len(r["ids"]) for r in delivered) == 35
    assert max(len(r["ids"]) for r in stub.posts()) <= 10
    assert client.stats() == {"sent": 35, "pending": 0, "dropped": 0, "refused": 0, "given_up": 0}


def test_full_batches_go_at_once_and_never_above_batch_size(stub, make_client):
    client = make_client(batch_size=100, flush_interval_s=30)
    ids = [client.log_trace(task=TASK, input=f"q{i}", version_id=107) for i in range(230)]
    deadline = time.monotonic() + 5
    while len(stub.stored) < 200 and time.monotonic() < deadline:  # two full batches, no timer needed
        time.sleep(0.02)
    assert list(stub.stored) == ids[:200]
    assert client.flush(5) and list(stub.stored) == ids
    assert [len(r["ids"]) for r in stub.posts()] == [100, 100, 30]


def test_a_429_is_retried_after_its_retry_after(stub, make_client):
    stub.scripted.append((429, {"Retry-After": "1"}))
    client = make_client(flush_interval_s=10)
    ids = [client.log_trace(task=TASK, input=f"q{i}", version_id=107) for i in range(3)]
    assert client.flush(5)
    first, second = stub.posts()
    assert (first["status"], second["status"]) == (429, 200)
    assert second["t"] - first["t"] >= 0.95
    assert list(stub.stored) == ids


def test_an_invalid_batch_does_not_block_the_traces_after_it(stub, make_client, caplog):
    client = make_client(flush_interval_s=10, batch_size=10)
    with caplog.at_level(logging.ERROR, logger="tfgrpo_client"):
        ids = [client.log_trace(task=TASK, input=text, version_id=107) for text in ("q0", "q1", "bad q2", "q3", "q4")]
        result = client.flush(5)
    bad = ids[2]
    assert not result and result.refused == (bad,) and result.pending == 0  # flush says what it lost
    assert list(stub.stored) == [ids[0], ids[1], ids[3], ids[4]]
    assert f"refused trace {bad}" in caplog.text
    later = client.log_trace(task=TASK, input="q5", version_id=107)
    assert client.flush(5) and later in stub.stored
    assert client.stats()["refused"] == 1 and client.stats()["sent"] == 5


def test_a_refused_key_keeps_traces_queued_until_it_is_accepted(stub, make_client, caplog):
    stub.keys.clear()
    client = make_client(flush_interval_s=0.05)
    with caplog.at_level(logging.ERROR, logger="tfgrpo_client"):
        ids = [client.log_trace(task=TASK, input=f"q{i}", version_id=107) for i in range(2)]
        assert not client.flush(0.3)
    assert client.pending == 2 and "401" in caplog.text and KEY not in caplog.text
    stub.keys.add(KEY)
    assert client.flush(5) and list(stub.stored) == ids


def test_after_max_retries_a_batch_is_spooled_not_retried_forever(stub, make_client, tmp_path):
    stub.fault = 503
    spool = tmp_path / "given-up.jsonl"
    client = make_client(max_retries=2, flush_interval_s=10, max_backoff_s=0.05, spool_path=spool)
    ids = [client.log_trace(task=TASK, input=f"q{i}", version_id=107) for i in range(3)]
    result = client.flush(5)  # nothing pending any more: given up, and said so
    assert not result and result.given_up == tuple(ids) and result.pending == 0
    assert len(stub.posts()) == 3  # the first try and two retries
    assert client.stats()["given_up"] == 3
    assert [json.loads(line)["id"] for line in spool.read_text().splitlines()] == ids


def test_a_full_queue_drops_the_oldest(stub, make_client, caplog):
    stub.stop()
    client = make_client(max_queue=5, flush_interval_s=30)  # nothing leaves the queue before the flush
    with caplog.at_level(logging.WARNING, logger="tfgrpo_client"):
        ids = [client.log_trace(task=TASK, input=f"q{i}", version_id=107) for i in range(8)]
    assert "queue is full" in caplog.text
    stub.start()
    result = client.flush(5)
    assert not result and result.dropped == tuple(ids[:3]) and client.stats()["dropped"] == 3
    assert set(stub.stored) == set(ids[3:])  # the 3 oldest were dropped
    assert client.flush(5)  # each loss is reported once: this flush lost nothing


def test_nothing_is_lost_at_a_clean_exit(stub):
    code = (
        "import tfgrpo_client\n"
        "tfgrpo_client.configure(flush_interval_s=60)  # the exit must send the rest, not a timer\n"
        "for i in range(250):\n"
        "    tfgrpo_client.log_trace(id=f't{i:03d}', task='Bike shop', input=f'q{i}', version_id=107)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=child_env(stub), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert list(stub.stored) == [f"t{i:03d}" for i in range(250)]
    assert max(len(r["ids"]) for r in stub.posts()) <= 100


def test_traces_undelivered_at_exit_are_spooled_and_sent_by_the_next_client(stub, make_client, tmp_path):
    spool = tmp_path / "traces.jsonl"
    stub.stop()
    code = (
        "import tfgrpo_client\n"
        f"tfgrpo_client.configure(spool_path={str(spool)!r}, exit_timeout_s=0.3, flush_interval_s=0.05)\n"
        "for i in range(5):\n"
        "    tfgrpo_client.log_trace(id=f's{i}', task='Bike shop', input=f'q{i}', version_id=107)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=child_env(stub), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "spooled 5 undelivered trace(s) at exit" in done.stderr
    assert [json.loads(line)["id"] for line in spool.read_text().splitlines()] == [f"s{i}" for i in range(5)]

    stub.start()
    client = make_client(spool_path=spool, flush_interval_s=0.05)
    assert spool.read_text() == ""  # taken into the queue
    assert client.flush(5)
    assert list(stub.stored) == [f"s{i}" for i in range(5)]


def test_close_flushes_and_a_closed_client_never_raises(stub, make_client, caplog):
    client = make_client(flush_interval_s=10)
    trace_id = client.log_trace(task=TASK, input="q", version_id=107)
    assert client.close(timeout_s=5) and trace_id in stub.stored
    with caplog.at_level(logging.WARNING, logger="tfgrpo_client"):
        client.log_trace(task=TASK, input="after close", version_id=107)
    assert "after the client was closed" in caplog.text

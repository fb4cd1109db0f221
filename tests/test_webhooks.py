"""Webhooks (core/records/notifications/webhooks.py) against a real HTTP receiver on a loopback port: every event arrives once,
signed so that the `standardwebhooks` package's own verifier accepts it; a receiver that is down gets its
deliveries later and in order; one that answers 500 is given up after N attempts and one that redirects is not
followed; a hanging one delays no run; a failed delivery is replayed from the log; the secret stays hidden."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import litellm
import pytest
from sqlmodel import Session, select
from standardwebhooks import Webhook

from core.cli import main as cli
from core.domain import webhooks as wh
from core.errors import InvalidInput, PermissionDenied
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.grpo.training import RunSettings, create_run, execute_run
from core.jobs.worker import delivering
from core.records.library.versions import promote
from core.records.notifications import webhooks
from core.records.people.users import add_user
from core.records.review.labeling import submit_label
from core.records.tasks.demos import DEMO_TASK
from core.settings import get_settings
from storage import queries
from storage.db import session_scope
from storage.statuses import JobStatus
from storage.tables import AuditEvent, Run, Task, WebhookDelivery, WebhookEndpoint, utcnow
from tests.ui_support import scripted_gateway, seeded_run


class Receiver:
    """An http.server on a free loopback port that records what it gets; `mode` says how it answers:
    ok (204), down (503), error (500), redirect (302 to /elsewhere), hang (until `release` is set) or trickle (a
    204 a byte every 0.3 s)."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.got: list[tuple[dict, bytes, str]] = []  # headers, body, path
        self.secret: str | None = None  # set: each body is verified when it arrives (at that moment's clock)
        self.checked: list[dict] = []
        self.hit = threading.Event()
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802  (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.got.append((headers, body, self.path))
                mode = receiver.mode
                if receiver.secret and mode == "ok":
                    receiver.checked.append(Webhook(receiver.secret).verify(body, headers))
                receiver.hit.set()
                if mode == "hang":
                    receiver.release.wait(10)
                if mode == "trickle":  # the answer a byte at a time: every read is within any timeout
                    for byte in b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n":
                        if receiver.release.wait(0.3):
                            return
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                    return
                code = {"ok": 204, "down": 503, "error": 500, "redirect": 302, "hang": 204}[mode]
                self.send_response(code)
                if mode == "redirect":
                    self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/studio"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def verified(self, secret: str) -> list[dict]:
        """Every body received, checked by the standardwebhooks verifier (raises on a bad signature)."""
        return [Webhook(secret).verify(body, headers) for headers, body, _path in self.got]


@pytest.fixture
def receiver(monkeypatch):
    monkeypatch.setenv("TFGRPO_WEBHOOK_ALLOWLIST", "127.0.0.1")  # the receiver is on loopback: an admin's leave
    monkeypatch.setenv("TFGRPO_WEBHOOK_RETRY_SCHEDULE_S", "[0.001]")
    monkeypatch.setenv("TFGRPO_APP_URL", "https://studio.example.com")
    get_settings.cache_clear()
    found = Receiver()
    yield found
    found.close()
    get_settings.cache_clear()


def endpoint(engine, receiver: Receiver, name: str = "team", events: list[str] | None = None) -> str:
    _view, secret = webhooks.add_endpoint(engine, name, receiver.url, "cli", events=events)
    assert secret.startswith("whsec_")
    return secret


def deliveries(engine) -> list[WebhookDelivery]:
    with Session(engine) as session:
        return list(session.exec(select(WebhookDelivery).order_by(WebhookDelivery.id)))


def one_event(engine, receiver: Receiver, secret: str, event_type: str) -> dict:
    """Deliver what waits; exactly one payload of `event_type` arrived, verified; its body."""
    webhooks.deliver_due(engine, "test")
    found = [p for p in receiver.verified(secret) if p["type"] == event_type]
    assert len(found) == 1, [p["type"] for p in receiver.verified(secret)]
    payload = found[0]
    assert payload["data"]["link"] in payload["text"] and payload["data"]["link"].startswith("https://studio.example")
    return payload


def set_reward(engine, method: str, **settings) -> None:
    with session_scope(engine) as session:
        task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
        task.reward_method, task.reward_settings = method, settings
        session.add(task)


# ---- each event: one signed payload --------------------------------------------------------------------------

def test_a_step_awaiting_review_sends_its_gate_line_and_a_link_to_the_run_and_step(engine, demo_task, receiver):
    secret = endpoint(engine, receiver)
    run_id = seeded_run(engine, "manual")
    payload = one_event(engine, receiver, secret, "step.awaiting_review")
    with Session(engine) as session:
        step = queries.steps(session, run_id)[0]
    data = payload["data"]
    assert (data["run"], data["step"], data["task"]) == (run_id, step.id, DEMO_TASK)
    assert data["gate"] == step.gate["line"] and step.gate["line"] in payload["text"]
    assert data["link"] == (f"https://studio.example.com/review?task=arithmetic+word+problems&library=default"
                            f"&run={run_id}&step={step.id}")
    headers = receiver.got[0][0]
    assert headers["webhook-id"].startswith("msg_") and headers["webhook-signature"].startswith("v1,")


def test_labels_waiting_and_a_dispute_each_send_one_payload(engine, demo_task, receiver):
    secret = endpoint(engine, receiver)
    set_reward(engine, "human", labels_per_rollout=2)
    run_id = seeded_run(engine, "auto")
    waiting = one_event(engine, receiver, secret, "labels.waiting")
    assert (waiting["data"]["count"], waiting["data"]["run"], waiting["data"]["task"]) == (4, run_id, DEMO_TASK)
    assert waiting["text"].startswith(f"4 rollouts of {DEMO_TASK} wait for a label")
    with Session(engine) as session:
        rollout_id = queries.step_rollouts(session, queries.steps(session, run_id)[0].id)[0].id
    submit_label(engine, rollout_id, 1.0, "ann")
    submit_label(engine, rollout_id, 0.0, "bob")
    submit_label(engine, rollout_id, 0.0, "cid")  # still disputed: no second event
    dispute = one_event(engine, receiver, secret, "dispute.opened")
    assert dispute["data"]["rollout"] == rollout_id and "labeling?task=" in dispute["data"]["link"]


def test_an_evaluation_that_ends_sends_its_figures_or_why_it_is_incomplete(engine, demo_task, receiver):
    from tests.ui_support import incomplete_evaluation

    secret = endpoint(engine, receiver)
    evaluation_id = create_evaluation(engine, DEMO_TASK, "empty", split="test", k=1, limit=2, created_by="cli")
    _model, gateway = scripted_gateway(engine)
    done = execute_evaluation(engine, evaluation_id, gateway=gateway)
    payload = one_event(engine, receiver, secret, "evaluation.ended")
    assert payload["data"]["status"] == "completed" and payload["data"]["mean_at_k"] == done.mean_at_k
    assert f"Mean@1 {done.mean_at_k:.3f}" in payload["text"] and f"evaluation={evaluation_id}" in payload["data"]["link"]

    incomplete, _model, _gateway = incomplete_evaluation(engine)
    webhooks.deliver_due(engine, "test")
    ended = [p for p in receiver.verified(secret) if p["type"] == "evaluation.ended"]
    assert len(ended) == 2 and ended[1]["data"]["status"] == "incomplete"
    assert "incomplete: " in ended[1]["data"]["verdict"] and incomplete.error in ended[1]["text"]


def test_a_failed_run_and_a_stalled_one_each_send_one_payload(engine, demo_task, receiver, scripted):
    secret = endpoint(engine, receiver)
    _model, gateway = scripted(engine, rollout=litellm.AuthenticationError("bad key", llm_provider="openai", model="x"))
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=2, gate="off"))
    assert execute_run(engine, run_id, gateway=gateway).status == "failed"
    failed = one_event(engine, receiver, secret, "run.failed")
    assert failed["data"]["run"] == run_id and "every group failed" in failed["text"]

    stalled_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=2))
    with session_scope(engine) as session:
        run = session.get(Run, stalled_id)
        run.status, run.worker_id, run.lease = JobStatus.RUNNING, "elsewhere:1:abc", 1
        run.heartbeat_at = utcnow() - timedelta(hours=1)
        session.add(run)
    stalled = one_event(engine, receiver, secret, "run.stalled")
    webhooks.deliver_due(engine, "test")  # the same stall is told once
    assert stalled["data"]["run"] == stalled_id and "elsewhere:1:abc" in stalled["text"]
    assert len([p for p in receiver.verified(secret) if p["type"] == "run.stalled"]) == 1


def test_production_moving_says_from_which_version_to_which_by_whom_and_why(engine, demo_task, receiver):
    secret = endpoint(engine, receiver, events=["production.moved"])
    run_id = seeded_run(engine, "auto", epochs=2, settings={"gate": "off"})
    with Session(engine) as session:
        run = session.get(Run, run_id)
        versions = queries.versions(session, run.library_id)
    first, last = versions[0], versions[-1]
    promote(engine, first.id, "alice", reason="the starting point")
    promote(engine, last.id, "alice", reason="two steps of lessons, checked by hand")
    webhooks.deliver_due(engine, "test")
    moved = receiver.verified(secret)
    assert [p["type"] for p in moved] == ["production.moved", "production.moved"]  # it hears only this event
    data = moved[1]["data"]
    assert (data["from_version"], data["to_version"], data["by"]) == (first.number, last.number, "alice")
    assert data["reason"] == "two steps of lessons, checked by hand"
    assert f"from #{first.number} to #{last.number} by alice" in moved[1]["text"]
    assert data["link"].endswith("/library?task=arithmetic+word+problems&library=default")


# ---- bad receivers ------------------------------------------------------------------------------------------------

def raise_tests(engine, n: int) -> None:
    for i in range(n):
        with session_scope(engine) as session:
            webhooks.raise_event(session, "run.failed", f"event {i}", {"i": i})


def test_a_receiver_down_for_a_while_gets_every_delivery_later_in_order(engine, receiver):
    secret = endpoint(engine, receiver)
    receiver.mode = "down"
    raise_tests(engine, 3)
    for _ in range(3):
        webhooks.deliver_due(engine, "test")
        time.sleep(0.01)  # past the (test's 1 ms) backoff
    rows = deliveries(engine)
    assert [r.attempts for r in rows] == [3, 0, 0] and {r.status for r in rows} == {"pending"}  # the first holds back
    assert rows[0].last_code == 503 and "HTTP 503" in webhooks.describe(rows[0])
    receiver.mode = "ok"
    receiver.got.clear()
    time.sleep(0.01)
    webhooks.deliver_due(engine, "test")
    assert [p["data"]["i"] for p in receiver.verified(secret)] == [0, 1, 2]
    assert [h["webhook-id"] for h, _b, _p in receiver.got] == [r.message_id for r in rows]
    assert {r.status for r in deliveries(engine)} == {"delivered"}


def test_a_500_is_retried_then_given_up_never_retried_forever_and_replayed_from_the_log(engine, receiver, monkeypatch):
    monkeypatch.setenv("TFGRPO_WEBHOOK_MAX_ATTEMPTS", "3")
    get_settings.cache_clear()
    secret = endpoint(engine, receiver)
    receiver.mode = "error"
    raise_tests(engine, 1)
    for _ in range(6):
        webhooks.deliver_due(engine, "test")
        time.sleep(0.01)
    [row] = deliveries(engine)
    assert (row.status, row.attempts, row.last_code) == ("failed", 3, 500) and len(receiver.got) == 3
    assert "gave up after 3 attempts" in row.last_error

    receiver.mode = "ok"
    replayed = webhooks.replay(engine, row.id, "cli")
    assert (replayed.replay_of, replayed.message_id, replayed.status) == (row.id, row.message_id, "pending")
    webhooks.deliver_due(engine, "test")
    assert [r.status for r in deliveries(engine)] == ["failed", "delivered"]  # the log keeps the first as it was
    assert receiver.verified(secret)[-1]["data"]["i"] == 0
    assert receiver.got[-1][0]["webhook-id"] == row.message_id  # the same webhook-id: a receiver can deduplicate
    with pytest.raises(Exception, match="still pending"):
        webhooks.replay(engine, webhooks.replay(engine, row.id, "cli").id, "cli")


def test_a_redirect_is_recorded_and_not_followed(engine, receiver):
    endpoint(engine, receiver)
    receiver.mode = "redirect"
    raise_tests(engine, 1)
    webhooks.deliver_due(engine, "test")
    webhooks.deliver_due(engine, "test")
    [row] = deliveries(engine)
    assert (row.status, row.attempts, row.last_code) == ("failed", 1, 302)
    assert "redirected to http://127.0.0.1" in row.last_error and "not followed" in row.last_error
    assert [path for _h, _b, path in receiver.got] == ["/hooks/studio"]  # /elsewhere never asked


def test_a_hanging_receiver_times_out_and_delays_no_run(engine, demo_task, receiver, monkeypatch):
    monkeypatch.setenv("TFGRPO_WEBHOOK_TIMEOUT_S", "3")
    get_settings.cache_clear()
    endpoint(engine, receiver)
    receiver.mode = "hang"
    with delivering(engine, "worker-test", every=0.05):  # the worker's delivery thread, as `core worker` runs it
        seeded_run(engine, "manual", settings={"gate": "off"})  # raises step.awaiting_review; the receiver hangs
        assert receiver.hit.wait(5)
        started = time.monotonic()
        run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=2,
                                                           review_mode="auto", gate="off"))
        _model, gateway = scripted_gateway(engine)
        assert execute_run(engine, run_id, gateway=gateway).status == "completed"
        took = time.monotonic() - started
        in_flight = deliveries(engine)[0].attempts == 0  # the post is still waiting for the hanging receiver
        with Session(engine) as session:
            step = queries.steps(session, run_id)[0]
            step_s = (step.finished_at - step.created_at).total_seconds()
        print(f"run while the receiver hangs: {took:.2f} s, its step {step_s:.2f} s")
        assert in_flight and len(receiver.got) == 1 and took < 3, (took, step_s)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not deliveries(engine)[0].attempts:
            time.sleep(0.05)
    first = deliveries(engine)[0]
    assert (first.attempts, first.status) == (1, "pending") and "no answer within 3 s (timeout)" in first.last_error


def test_urls_that_are_not_http_or_point_at_this_machine_are_refused_unless_allowed(engine, monkeypatch):
    monkeypatch.delenv("TFGRPO_WEBHOOK_ALLOWLIST", raising=False)
    get_settings.cache_clear()
    for url, said in [("ftp://example.com/x", "http:// or https://"), ("file:///etc/passwd", "http:// or https://"),
                      ("http://127.0.0.1:8080/x", "loopback address (127.0.0.1)"),
                      ("http://[::1]/x", "loopback address (::1)"), ("http://localhost/x", "loopback"),
                      ("http://169.254.169.254/latest", "metadata address (169.254.169.254)"),
                      ("https://user:pw@example.com/x", "no user name or password"),
                      ("http://no-such-host.invalid/x", "does not resolve")]:
        with pytest.raises(InvalidInput, match=re.escape(said)):
            webhooks.add_endpoint(engine, "x", url, "cli")
    with Session(engine) as session:
        assert webhooks.endpoints(session) == []  # nothing half-made
    monkeypatch.setenv("TFGRPO_WEBHOOK_ALLOWLIST", "127.0.0.0/8")
    get_settings.cache_clear()
    view, _secret = webhooks.add_endpoint(engine, "local", "http://127.0.0.1:8080/x", "cli")
    monkeypatch.delenv("TFGRPO_WEBHOOK_ALLOWLIST")
    get_settings.cache_clear()
    with session_scope(engine) as session:
        webhooks.raise_event(session, "run.failed", "x", {})
    webhooks.deliver_due(engine, "test")  # the leave was taken back: sending refuses too, at once
    [row] = deliveries(engine)
    assert row.status == "failed" and "loopback" in row.last_error and view.url == "http://127.0.0.1:8080/…"
    get_settings.cache_clear()


@pytest.mark.parametrize(("address", "kind"), [
    ("10.0.0.5", "private"), ("172.16.3.4", "private"), ("192.168.1.1", "private"),
    ("100.100.100.200", "cloud metadata"), ("100.64.1.1", "carrier-grade NAT"), ("fd00:ec2::254", "cloud metadata"),
    ("fd12:3456::1", "unique-local"), ("::ffff:10.0.0.5", "private address (10.0.0.5) inside"),
    ("::a00:5", "private address (10.0.0.5) inside"), ("2002:a00:5::1", "private address (10.0.0.5) inside"),
    ("64:ff9b::a9fe:a9fe", "cloud metadata address (169.254.169.254) inside"), ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"), ("192.0.2.7", "not public"), ("fe80::1", "link-local")])
def test_every_address_but_public_unicast_is_refused(engine, monkeypatch, address, kind):
    monkeypatch.delenv("TFGRPO_WEBHOOK_ALLOWLIST", raising=False)
    get_settings.cache_clear()
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(InvalidInput, match=re.escape(kind)):
        webhooks.add_endpoint(engine, "inside", f"https://{host}/hooks", "cli")
    assert wh.refused_reason("93.184.216.34") is None and wh.refused_reason("2606:4700::1") is None


def test_an_allowlisted_internal_receiver_is_admitted_and_a_metadata_address_never(engine, monkeypatch):
    monkeypatch.setenv("TFGRPO_WEBHOOK_ALLOWLIST", "chat.internal, 10.20.0.0/16, 100.64.0.0/10, fd00::/8")
    get_settings.cache_clear()
    webhooks.add_endpoint(engine, "net", "https://10.20.0.5/hooks", "cli")
    resolve_as(monkeypatch, {"chat.internal": ["10.9.8.7"], "other.internal": ["10.9.8.7"]})
    webhooks.add_endpoint(engine, "by-name", "https://chat.internal/hooks", "cli")
    with pytest.raises(InvalidInput, match=re.escape("other.internal resolves to a private address: refused")):
        webhooks.add_endpoint(engine, "other", "https://other.internal/hooks", "cli")  # its address is not told
    for address in ("100.100.100.200", "[fd00:ec2::254]"):  # inside a listed network, still never
        with pytest.raises(InvalidInput, match="cloud metadata"):
            webhooks.add_endpoint(engine, "meta", f"http://{address}/latest", "cli")
    with Session(engine) as session:
        assert [row.name for row in webhooks.endpoints(session)] == ["by-name", "net"]


@pytest.mark.parametrize("address", ["::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "::ffff:a9fe:a9fe",
                                     "::a9fe:a9fe", "2002:a9fe:a9fe::1", "::ffff:100.100.100.200"])
def test_each_ipv6_form_of_a_metadata_address_is_refused_even_under_an_allowlist_of_everything(engine, monkeypatch,
                                                                                             address):
    """Issue 61: the metadata test ran on the IPv6 address as written, so `::ffff:169.254.169.254` passed an
    allowlist of `::/0`; the embedded IPv4 is unwrapped before every test, and by a name that resolves to it too."""
    monkeypatch.setenv("TFGRPO_WEBHOOK_ALLOWLIST", "::/0, 0.0.0.0/0, metadata.example")
    get_settings.cache_clear()
    with pytest.raises(InvalidInput, match="cloud metadata"):
        webhooks.add_endpoint(engine, "meta", f"http://[{address}]/latest", "cli")
    resolve_as(monkeypatch, {"metadata.example": [address]})
    with pytest.raises(InvalidInput, match="cloud metadata"):
        webhooks.add_endpoint(engine, "by-name", "http://metadata.example/latest", "cli")
    assert wh.canonical_address(address) in {"169.254.169.254", "100.100.100.200"}
    get_settings.cache_clear()


def resolve_as(monkeypatch, answers: dict[str, list[str]], calls: list | None = None) -> None:
    """The resolver answers these names (each call takes the next answer of a list of lists); others as usual."""
    real = socket.getaddrinfo

    def fake(host, port, *args, **kwargs):
        if host not in answers:
            return real(host, port, *args, **kwargs)
        if calls is not None:
            calls.append(host)
        found = answers[host]
        address = found.pop(0) if len(found) > 1 else found[0]
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (address, port or 0))]

    monkeypatch.setattr(socket, "getaddrinfo", fake)


def test_a_name_that_resolves_public_then_to_loopback_never_reaches_loopback(engine, receiver, monkeypatch):
    """DNS rebinding: the resolver answers a public address, then 127.0.0.1. The studio connects to the address
    it checked (pinned), so the loopback receiver gets nothing; connections to the public address are refused
    here rather than sent out."""
    monkeypatch.delenv("TFGRPO_WEBHOOK_ALLOWLIST")
    get_settings.cache_clear()
    port = int(receiver.url.split(":")[2].split("/")[0])
    calls: list[str] = []
    resolve_as(monkeypatch, {"hooks.example.com": ["93.184.216.34", "93.184.216.34", "127.0.0.1"]}, calls)
    real_connect = socket.create_connection
    connected: list[str] = []

    def connect(address, *args, **kwargs):
        connected.append(address[0])
        if address[0] == "93.184.216.34":
            raise ConnectionRefusedError("the test keeps the public address off the network")
        return real_connect(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", connect)
    webhooks.add_endpoint(engine, "public", f"http://hooks.example.com:{port}/hooks/studio", "cli")  # 1st answer
    raise_tests(engine, 1)
    webhooks.deliver_due(engine, "test")  # resolves once (2nd answer) and connects there; a 3rd would be loopback
    [row] = deliveries(engine)
    assert receiver.got == [] and "127.0.0.1" not in connected and connected == ["93.184.216.34"]
    assert row.last_error == "no connection (refused, unreachable or TLS failed)" and calls == ["hooks.example.com"] * 2


# ---- who may, and the secret ------------------------------------------------------------------------------------

def test_only_an_admin_configures_and_the_secret_never_shows_again(engine, receiver, capsys):
    add_user(engine, "ada", "admin", "password1")
    add_user(engine, "rev", "reviewer", "password1")
    with pytest.raises(PermissionDenied, match="configuring webhooks needs the admin role"):
        webhooks.add_endpoint(engine, "chat", receiver.url, "rev")
    url = engine.url.render_as_string(hide_password=False)
    assert cli(["--db", url, "webhook", "add", "chat", receiver.url + "?token=s3cr3t",
                "--events", "run.failed,production.moved"]) == 0
    said = capsys.readouterr().out
    secret = said.split("shown this once; keep it where the receiver verifies): ")[1].strip()
    assert secret.startswith("whsec_")
    assert cli(["--db", url, "webhook", "test", "chat"]) == 0
    assert Webhook(secret).verify(receiver.got[0][1], receiver.got[0][0])["type"] == "webhook.test"
    assert cli(["--db", url, "webhook", "list"]) == 0
    assert cli(["--db", url, "webhook", "deliveries"]) == 0
    shown = capsys.readouterr().out
    assert "delivered (HTTP 204, attempt 1)" in shown and "production.moved, run.failed" in shown
    assert secret not in shown and "s3cr3t" not in shown and "/hooks" not in shown  # the URL's path may be a token
    with Session(engine) as session:
        audit = json.dumps([(e.before, e.after) for e in session.exec(select(AuditEvent))], default=str)
        logged = json.dumps([d.payload for d in session.exec(select(WebhookDelivery))])
    assert secret not in audit and secret not in logged and "s3cr3t" not in audit
    assert cli(["--db", url, "webhook", "remove", "chat"]) == 0
    assert deliveries(engine) == []


def test_an_event_lands_with_its_change_or_not_at_all(engine, receiver):
    endpoint(engine, receiver)
    with pytest.raises(RuntimeError), session_scope(engine) as session:
        webhooks.raise_event(session, "run.failed", "never sent", {})
        raise RuntimeError("the change that raised it failed")
    assert deliveries(engine) == []


def test_a_secret_from_the_environment_signs_and_is_never_stored(engine, receiver, monkeypatch):
    with pytest.raises(InvalidInput, match="environment variable TEAM_HOOK_SECRET is not set"):
        webhooks.add_endpoint(engine, "team", receiver.url, "cli", secret_env="TEAM_HOOK_SECRET")
    secret = webhooks.new_secret()
    monkeypatch.setenv("TEAM_HOOK_SECRET", secret)
    view, shown = webhooks.add_endpoint(engine, "team", receiver.url, "cli", secret_env="TEAM_HOOK_SECRET")
    assert shown is None and view.secret_from == "env TEAM_HOOK_SECRET"
    assert webhooks.send_test(engine, "team", "cli").status == "delivered"
    assert receiver.verified(secret)[0]["type"] == "webhook.test"
    monkeypatch.delenv("TEAM_HOOK_SECRET")
    raise_tests(engine, 1)
    webhooks.deliver_due(engine, "test")
    row = deliveries(engine)[-1]
    assert row.status == "pending" and "TEAM_HOOK_SECRET is empty" in row.last_error and len(receiver.got) == 1
    with Session(engine) as session:
        assert [e.secret for e in session.exec(select(WebhookEndpoint))] == [None]

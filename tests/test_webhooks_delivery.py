"""Webhook delivery that survives (core/records/notifications/webhooks.py), against real HTTP receivers on loopback ports whose
bodies the `standardwebhooks` package's own verifier checks: a receiver down for ten minutes (the clock advanced,
not waited for) gets every event on Standard Webhooks' retry schedule; a bad secret on one endpoint is recorded
there and leaves another's deliveries flowing; a hanging receiver delays only its own; a Test is sent once, even
while a worker's pass runs beside it or the button's press arrives twice; a given-up delivery raises a notice;
the signing secret is not in the database file, `migrate` encrypts one stored before, and a missing key says so."""

from __future__ import annotations

import os
import socket
import stat
import threading
from datetime import UTC, datetime, timedelta

import pytest
import standardwebhooks.webhooks
from sqlmodel import Session, select

from core.cli import main as cli
from core.records.notifications import webhooks
from core.secrets import SEALED
from core.settings import get_settings
from storage.db import session_scope
from storage.tables import WebhookEndpoint, utcnow
from tests.test_webhooks import Receiver, deliveries, raise_tests
from tests.ui_support import run_app


@pytest.fixture
def receivers(monkeypatch):
    monkeypatch.setenv("TFGRPO_WEBHOOK_ALLOWLIST", "127.0.0.1")  # receivers on loopback: an administrator's leave
    get_settings.cache_clear()
    made: list[Receiver] = []

    def make() -> Receiver:
        made.append(Receiver())
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()
    get_settings.cache_clear()


class Clock:
    """The studio's and the verifier's clock, moved by the test instead of waited for."""

    def __init__(self) -> None:
        self.now = utcnow()

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    found = Clock()
    monkeypatch.setattr(webhooks, "utcnow", lambda: found.now)

    class VerifierTime(datetime):
        @classmethod
        def now(cls, tz=None):
            return found.now.astimezone(tz or UTC)

    monkeypatch.setattr(standardwebhooks.webhooks, "datetime", VerifierTime)
    return found


def test_a_receiver_down_for_ten_minutes_gets_every_event(engine, receivers, clock):
    receiver = receivers()
    _view, receiver.secret = webhooks.add_endpoint(engine, "team", receiver.url, "cli")
    receiver.mode = "down"
    raise_tests(engine, 3)
    while clock.now - deliveries(engine)[0].created_at.replace(tzinfo=UTC) < timedelta(minutes=10):
        webhooks.deliver_due(engine, "worker")
        clock.advance(10)
    down = deliveries(engine)
    assert {row.status for row in down} == {"pending"} and down[0].attempts == 3  # at 0 s, 5 s, 5 min 5 s
    receiver.mode = "ok"
    for _ in range(24 * 6):  # up to a day, ten minutes at a time
        if {row.status for row in deliveries(engine)} == {"delivered"}:
            break
        webhooks.deliver_due(engine, "worker")
        clock.advance(600)
    assert [payload["data"]["i"] for payload in receiver.checked] == [0, 1, 2]
    assert [row.status for row in deliveries(engine)] == ["delivered"] * 3
    assert deliveries(engine)[0].attempts == 4  # the 4th attempt, 30 min after the 3rd


def test_a_receiver_back_after_a_12_minute_outage_gets_every_waiting_event_within_a_minute(engine, receivers, clock):
    """Issue 61, item 4: under the default schedule the oldest delivery waited for its 4th attempt (30 min after the
    3rd) and the ones behind it waited for it: 23 minutes late. An early try a minute after the last one, which
    does not count as an attempt, hears the receiver is back; everything waiting follows at once, in order."""
    receiver = receivers()
    _view, receiver.secret = webhooks.add_endpoint(engine, "team", receiver.url, "cli")
    receiver.mode = "down"
    raise_tests(engine, 8)
    started = clock.now
    while clock.now - started < timedelta(minutes=12):  # the worker's pass every 10 s
        webhooks.deliver_due(engine, "worker")
        clock.advance(10)
    down = deliveries(engine)
    assert {row.status for row in down} == {"pending"} and max(row.attempts for row in down) == 3  # not counted
    receiver.mode = "ok"
    back = clock.now
    while {row.status for row in deliveries(engine)} != {"delivered"} and clock.now - back < timedelta(hours=1):
        webhooks.deliver_due(engine, "worker")
        clock.advance(10)
    assert clock.now - back <= timedelta(minutes=1)
    assert [payload["data"]["i"] for payload in receiver.checked] == list(range(8))  # in order, each once, verified


def test_webhook_deliver_now_sends_what_waits_for_one_receiver(engine, receivers, clock, capsys):
    receiver = receivers()
    _view, receiver.secret = webhooks.add_endpoint(engine, "team", receiver.url, "cli")
    receiver.mode = "down"
    raise_tests(engine, 2)
    webhooks.deliver_due(engine, "worker")  # the first attempt fails: the head now waits 5 s, the other behind it
    receiver.mode = "ok"
    url = engine.url.render_as_string(hide_password=False)
    assert cli(["--db", url, "webhook", "deliver", "--now", "team"]) == 0
    assert "2 attempt(s) made" in capsys.readouterr().out
    assert [payload["data"]["i"] for payload in receiver.checked] == [0, 1]


def test_a_receiver_that_trickles_its_answer_is_cut_at_the_attempts_one_deadline(engine, receivers, monkeypatch):
    """Issue 61, item 6: each read had its timeout but the attempt had none in total, so a receiver sending a byte
    at a time outlived its claim and another sender resent the same webhook-id. One deadline (3 x the timeout, under
    the claim) ends the attempt."""
    import time

    monkeypatch.setenv("TFGRPO_WEBHOOK_TIMEOUT_S", "1")
    get_settings.cache_clear()
    receiver = receivers()
    webhooks.add_endpoint(engine, "slow", receiver.url, "cli")
    receiver.mode = "trickle"
    raise_tests(engine, 1)
    started = time.monotonic()
    assert webhooks.deliver_due(engine, "worker") == 1
    took = time.monotonic() - started
    [row] = deliveries(engine)
    assert row.status == "pending" and "deadline" in row.last_error, row.last_error
    assert 2.5 <= took < 5 and webhooks.total_deadline_s() < webhooks._hold_s()  # the answer would take 14 s
    get_settings.cache_clear()


def test_a_bad_secret_on_one_endpoint_leaves_anothers_deliveries_flowing(engine, receivers, monkeypatch):
    bad, good = receivers(), receivers()
    monkeypatch.setenv("BAD_HOOK_SECRET", webhooks.new_secret())
    webhooks.add_endpoint(engine, "bad", bad.url, "cli", secret_env="BAD_HOOK_SECRET")  # made first: sent first
    _view, good.secret = webhooks.add_endpoint(engine, "good", good.url, "cli")
    monkeypatch.setenv("BAD_HOOK_SECRET", "not-base64")  # changed after it was added
    with pytest.raises(Exception, match="does not hold a Standard Webhooks secret"):
        webhooks.add_endpoint(engine, "worse", good.url, "cli", secret_env="BAD_HOOK_SECRET")
    raise_tests(engine, 3)
    webhooks.deliver_due(engine, "worker")
    assert [payload["data"]["i"] for payload in good.checked] == [0, 1, 2] and bad.got == []
    with Session(engine) as session:
        bad_id = session.exec(select(WebhookEndpoint.id).where(WebhookEndpoint.name == "bad")).one()
    first_bad = next(row for row in deliveries(engine) if row.endpoint_id == bad_id)
    assert (first_bad.status, first_bad.attempts) == ("pending", 1)
    assert "signing secret of webhook bad is not a whsec_ base64 secret" in first_bad.last_error


def test_a_name_that_does_not_resolve_is_retried(engine, receivers, monkeypatch):
    monkeypatch.setenv("TFGRPO_WEBHOOK_RETRY_SCHEDULE_S", "[0]")
    get_settings.cache_clear()
    receiver = receivers()
    webhooks.add_endpoint(engine, "team", receiver.url, "cli")
    raise_tests(engine, 1)
    real, dns_down = socket.getaddrinfo, threading.Event()

    def resolver(*args, **kwargs):
        if dns_down.is_set():
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(*args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    dns_down.set()
    webhooks.deliver_due(engine, "worker")
    [row] = deliveries(engine)
    assert (row.status, row.attempts) == ("pending", 1) and "does not resolve (DNS)" in row.last_error
    dns_down.clear()
    webhooks.deliver_due(engine, "worker")
    assert deliveries(engine)[0].status == "delivered" and len(receiver.got) == 1


def test_a_hanging_receiver_delays_only_its_own_deliveries(engine, receivers, monkeypatch):
    monkeypatch.setenv("TFGRPO_WEBHOOK_TIMEOUT_S", "30")
    get_settings.cache_clear()
    hanging, healthy = receivers(), receivers()
    hanging.mode = "hang"
    webhooks.add_endpoint(engine, "hanging", hanging.url, "cli")  # made first: a pass in turn would wait for it
    webhooks.add_endpoint(engine, "healthy", healthy.url, "cli")
    raise_tests(engine, 2)
    passing = threading.Thread(target=webhooks.deliver_due, args=(engine, "worker"), daemon=True)
    passing.start()
    assert hanging.hit.wait(10)
    arrived = healthy.hit.wait(10)  # while the hanging receiver still holds its first delivery
    while arrived and len(healthy.got) < 2 and passing.is_alive():
        healthy.hit.clear()
        healthy.hit.wait(10)
    healthy_got, hanging_got = len(healthy.got), len(hanging.got)
    hanging.release.set()
    passing.join(40)
    assert arrived and (healthy_got, hanging_got) == (2, 1)
    assert [row.status for row in deliveries(engine)] == ["delivered"] * 4


def test_a_test_is_sent_once_beside_a_workers_pass_and_once_per_press(engine, receivers):
    receiver = receivers()
    webhooks.add_endpoint(engine, "team", receiver.url, "cli")
    receiver.mode = "hang"  # the test's post waits here while a worker's pass runs
    tested: list = []
    testing = threading.Thread(target=lambda: tested.append(webhooks.send_test(engine, "team", "cli")), daemon=True)
    testing.start()
    assert receiver.hit.wait(10)
    receiver.mode = "ok"
    webhooks.deliver_due(engine, "worker")  # the test's row is pending and claimed by the test: not sent again
    receiver.release.set()
    testing.join(20)
    assert [tested[0].status] == ["delivered"] and len(receiver.got) == 1
    first = webhooks.send_test(engine, "team", "cli", press="press-1")
    again = webhooks.send_test(engine, "team", "cli", press="press-1")  # a double click: the same press
    assert again.id == first.id and len(receiver.got) == 2
    assert [headers["webhook-id"] for headers, _b, _p in receiver.got][1] == "msg_test_press-1"


def test_a_given_up_delivery_raises_a_notice_on_the_overview(app_engine, receivers, monkeypatch):
    monkeypatch.setenv("TFGRPO_WEBHOOK_MAX_ATTEMPTS", "1")
    get_settings.cache_clear()
    receiver = receivers()
    receiver.mode = "error"
    webhooks.add_endpoint(app_engine, "team", receiver.url, "cli")
    assert webhooks.send_test(app_engine, "team", "cli").status == "failed"  # a test's failure is no notice
    at = run_app()
    assert not [w.value for w in at.warning if "given up" in w.value]
    with session_scope(app_engine) as session:
        webhooks.raise_event(session, "run.failed", "Run 7 failed", {"run": 7})
    webhooks.deliver_due(app_engine, "worker")
    at.run()
    [notice] = [w.value for w in at.warning if "given up" in w.value]
    assert "1 webhook delivery was given up" in notice and "run.failed to team" in notice
    assert webhooks.dismiss_given_up(app_engine, "cli") == 1
    at.run()
    assert not [w.value for w in at.warning if "given up" in w.value]


@pytest.mark.sqlite_only
def test_the_signing_secret_is_not_in_the_database_file(engine, receivers):
    receiver = receivers()
    _view, receiver.secret = webhooks.add_endpoint(engine, "team", receiver.url, "cli")
    assert webhooks.send_test(engine, "team", "cli").status == "delivered" and len(receiver.checked) == 1
    engine.dispose()
    stored = b"".join(open(path, "rb").read() for path in (engine.url.database, engine.url.database + "-wal")
                      if os.path.exists(path))
    key = receiver.secret.removeprefix("whsec_")
    assert receiver.secret.encode() not in stored and key.encode() not in stored and SEALED.encode() in stored


def test_migrate_encrypts_a_secret_stored_before_and_a_missing_key_says_so(engine, receivers, monkeypatch, tmp_path,
                                                                          capsys):
    receiver = receivers()
    monkeypatch.delenv("TFGRPO_SECRET_KEY")
    monkeypatch.setenv("TFGRPO_SECRET_KEY_FILE", str(tmp_path / "keys" / "studio.key"))
    get_settings.cache_clear()
    webhooks.add_endpoint(engine, "team", receiver.url, "cli")  # the first secret makes the key file
    assert stat.S_IMODE(os.stat(tmp_path / "keys" / "studio.key").st_mode) == 0o600
    receiver.secret = webhooks.new_secret()
    with session_scope(engine) as session:  # as an older release stored it
        row = session.exec(select(WebhookEndpoint)).one()
        row.secret = receiver.secret
        session.add(row)
    assert "stored in plain text" in webhooks.secrets_problem(engine)
    url = engine.url.render_as_string(hide_password=False)
    assert cli(["--db", url, "migrate"]) == 0
    assert "encrypted 1 stored webhook signing secret(s)" in capsys.readouterr().out
    with Session(engine) as session:
        assert session.exec(select(WebhookEndpoint)).one().secret.startswith(SEALED)
    assert webhooks.secrets_problem(engine) is None
    assert webhooks.send_test(engine, "team", "cli").status == "delivered" and len(receiver.checked) == 1
    (tmp_path / "keys" / "studio.key").unlink()
    assert cli(["--db", url, "migrate"]) == 0
    assert "the key that decrypts stored secrets is missing" in capsys.readouterr().out
    row = webhooks.send_test(engine, "team", "cli")
    assert row.status == "failed" and "key that decrypts stored secrets is missing" in row.last_error
    assert len(receiver.got) == 1


def key_file_only(monkeypatch, tmp_path):
    monkeypatch.delenv("TFGRPO_SECRET_KEY")
    monkeypatch.setenv("TFGRPO_SECRET_KEY_FILE", str(tmp_path / "keys" / "studio.key"))
    get_settings.cache_clear()
    return tmp_path / "keys" / "studio.key"


def sealed_secret(engine) -> str:
    with Session(engine) as session:
        return session.exec(select(WebhookEndpoint)).one().secret


def test_secrets_rotate_seals_again_under_a_new_key_and_deliveries_still_verify(engine, receivers, monkeypatch,
                                                                                tmp_path, capsys):
    """Issue 61: no MultiFernet and no re-seal command, so a key could never change. `secrets rotate` writes a new
    key before the old one, seals every secret again under it, then drops the old one; the receiver's secret (the
    whsec_ it verifies with) is the same, so nothing changes on its side."""
    path = key_file_only(monkeypatch, tmp_path)
    receiver = receivers()
    _view, receiver.secret = webhooks.add_endpoint(engine, "team", receiver.url, "cli")
    old_key, old_sealed = path.read_text(), sealed_secret(engine)
    url = engine.url.render_as_string(hide_password=False)
    assert cli(["--db", url, "secrets", "rotate"]) == 0
    assert "sealed 1 secret(s) again under a new key" in capsys.readouterr().out
    new_key = path.read_text()
    assert new_key != old_key and len(new_key.split()) == 1 and sealed_secret(engine) != old_sealed
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert webhooks.secrets_problem(engine) is None
    assert webhooks.send_test(engine, "team", "cli").status == "delivered" and len(receiver.checked) == 1
    path.write_text(old_key)  # the old key alone no longer opens it
    assert "cannot be opened" in webhooks.secrets_problem(engine)


def test_a_key_in_the_environment_rotates_by_new_then_old(engine, receivers, monkeypatch):
    from cryptography.fernet import Fernet

    receiver = receivers()
    _view, receiver.secret = webhooks.add_endpoint(engine, "team", receiver.url, "cli")
    old = os.environ["TFGRPO_SECRET_KEY"]
    new = Fernet.generate_key().decode()
    monkeypatch.setenv("TFGRPO_SECRET_KEY", f"{new},{old}")
    get_settings.cache_clear()
    assert webhooks.secrets_problem(engine) is None  # both open it: the old key is still read
    assert "remove them" in webhooks.rotate_secrets(engine, "cli")
    monkeypatch.setenv("TFGRPO_SECRET_KEY", new)
    get_settings.cache_clear()
    assert webhooks.secrets_problem(engine) is None
    assert webhooks.send_test(engine, "team", "cli").status == "delivered" and len(receiver.checked) == 1


def test_webhook_add_with_the_key_file_gone_refuses_and_names_the_key(engine, receivers, monkeypatch, tmp_path):
    """Issue 61: with the key file gone, `webhook add` made a new key file silently; once the original was back,
    the new endpoint could not sign. Now it refuses while sealed secrets exist, naming the missing key."""
    path = key_file_only(monkeypatch, tmp_path)
    webhooks.add_endpoint(engine, "team", receivers().url, "cli")
    path.unlink()
    with pytest.raises(webhooks.InvalidInput, match=f"restore the key file {path}"):
        webhooks.add_endpoint(engine, "other", receivers().url, "cli")
    assert not path.exists()
    with Session(engine) as session:
        assert [row.name for row in webhooks.endpoints(session)] == ["team"]


def self_signed(tmp_path, host: str) -> tuple[str, str]:
    """A certificate for `host` signed by itself, and its key: the receiver's, and the only root trusted."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_https_to_the_pinned_address_still_checks_the_certificate_by_name(engine, receivers, monkeypatch, tmp_path):
    """The connection goes to the checked address, while the Host header, TLS's SNI and the certificate check use
    the URL's name: a receiver whose certificate names another host is refused."""
    import ssl

    receiver = receivers()
    cert, key = self_signed(tmp_path, "hooks.example.com")
    served_names: list[str | None] = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: served_names.append(name)
    receiver.server.socket = context.wrap_socket(receiver.server.socket, server_side=True)
    monkeypatch.setenv("TFGRPO_WEBHOOK_CA_FILE", cert)  # a private CA, the one root the studio trusts here
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, *a, **k: real(
        "127.0.0.1" if host in ("hooks.example.com", "other.example.com") else host, port, *a, **k))
    monkeypatch.setenv("TFGRPO_WEBHOOK_ALLOWLIST", "127.0.0.1")
    get_settings.cache_clear()
    port = receiver.server.server_address[1]
    _view, receiver.secret = webhooks.add_endpoint(engine, "tls", f"https://hooks.example.com:{port}/h", "cli")
    assert webhooks.send_test(engine, "tls", "cli").status == "delivered"
    assert served_names == ["hooks.example.com"] and receiver.got[0][0]["host"] == f"hooks.example.com:{port}"
    webhooks.add_endpoint(engine, "wrong-name", f"https://other.example.com:{port}/h", "cli")
    row = webhooks.send_test(engine, "wrong-name", "cli")
    assert row.status == "failed" and row.last_error == "no connection (refused, unreachable or TLS failed)"
    assert len(receiver.checked) == 1

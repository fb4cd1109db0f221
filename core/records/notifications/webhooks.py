"""Webhooks: tell a team's tools when a person is needed, signed by the Standard Webhooks scheme.

An event is written to the outbox (WebhookDelivery, one row per endpoint that hears it) in the transaction of
the change that raised it, by a one-line `notify_*` call there; nothing is sent from that job. A worker's
delivery threads (Deliverer, started by core/jobs/worker.py) send the rows later: endpoints side by side, each
endpoint's rows one at a time and in order, each attempt claimed first so nobody sends it twice, retried on
Standard Webhooks' schedule; whatever goes wrong with one endpoint is recorded on its delivery and stops no
other. After the last attempt a delivery is failed (a notice on the Notifications page and the Overview) and
stays in the log, from where a person replays it.

Where a receiver may be: public unicast addresses, and whatever an administrator's allowlist
(TFGRPO_WEBHOOK_ALLOWLIST) admits; cloud metadata addresses never. The host is resolved once per attempt and the
connection goes to the very address that was checked (PinnedTransport), so a DNS answer that changes in between
cannot point it elsewhere. A redirect is not followed.

What each event says is core/records/notifications/events.py. The signing secret has to be stored to sign (unlike a
provider's API key, which stays in the environment): it is stored encrypted (core.secrets.seal), shown once when
an endpoint is made and never again, not on a page, in a list, an audit event or a log; an endpoint can instead
name an environment variable that holds it (`secret_env`).
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import socket
import ssl
import threading
import urllib.parse
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

import certifi
import httpcore
import httpx
from sqlalchemy import func, or_, true, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select
from standardwebhooks import Webhook

from core.domain import webhooks as wh
from core.errors import Conflict, InvalidInput, NotFound
from core.records.notifications.events import notify_stalled_jobs, raise_event
from core.records.notifications.secret_key import key_file, key_from_environment, secret_key, write_key_file
from core.records.people.roles import require_role
from core.secrets import KEY_ENV, is_sealed, key_list, new_key, reseal, seal, unseal
from core.settings import get_settings, secret
from storage.db import session_scope
from storage.fencing import holding
from storage.statuses import DeliveryStatus
from storage.tables import (
    AuditEvent,
    WebhookDelivery,
    WebhookEndpoint,
    as_utc,
    utcnow,
)

log = logging.getLogger(__name__)
EVENTS = wh.EVENTS


# ---- endpoints -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EndpointView:
    """An endpoint as pages and lists show it: never its secret, and its URL without path (it may hold a token)."""

    id: int
    name: str
    url: str
    events: list[str]
    active: bool
    secret_from: str  # "stored" or "env NAME"
    created_by: str

    @classmethod
    def of(cls, row: WebhookEndpoint) -> EndpointView:
        return cls(row.id, row.name, wh.shown_url(row.url), list(row.events or []), row.active,
                   f"env {row.secret_env}" if row.secret_env else "stored", row.created_by)


def new_secret() -> str:
    """A Standard Webhooks secret: `whsec_` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def check_url(url: str) -> str:
    """The URL, checked: http(s) with a host that resolves, to public unicast addresses only unless the
    administrator's allowlist admits the host or its addresses; InvalidInput saying why otherwise."""
    url = (url or "").strip()
    problem = wh.url_problem(url)
    if problem:
        raise InvalidInput(problem)
    host = urllib.parse.urlsplit(url).hostname or ""
    addresses = resolve(host)
    if addresses is None:
        raise InvalidInput(f"the webhook host {host} does not resolve")
    reason = refusal(host, addresses)
    if reason:
        raise InvalidInput(reason)
    return url


def resolve(host: str) -> list[str] | None:
    """The host's addresses, in the resolver's order (an address literal: itself); None when it does not
    resolve. Called once per attempt: the attempt connects to one of these, never resolving again."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    return list(dict.fromkeys(str(info[4][0]) for info in infos)) or None


def refusal(host: str, addresses: list[str]) -> str | None:
    """Why the host may not receive (one of its addresses is not public unicast and not admitted by
    TFGRPO_WEBHOOK_ALLOWLIST, or is a metadata address), or None."""
    try:
        allowed = wh.allowlist(get_settings().webhook_allowlist)
    except ValueError as exc:
        return f"TFGRPO_WEBHOOK_ALLOWLIST: {exc}"
    for address in addresses:
        reason = wh.refused_reason(address)
        if reason and not wh.admitted(host, address, allowed):
            if address != host.strip("[]"):  # a name's internal address is not told: no probing internal DNS
                reason = reason.replace(f" ({address})", "")
            return (f"the webhook host {host} resolves to {reason}: refused (an administrator admits an internal "
                    "receiver by its host or network in TFGRPO_WEBHOOK_ALLOWLIST; a metadata address never)")
    return None


def add_endpoint(engine: Engine, name: str, url: str, actor: str, *, events: list[str] | None = None,
                 secret_env: str | None = None) -> tuple[EndpointView, str | None]:
    """Configure a receiver (admin only). Returns it and its new secret, the one time the secret is shown (None
    when `secret_env` names the environment variable that holds it)."""
    name = (name or "").strip()
    if not name or len(name) > 60:
        raise InvalidInput("give the webhook a name of 1-60 characters, e.g. team-chat")
    url = check_url(url)
    try:
        events = wh.event_names(events)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    if secret_env is not None and not secret(secret_env):
        raise InvalidInput(f"environment variable {secret_env} is not set or empty: put the whsec_ secret in it")
    if secret_env is not None and not usable_secret(secret(secret_env)):
        raise InvalidInput(f"environment variable {secret_env} does not hold a Standard Webhooks secret (whsec_ and "
                           "base64, e.g. what `python -m core webhook add` makes)")
    made = None if secret_env else new_secret()
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "configuring webhooks")
        if session.exec(select(WebhookEndpoint).where(WebhookEndpoint.name == name)).first():
            raise Conflict(f"a webhook named {name} exists; remove it first or choose another name")
        sealed = seal(made, sealing_key(session)) if made else None
        row = WebhookEndpoint(name=name, url=url, events=events, secret=sealed, secret_env=secret_env, created_by=actor)
        session.add(row)
        session.flush()
        session.add(AuditEvent(actor=actor, action="webhook.add", object_type="webhookendpoint", object_id=row.id,
                               after={"name": name, "url": wh.shown_url(url), "events": events}))
        return EndpointView.of(row), made


def endpoints(session: Session) -> list[EndpointView]:
    return [EndpointView.of(row) for row in session.exec(select(WebhookEndpoint).order_by(WebhookEndpoint.name))]


def _endpoint(session: Session, name: str) -> WebhookEndpoint:
    row = session.exec(select(WebhookEndpoint).where(WebhookEndpoint.name == name)).first()
    if row is None:
        raise NotFound(f"no webhook named {name}")
    return row


def remove_endpoint(engine: Engine, name: str, actor: str) -> None:
    """Remove a receiver and its delivery log (admin only); what it has not been sent is dropped with it."""
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "removing webhooks")
        row = _endpoint(session, name)
        for delivery in session.exec(select(WebhookDelivery).where(WebhookDelivery.endpoint_id == row.id)):
            session.delete(delivery)
        session.flush()
        session.add(AuditEvent(actor=actor, action="webhook.remove", object_type="webhookendpoint", object_id=row.id,
                               before={"name": row.name, "url": wh.shown_url(row.url)}))
        session.delete(row)


# ---- delivering (the worker) -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Attempt:
    """What one attempt found: delivered, or the code/error and whether another attempt may help. The error
    says refused, timeout, no connection or the HTTP status: no more, so an attempt cannot probe a network."""

    delivered: bool
    code: int | None
    error: str | None
    retry: bool


def usable_secret(value: str) -> bool:
    """Whether `value` is a Standard Webhooks secret: `whsec_` (optional) and strict base64 of 16 bytes or more
    (standardwebhooks itself reads sloppier text, or raises only when it signs)."""
    try:
        return len(base64.b64decode(value.removeprefix("whsec_"), validate=True)) >= 16
    except ValueError:  # binascii.Error is one
        return False


def _secret_of(endpoint: WebhookEndpoint) -> str:
    value = secret(endpoint.secret_env) if endpoint.secret_env else unseal(endpoint.secret or "", secret_key())
    if not value:
        raise InvalidInput(f"the secret of webhook {endpoint.name} is missing (environment variable "
                           f"{endpoint.secret_env} is empty)")
    return value


def signed_request(endpoint: WebhookEndpoint, delivery: WebhookDelivery, moment: datetime) -> tuple[bytes, dict]:
    """The body and the Standard Webhooks headers of one attempt (signed at the moment it is sent)."""
    content = json.dumps(delivery.payload, separators=(",", ":"), ensure_ascii=False)
    signature = Webhook(_secret_of(endpoint)).sign(delivery.message_id, moment, content)
    return content.encode(), {"webhook-id": delivery.message_id, "webhook-timestamp": str(int(moment.timestamp())),
                              "webhook-signature": signature, "content-type": "application/json",
                              "user-agent": "tfgrpo-studio-webhooks"}


class _Tracked(httpcore.NetworkStream):
    """A connection whose TLS layer, once started, is remembered too, so the deadline can end it."""

    def __init__(self, inner: httpcore.NetworkStream, seen: list) -> None:
        self._inner, self._seen = inner, seen

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None, timeout: float | None = None):
        secured = self._inner.start_tls(ssl_context, server_hostname, timeout)
        self._seen.append(secured)
        return _Tracked(secured, self._seen)

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _PinnedBackend(httpcore.NetworkBackend):
    """httpcore's own socket backend, except that every connection goes to the one address that was checked:
    the URL's host name still goes in the Host header, TLS's SNI and the certificate check."""

    def __init__(self, address: str) -> None:
        self._address = address
        self._inner = httpcore.SyncBackend()
        self.streams: list[httpcore.NetworkStream] = []

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options=None) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(self._address, port, timeout, local_address, socket_options)
        self.streams.append(stream)
        return _Tracked(stream, self.streams)

    def cut(self) -> None:
        """End every connection now, from another thread: a blocked read returns (shutdown, not close)."""
        for stream in self.streams:
            sock = stream.get_extra_info("socket")
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except (OSError, AttributeError):
                pass

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options=None):
        raise httpcore.ConnectError("a webhook never goes through a Unix socket")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class PinnedTransport(httpx.HTTPTransport):
    """An httpx transport bound to one checked address (no second resolution, so no DNS rebinding), verifying
    https against the host name with certifi's roots, as httpx does by default (or TFGRPO_WEBHOOK_CA_FILE's)."""

    def __init__(self, address: str) -> None:
        super().__init__(retries=0)
        roots = str(get_settings().webhook_ca_file or certifi.where())
        self.backend = _PinnedBackend(address)
        self._pool = httpcore.ConnectionPool(ssl_context=ssl.create_default_context(cafile=roots),
                                             max_connections=1, network_backend=self.backend)


def attempt(endpoint: WebhookEndpoint, delivery: WebhookDelivery) -> Attempt:
    """Send one delivery once: a 2xx answer delivers; a redirect is not followed and not retried (configure its
    target); an address not allowed is refused at once; no answer within TFGRPO_WEBHOOK_TIMEOUT_S, no
    connection, a name that does not resolve, an unusable secret or another code may be retried."""
    settings = get_settings()
    host = urllib.parse.urlsplit(endpoint.url).hostname or ""
    addresses = resolve(host)  # the one resolution of this attempt: its checked address is where it connects
    if addresses is None:
        return Attempt(False, None, f"the host {host} does not resolve (DNS)", retry=True)
    reason = refusal(host, addresses)
    if reason:
        return Attempt(False, None, reason, retry=False)
    try:
        content, headers = signed_request(endpoint, delivery, utcnow())
    except InvalidInput as exc:
        return Attempt(False, None, str(exc), retry=True)
    except Exception:  # noqa: BLE001  (standardwebhooks raises binascii.Error and others on a bad secret)
        return Attempt(False, None, f"the signing secret of webhook {endpoint.name} is not a whsec_ base64 "
                       "secret: fix it (its environment variable) and the next attempt signs", retry=True)
    timeout = settings.webhook_timeout_s
    transport = PinnedTransport(wh.canonical_address(addresses[0]))
    expired = threading.Event()

    def cut() -> None:
        expired.set()  # before the cut: the sender's thread may see its error before this thread returns
        transport.backend.cut()

    deadline = threading.Timer(total_deadline_s(), cut)  # one deadline for the whole attempt
    deadline.daemon = True
    deadline.start()
    try:
        with httpx.Client(transport=transport, timeout=timeout,
                          follow_redirects=False,
                          trust_env=False) as client, \
                client.stream("POST", endpoint.url, content=content, headers=headers) as response:
            code, redirect, location = response.status_code, response.is_redirect, response.headers.get("location")
    except httpx.TimeoutException:
        return Attempt(False, None, f"no answer within {timeout:g} s (timeout)", retry=True)
    except (httpx.HTTPError, OSError):
        if expired.is_set():
            return Attempt(False, None, f"no whole answer within {total_deadline_s():g} s (the attempt's deadline)",
                           retry=True)
        return Attempt(False, None, "no connection (refused, unreachable or TLS failed)", retry=True)
    finally:
        deadline.cancel()
    if 200 <= code < 300:
        return Attempt(True, code, None, retry=False)
    if redirect:
        target = wh.shown_url(urllib.parse.urljoin(endpoint.url, location)) if location else "nowhere"
        return Attempt(False, code, f"redirected to {target}: not followed (configure the final URL)", retry=False)
    return Attempt(False, code, f"the receiver answered HTTP {code}", retry=True)


def _record(engine: Engine, delivery_id: int, result: Attempt, claim: str) -> WebhookDelivery | None:
    """Log an attempt on its delivery and release its claim; None when the claim was lost (its webhook was
    removed, or another sender holds it): what this attempt found is then not the log's to keep."""
    settings = get_settings()
    with holding(None), session_scope(engine) as session:
        row = session.get(WebhookDelivery, delivery_id)
        if row is None or row.claimed_by != claim:
            return None
        row.attempts += 1
        row.last_code, row.last_error = result.code, result.error
        row.claimed_by, row.claimed_until = None, None
        if result.delivered:
            row.status, row.delivered_at = DeliveryStatus.DELIVERED, utcnow()
        elif not result.retry or row.attempts >= settings.webhook_max_attempts:
            row.status = DeliveryStatus.FAILED
            if result.retry:
                row.last_error = f"{result.error}; gave up after {row.attempts} attempts"
        else:
            wait = wh.retry_wait_s(row.attempts, settings.webhook_retry_schedule_s)
            row.next_attempt_at = utcnow() + timedelta(seconds=wait)
        session.add(row)
        if not result.delivered:
            log.warning("webhook delivery %s (%s) attempt %d: %s", row.id, row.event_type, row.attempts, row.last_error)
        return row


PROBE_EVERY_S = 60.0  # a receiver that failed is tried this often beside its back-off, uncounted, to hear it is back


def _probe_due(head: WebhookDelivery, endpoint: WebhookEndpoint, now: datetime) -> bool:
    """Whether the endpoint's waiting head delivery (not due yet) is tried early now: a minute after its last
    attempt and after the last early try. A receiver that answers again then gets everything waiting within about a
    minute, in order, where the back-off alone would wait up to its next step (30 min, 2 h, ...)."""
    settings = get_settings()
    last_attempt = as_utc(head.next_attempt_at) - timedelta(
        seconds=wh.retry_wait_s(head.attempts, settings.webhook_retry_schedule_s))
    last = max(last_attempt, as_utc(endpoint.probed_at)) if endpoint.probed_at else last_attempt
    return head.attempts > 0 and now - last >= timedelta(seconds=PROBE_EVERY_S)


def _record_probe(engine: Engine, delivery_id: int, endpoint_id: int, result: Attempt, claim: str,
                  now: datetime) -> WebhookDelivery | None:
    """An early try's outcome: delivered, it counts as the delivery's attempt; failed, it leaves the delivery's
    attempts and back-off as they were (only its last error is the probe's)."""
    with holding(None), session_scope(engine) as session:
        session.exec(update(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id).values(probed_at=now))
    if result.delivered:
        return _record(engine, delivery_id, result, claim)
    with holding(None), session_scope(engine) as session:
        row = session.get(WebhookDelivery, delivery_id)
        if row is None or row.claimed_by != claim:
            return None
        row.last_code, row.last_error = result.code, f"{result.error} (an early try, not counted)"
        row.claimed_by, row.claimed_until = None, None
        session.add(row)
        return row


def _hold_s() -> float:
    """How long a claim lasts: past the longest an attempt can take (its total deadline)."""
    return get_settings().webhook_timeout_s * 4 + 30


def total_deadline_s() -> float:
    """The one deadline of a whole attempt, shorter than its claim: a receiver that trickles its answer a byte at a
    time (each read within the timeout) is cut there, before another sender could take the claim and resend."""
    return get_settings().webhook_timeout_s * 3


def _claim_delivery(engine: Engine, delivery_id: int, claim: str) -> bool:
    """Take the one right to attempt a pending delivery now (a conditional update: of two senders, one wins)."""
    now = utcnow()
    with holding(None), session_scope(engine) as session:
        free = or_(col(WebhookDelivery.claimed_until).is_(None), WebhookDelivery.claimed_until < now)
        return session.exec(update(WebhookDelivery).where(
            WebhookDelivery.id == delivery_id, WebhookDelivery.status == DeliveryStatus.PENDING, free)
            .values(claimed_by=claim, claimed_until=now + timedelta(seconds=_hold_s()))).rowcount == 1


def _claim_endpoint(engine: Engine, endpoint_id: int, owner: str) -> bool:
    """Hold an endpoint for one worker's pass, so deliveries of one endpoint go one at a time and in order."""
    now = utcnow()
    with holding(None), session_scope(engine) as session:
        free = or_(col(WebhookEndpoint.busy_until).is_(None), WebhookEndpoint.busy_until < now,
                   WebhookEndpoint.busy_by == owner)
        return session.exec(update(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id, free)
                            .values(busy_by=owner, busy_until=now + timedelta(seconds=_hold_s()))).rowcount == 1


def _free_endpoint(engine: Engine, endpoint_id: int, owner: str) -> None:
    with holding(None), session_scope(engine) as session:
        session.exec(update(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id, WebhookEndpoint.busy_by == owner)
                     .values(busy_by=None, busy_until=None))


def deliver_endpoint(engine: Engine, endpoint_id: int, owner: str, limit: int = 50) -> int:
    """One endpoint's due deliveries, oldest first, while each is delivered: the first that is not (or not due
    yet, or claimed by a Test under way) holds the later ones back, so its receiver gets them in order. Returns
    the attempts made."""
    if not _claim_endpoint(engine, endpoint_id, owner):
        return 0
    made = 0
    try:
        for _ in range(limit):
            with Session(engine) as session:
                endpoint = session.get(WebhookEndpoint, endpoint_id)
                delivery = session.exec(select(WebhookDelivery).where(
                    WebhookDelivery.endpoint_id == endpoint_id, WebhookDelivery.status == DeliveryStatus.PENDING)
                    .order_by(WebhookDelivery.id)).first()
            now = utcnow()
            if endpoint is None or delivery is None:
                break
            probe = as_utc(delivery.next_attempt_at) > now
            if probe and not _probe_due(delivery, endpoint, now):
                break
            claim = f"{owner}:{uuid.uuid4().hex[:8]}"
            if not _claim_delivery(engine, delivery.id, claim):
                break
            made += 1
            try:
                result = attempt(endpoint, delivery)
            except Exception as exc:  # noqa: BLE001  (anything unforeseen is this delivery's, never the others')
                log.warning("webhook delivery %s failed unexpectedly", delivery.id, exc_info=True)
                result = Attempt(False, None, f"the attempt failed inside the studio ({type(exc).__name__})", True)
            row = (_record_probe(engine, delivery.id, endpoint_id, result, claim, now) if probe
                   else _record(engine, delivery.id, result, claim))
            if row is None or row.status == DeliveryStatus.PENDING:
                break
            _claim_endpoint(engine, endpoint_id, owner)  # extend the hold for the next one
    finally:
        _free_endpoint(engine, endpoint_id, owner)
    return made


def _endpoints_due(engine: Engine) -> list[int]:
    """Active endpoints with a pending delivery due now, or whose waiting head is due an early try (an idle endpoint
    takes no thread)."""
    now = utcnow()
    with Session(engine) as session:
        due = set(session.exec(select(WebhookDelivery.endpoint_id).join(
            WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id).where(
            WebhookEndpoint.active == True, WebhookDelivery.status == DeliveryStatus.PENDING,  # noqa: E712
            WebhookDelivery.next_attempt_at <= now)))
        first = (select(func.min(WebhookDelivery.id)).where(WebhookDelivery.status == DeliveryStatus.PENDING)
                 .group_by(WebhookDelivery.endpoint_id))  # each endpoint's head only: the worker asks every pass
        heads = session.exec(select(WebhookDelivery, WebhookEndpoint).join(
            WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id).where(
            WebhookEndpoint.active == True, col(WebhookDelivery.id).in_(first),  # noqa: E712
            col(WebhookDelivery.endpoint_id).not_in(due) if due else true()))
        due |= {endpoint.id for head, endpoint in heads if _probe_due(head, endpoint, now)}
        return sorted(due)


def send_waiting_now(engine: Engine, actor: str, name: str | None = None) -> int:
    """Make every waiting delivery (of one endpoint) due now and send them, in order (`webhook deliver --now`): for
    a receiver known to be back. Returns the attempts made."""
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "sending waiting webhook deliveries")
        query = update(WebhookDelivery).where(WebhookDelivery.status == DeliveryStatus.PENDING)
        if name:
            query = query.where(WebhookDelivery.endpoint_id == _endpoint(session, name).id)
        session.exec(query.values(next_attempt_at=utcnow()))
    return deliver_due(engine, actor)


class Deliverer:
    """A worker's webhook senders: a small pool of threads (TFGRPO_WEBHOOK_THREADS), each endpoint in at most one
    of them at a time, so a receiver that hangs holds its own thread until its timeout and delays no other."""

    def __init__(self, engine: Engine, owner: str, threads: int | None = None) -> None:
        self._engine, self._owner = engine, owner
        self._pool = ThreadPoolExecutor(threads or get_settings().webhook_threads, thread_name_prefix="webhook")
        self._running: dict[int, Future] = {}
        self._lock = threading.Lock()

    def start_due(self, limit: int = 50) -> list[Future]:
        """Raise `run.stalled` for jobs that stopped beating, then start every due endpoint not already being
        sent to by this process; returns their futures without waiting."""
        notify_stalled_jobs(self._engine)
        started = []
        with self._lock:
            for endpoint_id in _endpoints_due(self._engine):
                if endpoint_id in self._running and not self._running[endpoint_id].done():
                    continue
                future = self._pool.submit(self._one, endpoint_id, limit)
                self._running[endpoint_id] = future
                started.append(future)
        return started

    def _one(self, endpoint_id: int, limit: int) -> int:
        try:
            return deliver_endpoint(self._engine, endpoint_id, self._owner, limit)
        except Exception:  # noqa: BLE001  (a locked database: this endpoint's next pass tries again)
            log.warning("webhook delivery to endpoint %s failed", endpoint_id, exc_info=True)
            return 0

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def deliver_due(engine: Engine, owner: str = "deliverer", *, limit: int = 50) -> int:
    """One delivery pass, waited for (the CLI's `webhook deliver`, tests): every due endpoint side by side.
    Returns the attempts made."""
    deliverer = Deliverer(engine, owner)
    try:
        return sum(future.result() for future in deliverer.start_due(limit))
    finally:
        deliverer.close()


# ---- the log, the test and the replay ----------------------------------------------------------------------------

def deliveries(session: Session, name: str | None = None, limit: int = 50) -> list[WebhookDelivery]:
    """The newest deliveries (of one endpoint), newest first: the delivery log."""
    query = select(WebhookDelivery).order_by(col(WebhookDelivery.id).desc()).limit(limit)
    if name:
        query = query.where(WebhookDelivery.endpoint_id == _endpoint(session, name).id)
    return list(session.exec(query))


def endpoint_names(session: Session) -> dict[int, str]:
    return {row.id: row.name for row in session.exec(select(WebhookEndpoint))}


def send_test(engine: Engine, name: str, actor: str, *, press: str | None = None) -> WebhookDelivery:
    """Send a signed `webhook.test` to one endpoint now (admin only) and log it; it does not wait for the
    endpoint's queue, so it says at once whether the receiver answers and verifies. Its row is written claimed,
    so no worker sends it too; `press` (the page's token of one button press) makes a second call with the same
    token return the first one's delivery instead of sending again."""
    message_id = f"msg_test_{press}" if press else None
    claim = f"test:{uuid.uuid4().hex[:8]}"
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "testing webhooks")
        endpoint = _endpoint(session, name)
        if message_id:
            earlier = session.exec(select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint.id,
                                                                 WebhookDelivery.message_id == message_id)).first()
            if earlier is not None:
                return earlier
        raise_event(session, "webhook.test", f"Test message from the Training-Free GRPO studio, sent by {actor}",
                    {"by": actor, "link": wh.link(get_settings().app_url, "notifications")}, only=endpoint.id,
                    message_id=message_id)
        session.flush()
        delivery = session.exec(select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint.id)
                                .order_by(col(WebhookDelivery.id).desc())).first()
        delivery.claimed_by, delivery.claimed_until = claim, utcnow() + timedelta(seconds=_hold_s())
        session.add(delivery)
    row = _record(engine, delivery.id, attempt(endpoint, delivery), claim)
    with session_scope(engine) as session:  # a test is one attempt: its result is what the person asked for
        session.exec(update(WebhookDelivery).where(WebhookDelivery.id == delivery.id,
                                                   WebhookDelivery.status == DeliveryStatus.PENDING)
                     .values(status=DeliveryStatus.FAILED, claimed_by=None, claimed_until=None))
    with Session(engine) as session:
        return session.get(WebhookDelivery, delivery.id) or row or delivery


def replay(engine: Engine, delivery_id: int, actor: str) -> WebhookDelivery:
    """Queue a logged delivery again (admin only): a new row with the same webhook-id, after the endpoint's
    other deliveries; the original stays in the log as it was."""
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "replaying webhooks")
        original = session.get(WebhookDelivery, delivery_id)
        if original is None:
            raise NotFound(f"no webhook delivery {delivery_id}")
        if original.status == DeliveryStatus.PENDING:
            raise Conflict(f"delivery {delivery_id} is still pending: the worker attempts it again by itself")
        row = WebhookDelivery(endpoint_id=original.endpoint_id, message_id=original.message_id,
                              event_type=original.event_type, payload=original.payload, replay_of=original.id)
        original.dismissed_at = original.dismissed_at or utcnow()  # replayed: its notice has done its work
        session.add(original)
        session.add(row)
        session.flush()
        session.add(AuditEvent(actor=actor, action="webhook.replay", object_type="webhookdelivery", object_id=row.id,
                               after={"replay_of": delivery_id}))
        return row


def describe(row: WebhookDelivery) -> str:
    """A delivery's state in words: the log's last column."""
    if row.status == DeliveryStatus.DELIVERED:
        return f"delivered (HTTP {row.last_code}, attempt {row.attempts})"
    if row.status == DeliveryStatus.FAILED:
        return f"failed after {row.attempts} attempt(s): {row.last_error}"
    if row.attempts:
        return (f"retrying ({row.attempts} attempt(s) so far: {row.last_error}); next at "
                f"{as_utc(row.next_attempt_at):%H:%M:%S} UTC")
    return "waiting for a worker"


# ---- what a person is told: given-up deliveries, the secrets' key --------------------------------------------------

def given_up(session: Session) -> list[WebhookDelivery]:
    """Failed deliveries of events (not tests) that nobody replayed or dismissed, newest first: the notice the
    Notifications page and the Overview raise, since a receiver then missed something."""
    return list(session.exec(select(WebhookDelivery).where(
        WebhookDelivery.status == DeliveryStatus.FAILED, WebhookDelivery.event_type != "webhook.test",
        col(WebhookDelivery.dismissed_at).is_(None)).order_by(col(WebhookDelivery.id).desc())))


def given_up_notice(session: Session) -> str | None:
    """The notice's sentence, or None when no delivery was given up."""
    rows = given_up(session)
    if not rows:
        return None
    names = endpoint_names(session)
    newest = rows[0]
    return (f"{len(rows)} webhook deliver{'y was' if len(rows) == 1 else 'ies were'} given up: the newest, "
            f"{newest.event_type} to {names.get(newest.endpoint_id, '?')}, {describe(newest)}. Replay it from the "
            "Notifications page's delivery log, or dismiss the notice there.")


def dismiss_given_up(engine: Engine, actor: str) -> int:
    """Dismiss the notice of every given-up delivery (admin only; the log keeps them). Returns how many."""
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "dismissing webhook notices")
        ids = [row.id for row in given_up(session)]
        if ids:
            session.exec(update(WebhookDelivery).where(col(WebhookDelivery.id).in_(ids)).values(dismissed_at=utcnow()))
            session.add(AuditEvent(actor=actor, action="webhook.dismiss", object_type="webhookdelivery",
                                   object_id=ids[0], after={"deliveries": ids}))
        return len(ids)


def sealing_key(session: Session) -> str:
    """The key new secrets are sealed with. A key file is made only for a database that has no sealed secret yet:
    with sealed secrets and no key (the key file lost, TFGRPO_SECRET_KEY unset), a new key would seal secrets that
    the old ones' key, once restored, cannot open beside them, so it is refused, naming the key that is missing."""
    key = secret_key()
    if key is not None:
        return key
    if any(is_sealed(row.secret) for row in session.exec(select(WebhookEndpoint)) if row.secret):
        raise InvalidInput(f"stored webhook secrets are sealed with a key that is missing: restore the key file "
                           f"{key_file()} or set {KEY_ENV}; nothing was changed")
    return secret_key(create=True)


def seal_stored_secrets(engine: Engine) -> int:
    """Encrypt every webhook secret stored before secrets were (`python -m core migrate` calls it). Returns how
    many were sealed now."""
    with session_scope(engine) as session:
        rows = [row for row in session.exec(select(WebhookEndpoint)) if row.secret and not is_sealed(row.secret)]
        for row in rows:
            row.secret = seal(row.secret, sealing_key(session))
            session.add(row)
        return len(rows)


def rotate_secrets(engine: Engine, actor: str) -> str:
    """Seal every stored secret again under a new key (admin only). With the key file: a new key is written first,
    before the old one (both open), every secret is sealed again under it in one transaction, then the old key is
    dropped. With TFGRPO_SECRET_KEY: its first key is the new one (set it to `new,old` first); every secret is sealed
    again under it, and the old one may then be removed from the variable. Returns what was done, in words."""
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "rotating the secret key")
        current = secret_key()
        rows = [row for row in session.exec(select(WebhookEndpoint)) if row.secret]
        if current is None and any(is_sealed(row.secret) for row in rows):
            raise InvalidInput(f"stored webhook secrets are sealed with a key that is missing: restore the key file "
                               f"{key_file()} or set {KEY_ENV}; nothing was changed")
        from_environment = key_from_environment()
        if from_environment:
            key = current
        else:
            key = ",".join([new_key(), *key_list(current)])
            write_key_file(key_list(key), replace=True)
        for row in rows:
            row.secret = reseal(row.secret, key)
            session.add(row)
        session.add(AuditEvent(actor=actor, action="secrets.rotate", object_type="webhookendpoint", object_id=None,
                               after={"resealed": len(rows), "key": KEY_ENV if from_environment else "key file"}))
    if from_environment:
        kept = key_list(key)
        return (f"sealed {len(rows)} secret(s) again under the first key of {KEY_ENV}"
                + (f"; the other {len(kept) - 1} key(s) there open nothing now: remove them" if len(kept) > 1 else
                   " (set it to `new,old` before rotating to move to a new key)"))
    write_key_file(key_list(key)[:1], replace=True)
    return f"sealed {len(rows)} secret(s) again under a new key; the key file {key_file()} holds only the new key"


def secrets_problem(engine: Engine) -> str | None:
    """What stands between the stored webhook secrets and signing (said when a worker, `migrate` or the
    Notifications page starts): secrets still in plain text, or sealed ones with no key to open them."""
    with Session(engine) as session:
        stored = [row.secret for row in session.exec(select(WebhookEndpoint)) if row.secret]
    plain_count = sum(not is_sealed(value) for value in stored)
    if plain_count:
        return (f"{plain_count} webhook signing secret(s) are stored in plain text: run `python -m core migrate` to "
                "encrypt them")
    failed, reason = 0, ""
    for value in stored:
        try:
            unseal(value, secret_key())
        except InvalidInput as exc:
            failed, reason = failed + 1, str(exc)
    if failed:
        return f"{failed} of {len(stored)} webhook signing secret(s) cannot be opened, so they cannot sign: {reason}"
    return None

"""Webhooks: tell a team's tools when a person is needed, signed by the Standard Webhooks scheme.

An event is written to the outbox (WebhookDelivery, one row per endpoint that hears it) in the transaction of
the change that raised it, by a one-line `notify_*` call there; nothing is sent from that job. A worker's
delivery pass (core/jobs/worker.py) sends the rows later, one endpoint at a time and in order, with retries
and exponential backoff, so a slow or dead receiver never holds a run; after the last attempt a delivery is
failed and stays in the log, from where a person replays it. A redirect is not followed and a receiver's
address on this machine (loopback, link-local) is refused unless TFGRPO_WEBHOOK_ALLOW_LOCAL allows it.

What each event says is core/records/webhook_events.py. The signing secret has to be stored to sign (unlike a
provider's API key, which stays in the environment): it is shown once when an endpoint is made and never again,
not on a page, in a list, an audit event or a log; an endpoint can instead name an environment variable that
holds it (`secret_env`).
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import socket
import urllib.parse
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from sqlalchemy import or_, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select
from standardwebhooks import Webhook

from core.domain import webhooks as wh
from core.errors import Conflict, InvalidInput, NotFound
from core.records.people import require_role
from core.records.webhook_events import notify_stalled_jobs, raise_event
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
    """The URL, checked: http(s) with a host that resolves, to no loopback or link-local address unless the
    administrator allows local receivers (TFGRPO_WEBHOOK_ALLOW_LOCAL); InvalidInput saying why otherwise."""
    url = (url or "").strip()
    problem = wh.url_problem(url)
    if problem:
        raise InvalidInput(problem)
    reason = local_address(url)
    if reason:
        raise InvalidInput(reason)
    return url


def local_address(url: str) -> str | None:
    """Why the URL's host may not receive (it resolves to an address on this machine, or not at all), or None."""
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (socket.gaierror, UnicodeError) as exc:
        return f"the webhook host {host} does not resolve ({exc})"
    if get_settings().webhook_allow_local:
        return None
    for address in sorted(addresses):
        reason = wh.local_reason(address)
        if reason:
            return (f"the webhook host {host} resolves to {reason}: refused (an administrator allows receivers on "
                    "this machine with TFGRPO_WEBHOOK_ALLOW_LOCAL=1)")
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
    made = None if secret_env else new_secret()
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "configuring webhooks")
        if session.exec(select(WebhookEndpoint).where(WebhookEndpoint.name == name)).first():
            raise Conflict(f"a webhook named {name} exists; remove it first or choose another name")
        row = WebhookEndpoint(name=name, url=url, events=events, secret=made, secret_env=secret_env, created_by=actor)
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
    """What one attempt found: delivered, or the code/error and whether another attempt may help."""

    delivered: bool
    code: int | None
    error: str | None
    retry: bool


def _secret_of(endpoint: WebhookEndpoint) -> str:
    value = secret(endpoint.secret_env) if endpoint.secret_env else endpoint.secret
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


def attempt(endpoint: WebhookEndpoint, delivery: WebhookDelivery) -> Attempt:
    """Send one delivery once: a 2xx answer delivers; a redirect is not followed and not retried (configure its
    target); no answer within TFGRPO_WEBHOOK_TIMEOUT_S, a refused connection or another code may be retried."""
    settings = get_settings()
    reason = local_address(endpoint.url)  # again at sending time: a name may resolve elsewhere since it was added
    if reason:
        return Attempt(False, None, reason, retry=False)
    try:
        content, headers = signed_request(endpoint, delivery, utcnow())
    except InvalidInput as exc:
        return Attempt(False, None, str(exc), retry=True)
    try:
        with httpx.Client(timeout=settings.webhook_timeout_s, follow_redirects=False) as client:
            response = client.post(endpoint.url, content=content, headers=headers)
    except httpx.TimeoutException:
        return Attempt(False, None, f"no answer within {settings.webhook_timeout_s:g} s (timeout)", retry=True)
    except httpx.HTTPError as exc:
        text = str(exc).replace(endpoint.url, wh.shown_url(endpoint.url)) or type(exc).__name__
        return Attempt(False, None, f"cannot reach the receiver: {text}", retry=True)
    code = response.status_code
    if 200 <= code < 300:
        return Attempt(True, code, None, retry=False)
    if response.is_redirect:
        location = response.headers.get("location")
        target = wh.shown_url(urllib.parse.urljoin(endpoint.url, location)) if location else "nowhere"
        return Attempt(False, code, f"redirected to {target}: not followed (configure the final URL)", retry=False)
    return Attempt(False, code, f"the receiver answered HTTP {code}", retry=True)


def _record(engine: Engine, delivery_id: int, result: Attempt) -> WebhookDelivery:
    settings = get_settings()
    with holding(None), session_scope(engine) as session:
        row = session.get(WebhookDelivery, delivery_id)
        if row is None:  # its webhook was removed while the attempt was under way: nothing to log
            return WebhookDelivery(id=delivery_id, endpoint_id=0, message_id="", event_type="", status=DeliveryStatus.FAILED)
        row.attempts += 1
        row.last_code, row.last_error = result.code, result.error
        if result.delivered:
            row.status, row.delivered_at = DeliveryStatus.DELIVERED, utcnow()
        elif not result.retry or row.attempts >= settings.webhook_max_attempts:
            row.status = DeliveryStatus.FAILED
            if result.retry:
                row.last_error = f"{result.error}; gave up after {row.attempts} attempts"
        else:
            row.next_attempt_at = utcnow() + timedelta(seconds=wh.backoff_s(row.attempts, settings.webhook_backoff_s))
        session.add(row)
        if not result.delivered:
            log.warning("webhook delivery %s (%s) attempt %d: %s", row.id, row.event_type, row.attempts, row.last_error)
        return row


def _claim_endpoint(engine: Engine, endpoint_id: int, owner: str) -> bool:
    """Hold an endpoint for one worker's pass, so deliveries of one endpoint go one at a time and in order."""
    now = utcnow()
    until = now + timedelta(seconds=get_settings().webhook_timeout_s * 4 + 30)
    with holding(None), session_scope(engine) as session:
        free = or_(col(WebhookEndpoint.busy_until).is_(None), WebhookEndpoint.busy_until < now,
                   WebhookEndpoint.busy_by == owner)
        return session.exec(update(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id, free)
                            .values(busy_by=owner, busy_until=until)).rowcount == 1


def _free_endpoint(engine: Engine, endpoint_id: int, owner: str) -> None:
    with holding(None), session_scope(engine) as session:
        session.exec(update(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id, WebhookEndpoint.busy_by == owner)
                     .values(busy_by=None, busy_until=None))


def deliver_due(engine: Engine, owner: str = "deliverer", *, limit: int = 50) -> int:
    """One delivery pass: per active endpoint, its pending deliveries oldest first while each is delivered; the
    first that is not (or not due yet) holds the later ones back, so a receiver gets them in order. Also raises
    `run.stalled` for jobs that stopped beating. Returns the attempts made."""
    notify_stalled_jobs(engine)
    with Session(engine) as session:
        ids = list(session.exec(select(WebhookEndpoint.id).where(WebhookEndpoint.active == True)))  # noqa: E712
    made = 0
    for endpoint_id in ids:
        if not _claim_endpoint(engine, endpoint_id, owner):
            continue
        try:
            for _ in range(limit):
                with Session(engine) as session:
                    endpoint = session.get(WebhookEndpoint, endpoint_id)
                    delivery = session.exec(select(WebhookDelivery).where(
                        WebhookDelivery.endpoint_id == endpoint_id, WebhookDelivery.status == DeliveryStatus.PENDING)
                        .order_by(WebhookDelivery.id)).first()
                if endpoint is None or delivery is None or as_utc(delivery.next_attempt_at) > utcnow():
                    break
                made += 1
                if _record(engine, delivery.id, attempt(endpoint, delivery)).status == DeliveryStatus.PENDING:
                    break
                _claim_endpoint(engine, endpoint_id, owner)  # extend the hold for the next one
        finally:
            _free_endpoint(engine, endpoint_id, owner)
    return made


# ---- the log, the test and the replay ----------------------------------------------------------------------------

def deliveries(session: Session, name: str | None = None, limit: int = 50) -> list[WebhookDelivery]:
    """The newest deliveries (of one endpoint), newest first: the delivery log."""
    query = select(WebhookDelivery).order_by(col(WebhookDelivery.id).desc()).limit(limit)
    if name:
        query = query.where(WebhookDelivery.endpoint_id == _endpoint(session, name).id)
    return list(session.exec(query))


def endpoint_names(session: Session) -> dict[int, str]:
    return {row.id: row.name for row in session.exec(select(WebhookEndpoint))}


def send_test(engine: Engine, name: str, actor: str) -> WebhookDelivery:
    """Send a signed `webhook.test` to one endpoint now (admin only) and log it; it does not wait for the
    endpoint's queue, so it says at once whether the receiver answers and verifies."""
    with session_scope(engine) as session:
        require_role(session, actor, "admin", "testing webhooks")
        endpoint = _endpoint(session, name)
        raise_event(session, "webhook.test", f"Test message from the Training-Free GRPO studio, sent by {actor}",
                    {"by": actor, "link": wh.link(get_settings().app_url, "notifications")}, only=endpoint.id)
        session.flush()
        delivery = session.exec(select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint.id)
                                .order_by(col(WebhookDelivery.id).desc())).first()
    result = attempt(endpoint, delivery)
    row = _record(engine, delivery.id, result)
    if row.status == DeliveryStatus.PENDING:  # a test is one attempt: its result is what the person asked for
        with session_scope(engine) as session:
            session.exec(update(WebhookDelivery).where(WebhookDelivery.id == row.id)
                         .values(status=DeliveryStatus.FAILED))
        row.status = DeliveryStatus.FAILED
    return row


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


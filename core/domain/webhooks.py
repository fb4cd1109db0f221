"""What a webhook says, without sending it: the events a person can be told of, the body every receiver gets
(Standard Webhooks' `type`/`timestamp`/`data`, plus a `text` line a chat tool's incoming webhook shows), the
link that opens the exact page, the wait before a retry, and which addresses a receiver may not have.

Pure functions; core/records/webhooks.py writes, signs and sends.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from datetime import datetime

# Every event, with the line the page and `core webhook add --help` show for it.
EVENTS: dict[str, str] = {
    "step.awaiting_review": "a training step's operations wait for a reviewer (with the gate's line)",
    "labels.waiting": "a run or an evaluation waits for labels (how many, for which task)",
    "dispute.opened": "labellers disagree on a rollout and a reviewer must decide",
    "evaluation.ended": "an evaluation ended: its figures, or why it is incomplete or failed",
    "run.failed": "a run failed (with the reason)",
    "run.stalled": "a running job stopped beating (its worker died or hangs)",
    "production.moved": "the production label moved: from which version to which, by whom, why",
    "webhook.test": "a test message (the Test button, `core webhook test`); always sent",
}


def event_names(given: list[str] | None) -> list[str]:
    """The events an endpoint hears, checked: unknown names are refused with the list of known ones; none: all."""
    names = [name.strip() for name in given or [] if name.strip()]
    unknown = [name for name in names if name not in EVENTS]
    if unknown:
        raise ValueError(f"unknown event {', '.join(unknown)}: use {', '.join(EVENTS)}")
    return sorted(set(names))


def hears(events: list[str], event_type: str) -> bool:
    """Whether an endpoint subscribed to `events` (empty: all) gets `event_type`; a test always goes."""
    return event_type == "webhook.test" or not events or event_type in events


def body(event_type: str, text: str, data: dict, moment: datetime) -> dict:
    """The JSON a receiver gets: Standard Webhooks' envelope, and `text` (Slack, Mattermost, Rocket.Chat and
    Discord-through-Slack-format read it) so a chat channel shows a sentence with the link."""
    link = data.get("link")
    return {"type": event_type, "timestamp": moment.isoformat().replace("+00:00", "Z"),
            "text": f"{text}\n{link}" if link else text, "data": data}


def link(base_url: str, page: str, **params: object) -> str:
    """The studio's address of `page` with its query parameters (task, library, run, step, evaluation): the pages
    read them from the address, so the link opens that exact view."""
    query = urllib.parse.urlencode({key: value for key, value in params.items() if value is not None})
    return f"{base_url.rstrip('/')}/{page}" + (f"?{query}" if query else "")


def backoff_s(attempts: int, first_s: float) -> float:
    """The wait after the `attempts`-th failed attempt: first_s, then doubling (capped at an hour)."""
    return min(first_s * 2 ** max(attempts - 1, 0), 3600.0)


def local_reason(address: str) -> str | None:
    """Why an IP address is not a receiver's without the administrator's leave (loopback, link-local, unspecified,
    multicast: the studio's own machine or its cloud metadata service), or None when it may be one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if getattr(ip, "ipv4_mapped", None):
        ip = ip.ipv4_mapped
    for kind, test in (("loopback", ip.is_loopback), ("link-local", ip.is_link_local),
                       ("unspecified", ip.is_unspecified), ("multicast", ip.is_multicast)):
        if test:
            return f"a {kind} address ({address})"
    return None


def url_problem(url: str) -> str | None:
    """What is wrong with a receiver's URL as written (not http(s), no host, credentials in it), or None."""
    parsed = urllib.parse.urlsplit(url.strip())
    if parsed.scheme not in ("http", "https"):
        return f"a webhook URL starts with http:// or https:// (got {parsed.scheme or 'no scheme'}:)"
    if not parsed.hostname:
        return "a webhook URL names a host"
    if parsed.username or parsed.password:
        return "a webhook URL carries no user name or password (put a token in its path or query)"
    return None


def shown_url(url: str) -> str:
    """A receiver's URL as pages and lists show it: scheme, host and port only. A chat tool's incoming-webhook URL
    is itself a credential (its path is the token), so the rest never leaves the database."""
    parsed = urllib.parse.urlsplit(url)
    rest = "/…" if parsed.path not in ("", "/") or parsed.query else "/"
    return f"{parsed.scheme}://{parsed.netloc.rpartition('@')[2]}{rest}"

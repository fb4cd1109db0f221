"""What a webhook says, without sending it: the events a person can be told of, the body every receiver gets
(Standard Webhooks' `type`/`timestamp`/`data`, plus a `text` line a chat tool's incoming webhook shows), the
link that opens the exact page, the wait before a retry (Standard Webhooks' schedule), and which addresses a
receiver may not have (every one but public unicast, unless an administrator's allowlist admits it).

Pure functions; core/records/notifications/webhooks.py writes, signs and sends.
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
    "ab.stopped": "an A/B candidate was significantly worse: the guard ended the split (with the figure)",
    "ab.decided": "an A/B candidate is significantly better (with the figure and a link to Promote)",
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


def retry_wait_s(attempts: int, schedule: list[float]) -> float:
    """The wait after the `attempts`-th failed attempt: the schedule's entry (Standard Webhooks': 5 s, 5 min, 30 min,
    2 h, 5 h, 10 h, 10 h, so a receiver down for a day still gets every event), its last one past its end."""
    return float(schedule[min(max(attempts, 1), len(schedule)) - 1])


# Cloud metadata services (AWS, GCP, Azure, Alibaba, Oracle; AWS's IPv6 one): never a receiver, whatever an
# administrator allows, since they hand out the machine's credentials.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "169.254.169.253", "100.100.100.200", "168.63.129.16", "192.0.0.192",
    "fd00:ec2::254", "fd00:ec2::23"))
_RFC1918 = tuple(ipaddress.ip_network(net) for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (IPv4-mapped, IPv4-compatible, 6to4, NAT64), which is where a
    connection to it ends up."""
    if ip.ipv4_mapped:
        return ip.ipv4_mapped
    if ip.sixtofour:
        return ip.sixtofour
    if ip in _NAT64 or 1 < int(ip) < 2 ** 32:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def canonical_address(address: str) -> str:
    """The address a connection to `address` really reaches: an IPv6 form's embedded IPv4 (mapped, compatible,
    6to4, NAT64) unwrapped, so every test and the connection itself see the same address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    inner = _embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
    return str(inner) if inner is not None else str(ip)


def refused_reason(address: str) -> str | None:
    """Why an IP address is no receiver's without an administrator's leave (everything but public unicast: this
    machine, a private network, carrier-grade NAT, unique-local IPv6, a metadata service, or one of those
    inside an IPv6 form), or None for a public unicast address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip in METADATA_ADDRESSES:
        return f"a cloud metadata address ({address})"
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None:
            reason = refused_reason(str(inner))
            return f"{reason} inside the IPv6 address {address}" if reason else None
        if ip in _NAT64_LOCAL:
            return f"a local NAT64 address ({address})"
    for kind, test in (("loopback", ip.is_loopback), ("link-local", ip.is_link_local),
                       ("unspecified", ip.is_unspecified), ("multicast", ip.is_multicast),
                       ("carrier-grade NAT", ip in _CGNAT), ("unique-local", ip in _UNIQUE_LOCAL),
                       ("private", any(ip in net for net in _RFC1918 if ip.version == net.version))):
        if test:
            return f"a {kind} address ({address})"
    if not ip.is_global:
        return f"a reserved address, not public ({address})"
    return None


def allowlist(text: str) -> tuple[frozenset[str], tuple]:
    """An administrator's allowlist (comma-separated host names and CIDRs) as host names and networks;
    ValueError naming an entry that is neither."""
    hosts, networks = set(), []
    for entry in (part.strip().lower() for part in (text or "").split(",")):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            if not all(label and label.replace("-", "").replace("_", "").isalnum() for label in entry.split(".")):
                raise ValueError(f"{entry!r} is neither a host name nor a CIDR") from None
            hosts.add(entry.rstrip("."))
    return frozenset(hosts), tuple(networks)


def admitted(host: str, address: str, allowed: tuple[frozenset[str], tuple]) -> bool:
    """Whether the allowlist admits `address` (reached by the name `host`): the host by name or the address
    in a listed network; a metadata address never, in any IPv6 form. The networks are tested against the address as
    written and as the IPv4 it stands for."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    real = ipaddress.ip_address(canonical_address(address))
    if ip in METADATA_ADDRESSES or real in METADATA_ADDRESSES:
        return False
    hosts, networks = allowed
    return host.lower().rstrip(".") in hosts or any(
        candidate.version == net.version and candidate in net for net in networks for candidate in {ip, real})


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

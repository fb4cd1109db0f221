"""OTLP trace requests decoded and read as the studio's traces, by the conventions instrumentations use.

The body is parsed by the maintained `opentelemetry-proto` messages only (protobuf, or OTLP/JSON through
protobuf's json_format once the specification's hex trace and span ids are turned into the bytes fields
json_format expects). Each span is then checked against the limits below and read by the OpenTelemetry GenAI
semantic conventions (v1.36 attributes and span events, and the current `gen_ai.input.messages`,
`gen_ai.output.messages`, `gen_ai.system_instructions`, `gen_ai.conversation.id`) and by OpenInference's keys
(`input.value`, `output.value`, `llm.input_messages.*`, `llm.output_messages.*`) and by openlit's (its
`gen_ai.prompt` and `gen_ai.completion` strings, on the span or in `gen_ai.content.prompt` /
`gen_ai.content.completion` events). A span is refused with a reason naming it (a message value nested too
deep or not the JSON its convention says is refused too, never the request); a span that carries a model call
(model attributes) but no message read here is "unreadable": kept to be shown, never dropped; a span with
neither (an HTTP client's span, a tool call) is "other": not an error, and not a trace. Nothing here touches
the database.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from core.domain.otlp_depth import cut_deep_json, cut_deep_protobuf
from core.errors import MalformedBody, UnsupportedMedia

MAX_TEXT = 100_000  # the longest string value read (core.records.production.traces.MAX_TEXT: a trace's input or output)
MAX_ATTRIBUTES = 256  # per span or resource, after an array's or kvlist's items are counted
MAX_DEPTH = 8  # arrays and kvlists inside one another
MAX_EVENTS = 128
MAX_MESSAGE_DEPTH = 16  # JSON inside a message attribute's string: deeper is refused (5,000 levels once raised
# RecursionError and failed the whole request)
# attributes that say a span is a model call even when its messages cannot be read (so it is held, not dropped)
MODEL_KEYS = ("gen_ai.request.model", "gen_ai.response.model", "gen_ai.operation.name", "gen_ai.system",
              "gen_ai.provider.name", "llm.model_name", "llm.provider", "llm.system")
FUTURE_SLACK_S = 600  # a clock a little ahead is tolerated; a span ending later than this is refused
PROTOBUF, JSON = "application/x-protobuf", "application/json"

# The attributes the studio reads besides the conventions (docs/traces-otlp.md names them); on the span, else
# on its resource.
TASK, LIBRARY, VERSION_ID, VERSION, LABEL = "tfgrpo.task", "tfgrpo.library", "tfgrpo.version_id", "tfgrpo.version", \
    "tfgrpo.label"
SCORE, THUMBS, COMMENT, SEGMENT, USER = "tfgrpo.score", "tfgrpo.thumbs", "tfgrpo.comment", "tfgrpo.segment", \
    "tfgrpo.user_id"
ID_FIELDS = {"traceId": 16, "trace_id": 16, "spanId": 8, "span_id": 8, "parentSpanId": 8, "parent_span_id": 8}


@dataclass
class SpanTrace:
    """One GenAI span read as a trace: what the studio stores of it, and where it came from."""

    position: int  # the span's place in the request, from 1
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    name: str
    scope: str
    scope_version: str
    service: str | None
    start: datetime
    end: datetime
    input: str
    output: str | None
    system: str | None
    turns: list[dict] | None
    attributes: dict
    resource: dict
    model: str | None = None
    provider: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    conversation_id: str | None = None
    task: str | None = None
    library: str | None = None
    version_id: int | None = None
    version: str | None = None  # tfgrpo.version as sent ("12" or "#12"), read by the one version lookup
    label: str | None = None
    score: float | None = None
    thumbs: str | None = None
    comment: str | None = None
    segment: str | None = None
    user_id: str | None = None
    unreadable: str | None = None  # why no message was read from this model call's span (then input is "")

    @property
    def client_id(self) -> str:
        """The stored trace's sender id: `<trace id>:<span id>`, so a retried export stores nothing twice and
        feedback by OTel trace id finds every span of that trace."""
        return f"{self.trace_id}:{self.span_id}"

    @property
    def latency_ms(self) -> float:
        return round((self.end - self.start).total_seconds() * 1000, 3)

    def held(self) -> dict:
        """The span as JSON values, without its resource (stored once, apart), to be read back by `from_held`."""
        values = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "resource"}
        values["start"], values["end"] = self.start.isoformat(), self.end.isoformat()
        return values

    @classmethod
    def from_held(cls, values: dict, resource: dict | None = None) -> SpanTrace:
        known = {name: value for name, value in values.items() if name in cls.__dataclass_fields__}
        known["start"], known["end"] = datetime.fromisoformat(known["start"]), datetime.fromisoformat(known["end"])
        return cls(**{**known, "resource": resource or {}})


@dataclass
class Decoded:
    """A request's spans: those read as traces, those refused ({position, span_id, reason}) and the count of
    spans that hold no model call."""

    traces: list[SpanTrace] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)
    other: int = 0
    unreadable: list[SpanTrace] = field(default_factory=list)  # model calls with no message read: held, shown

    @property
    def total(self) -> int:
        return len(self.traces) + len(self.refused) + self.other + len(self.unreadable)


class SpanRefused(ValueError):
    """One span that cannot be taken; the message says why."""


def media_type(content_type: str | None) -> str:
    """The body's kind from its Content-Type, or UnsupportedMedia (415) naming the two OTLP/HTTP accepts."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind not in (PROTOBUF, JSON):
        raise UnsupportedMedia(f"Content-Type {kind or '(none)'!r} is not read here; send {PROTOBUF} or {JSON} "
                               "(OTLP/HTTP)")
    return kind


def parse_request(body: bytes, kind: str) -> ExportTraceServiceRequest:
    """The body as an ExportTraceServiceRequest, or MalformedBody (400) saying what is wrong with it."""
    request = ExportTraceServiceRequest()
    if kind == PROTOBUF:
        try:
            request.ParseFromString(body)
        except (DecodeError, RecursionError, ValueError) as exc:
            try:  # too deep for the decoder? cut the deep values, so that only their spans are refused
                request.ParseFromString(cut_deep_protobuf(body))
            except (DecodeError, RecursionError, ValueError):
                raise MalformedBody(f"the body is not an OTLP ExportTraceServiceRequest in protobuf ({exc})") from None
        return request
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedBody("the body is not UTF-8 text; OTLP/JSON is UTF-8") from None
    payload = _json_request(text)
    if payload is None:  # too deep for the parser: cut the deep values, so that only their spans are refused
        payload = _json_request(cut_deep_json(body).decode("utf-8"))
        if payload is None:
            raise MalformedBody("the JSON is nested too deep to read")
    try:
        json_format.ParseDict(payload, request, ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError, TypeError, AttributeError) as exc:
        raise MalformedBody(f"the body is not an OTLP/JSON ExportTraceServiceRequest ({_first_line(exc)})") from None
    return request


def _json_request(text: str) -> dict | None:
    """The OTLP/JSON body as a dict with its ids as json_format reads them; None when it nests too deep for that;
    MalformedBody when it is not a JSON object."""
    try:
        payload = json.loads(text)
    except RecursionError:
        return None
    except ValueError:
        raise MalformedBody("the body is not JSON (OTLP/JSON: an ExportTraceServiceRequest object)") from None
    if not isinstance(payload, dict):
        raise MalformedBody("the body is not an OTLP/JSON ExportTraceServiceRequest object")
    try:
        _hex_ids_to_base64(payload, 0)
    except RecursionError:
        return None
    except MalformedBody as exc:
        if "nested" in str(exc):
            return None
        raise
    return payload


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__


def _hex_ids_to_base64(node: object, depth: int) -> None:
    """OTLP/JSON writes trace and span ids as hex (the specification's one exception to protobuf's JSON
    mapping, which writes bytes as base64): turn them into what json_format reads, in place."""
    if depth > 64:
        raise MalformedBody("the JSON is nested more than 64 levels deep")
    if isinstance(node, list):
        for item in node:
            _hex_ids_to_base64(item, depth + 1)
    elif isinstance(node, dict):
        for name, value in node.items():
            if name in ID_FIELDS and isinstance(value, str):
                try:
                    node[name] = base64.b64encode(binascii.unhexlify(value)).decode()
                except (binascii.Error, ValueError):
                    raise MalformedBody(f"{name} {value[:40]!r} is not hex (OTLP/JSON writes ids as hex)") from None
            elif isinstance(value, dict | list):
                _hex_ids_to_base64(value, depth + 1)


def decode_spans(request: ExportTraceServiceRequest, now: datetime | None = None) -> Decoded:
    """Every span of the request checked and read (see the module's note); positions count from 1 across the
    whole request, in its order."""
    now = now or datetime.now(UTC)
    decoded, position = Decoded(), 0
    for resource_spans in request.resource_spans:
        try:
            resource = attributes_of(resource_spans.resource.attributes, "resource")
            resource_error = None
        except SpanRefused as exc:
            resource, resource_error = {}, str(exc)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                position += 1
                try:
                    if resource_error:
                        raise SpanRefused(resource_error)
                    found = read_span(span, scope_spans.scope, resource, now, position)
                except SpanRefused as exc:
                    decoded.refused.append({"position": position, "span_id": span.span_id.hex() or None,
                                            "reason": str(exc)})
                    continue
                if found is None:
                    decoded.other += 1
                elif found.unreadable:
                    decoded.unreadable.append(found)
                else:
                    decoded.traces.append(found)
    return decoded


def read_span(span: object, scope: object, resource: dict, now: datetime, position: int) -> SpanTrace | None:
    """One span as a trace; an unreadable one (`unreadable` says why) when it is a model call with no user
    message read; None when it is no model call; or SpanRefused."""
    if len(span.trace_id) != 16 or not any(span.trace_id):
        raise SpanRefused(f"its trace id is {len(span.trace_id)} bytes{' of zeros' if span.trace_id else ''}; "
                          "OTLP trace ids are 16 bytes, not all zero")
    if len(span.span_id) != 8 or not any(span.span_id):
        raise SpanRefused(f"its span id is {len(span.span_id)} bytes{' of zeros' if span.span_id else ''}; "
                          "OTLP span ids are 8 bytes, not all zero")
    if span.start_time_unix_nano == 0 or span.end_time_unix_nano == 0:
        raise SpanRefused("its start or end time is zero (unset)")
    start, end = _time(span.start_time_unix_nano), _time(span.end_time_unix_nano)
    if end < start:
        raise SpanRefused("it ends before it starts")
    if (end - now).total_seconds() > FUTURE_SLACK_S:
        raise SpanRefused(f"it ends in the future ({end.isoformat()})")
    _check_text("its name", span.name)
    if len(span.events) > MAX_EVENTS:
        raise SpanRefused(f"it has {len(span.events)} events; at most {MAX_EVENTS} are read")
    attributes = attributes_of(span.attributes, "span")
    events = [(event.name, attributes_of(event.attributes, f"event {event.name[:60]!r}")) for event in span.events]
    inputs = input_messages(attributes, events)
    outputs = output_messages(attributes, events)
    users = [text for role, text in inputs if role == "user"]
    user_input = users[-1] if users else _string(attributes.get("input.value"))
    unreadable = None
    if not user_input or not user_input.strip():
        if not any(name in attributes for name in MODEL_KEYS):
            return None
        unreadable = ("a model call with no user message the studio reads (docs/traces-otlp.md lists the "
                      "conventions read)")
        user_input = ""
    reply = "\n".join(text for _role, text in outputs if text) or _string(attributes.get("output.value"))
    system = system_text(attributes, inputs)
    chat = [(role, text) for role, text in inputs if role in ("user", "assistant")]
    turns = None
    if len(chat) > 1:
        turns = [{"role": "user" if role == "user" else "agent", "text": text} for role, text in chat]
        if reply:
            turns.append({"role": "agent", "text": reply})

    def attribute(name: str) -> object:
        return attributes.get(name, resource.get(name))

    trace = SpanTrace(
        position=position, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(), name=span.name,
        scope=scope.name, scope_version=scope.version, service=_string(resource.get("service.name")),
        start=start, end=end, input=user_input, output=reply or None, system=system, turns=turns,
        attributes=attributes, resource=resource,
        model=_string(attributes.get("gen_ai.response.model") or attributes.get("gen_ai.request.model")
                      or attributes.get("llm.model_name")),
        provider=_string(attributes.get("gen_ai.provider.name") or attributes.get("gen_ai.system")
                         or attributes.get("llm.provider") or attributes.get("llm.system")),
        input_tokens=_int(attributes.get("gen_ai.usage.input_tokens", attributes.get(
            "gen_ai.usage.prompt_tokens", attributes.get("llm.token_count.prompt")))),
        output_tokens=_int(attributes.get("gen_ai.usage.output_tokens", attributes.get(
            "gen_ai.usage.completion_tokens", attributes.get("llm.token_count.completion")))),
        conversation_id=_string(attribute("gen_ai.conversation.id") or attribute("session.id")),
        task=_string(attribute(TASK)), library=_string(attribute(LIBRARY)), label=_string(attribute(LABEL)),
        comment=_string(attributes.get(COMMENT)), segment=_string(attribute(SEGMENT)),
        user_id=_string(attribute(USER) or attribute("user.id") or attribute("enduser.id")),
        version=_string(attribute(VERSION)), unreadable=unreadable)
    trace.version_id = _whole(attribute(VERSION_ID), VERSION_ID)
    score = attributes.get(SCORE)
    if score is not None:
        if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
            raise SpanRefused(f"{SCORE} is {score!r}; a score is a number from 0 to 1")
        trace.score = float(score)
    thumbs = attributes.get(THUMBS)
    if thumbs is not None:
        if thumbs not in ("up", "down"):
            raise SpanRefused(f"{THUMBS} is {str(thumbs)[:40]!r}; use up or down")
        trace.thumbs = thumbs
    for name in ("comment", "segment", "user_id", "task", "library", "label", "version"):
        value = getattr(trace, name)
        if value is not None and len(value) > (5000 if name == "comment" else 200):
            raise SpanRefused(f"its {name} is {len(value)} characters long")
    return trace


def _time(nanos: int) -> datetime:
    try:
        return datetime.fromtimestamp(nanos / 1e9, tz=UTC)
    except (OverflowError, OSError, ValueError):
        raise SpanRefused(f"its time {nanos} ns is out of range") from None


MAX_ID = 2**63 - 1  # the largest id a database integer holds; a larger one names nothing


def _whole(value: object, name: str) -> int | None:
    if value is None:
        return None
    try:
        number = int(value) if not isinstance(value, bool | float) else None
    except (TypeError, ValueError):
        number = None
    if isinstance(value, str) and not (value.strip().isascii() and value.strip().isdigit()):
        number = None  # other scripts' digits ("١٢") name no id a person typed
    if number is None or not 1 <= number <= MAX_ID:
        raise SpanRefused(f"{name} is {str(value)[:40]!r}; it is a whole number from 1")
    return number


def _string(value: object) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _check_text(what: str, text: str) -> None:
    if len(text) > MAX_TEXT:
        raise SpanRefused(f"{what} is {len(text)} characters; at most {MAX_TEXT} are read")


def attributes_of(pairs: object, where: str) -> dict:
    """Key-value pairs as a dict of plain values, or SpanRefused when they pass a limit (count, nesting,
    a string's length). A key given twice keeps its last value, as the SDKs do."""
    counter = [0]
    values = {}
    for pair in pairs:
        _check_text(f"a {where} attribute key", pair.key)
        values[pair.key] = _value(pair.value, counter, 1, f"{where} attribute {pair.key[:80]!r}")
    if counter[0] > MAX_ATTRIBUTES:
        raise SpanRefused(f"its {where} attributes hold {counter[0]} values; at most {MAX_ATTRIBUTES} are read")
    return values


def _value(value: AnyValue, counter: list[int], depth: int, what: str) -> object:
    counter[0] += 1
    if counter[0] > MAX_ATTRIBUTES:
        raise SpanRefused(f"{what}: its attributes hold more than {MAX_ATTRIBUTES} values; at most {MAX_ATTRIBUTES} are read")
    if depth > MAX_DEPTH:
        raise SpanRefused(f"{what} is nested more than {MAX_DEPTH} levels deep")
    kind = value.WhichOneof("value")
    if kind == "string_value":
        _check_text(what, value.string_value)
        return value.string_value
    if kind == "bytes_value":
        _check_text(what, value.bytes_value)
        return value.bytes_value.hex()
    if kind == "array_value":
        return [_value(item, counter, depth + 1, what) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {pair.key: _value(pair.value, counter, depth + 1, what) for pair in value.kvlist_value.values}
    return None if kind is None else getattr(value, kind)


# --- the conventions: messages, system instructions ----------------------------------------------------


def _loads(text: str, what: str) -> object:
    """JSON inside an attribute's string, refused (SpanRefused naming `what`) past MAX_MESSAGE_DEPTH levels;
    ValueError when it is no JSON at all."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise SpanRefused(f"{what} is nested more than {MAX_MESSAGE_DEPTH} levels deep") from None
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_MESSAGE_DEPTH:
            raise SpanRefused(f"{what} is nested more than {MAX_MESSAGE_DEPTH} levels deep")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return value


def _parts_text(content: object, what: str = "a message", depth: int = 0) -> str:
    """A message's text from its content or parts, as the conventions write them (a string, a list of
    {type: text, content|text}, or a JSON string of either)."""
    if depth > MAX_MESSAGE_DEPTH:
        raise SpanRefused(f"{what} is nested more than {MAX_MESSAGE_DEPTH} levels deep")
    if isinstance(content, str):
        stripped = content.strip()
        if stripped[:1] in "[{" and stripped:
            try:
                return _parts_text(_loads(stripped, what), what, depth + 1)
            except ValueError:
                return content
        return content
    if isinstance(content, dict):
        for name in ("content", "text", "parts", "message"):
            if name in content:
                return _parts_text(content[name], what, depth + 1)
        return ""
    if isinstance(content, list):
        return "\n".join(text for text in (_parts_text(part, what, depth + 1) for part in content
                                           if not isinstance(part, dict) or part.get("type", "text") == "text")
                         if text)
    return ""


def _json_messages(value: object, what: str) -> list[tuple[str, str]]:
    """gen_ai.input.messages / gen_ai.output.messages: [{role, parts: [{type: text, content}]}] as JSON;
    SpanRefused when the value is not that list (a malformed value is the sender's error, said, not skipped)."""
    if isinstance(value, str):
        try:
            value = _loads(value, what)
        except ValueError:
            raise SpanRefused(f"{what} is not JSON (the convention writes a JSON list of messages)") from None
    if not isinstance(value, list):
        raise SpanRefused(f"{what} is {type(value).__name__}, not a list of messages")
    found = []
    for message in value:
        if isinstance(message, dict):
            found.append((str(message.get("role") or "assistant"),
                          _parts_text(message.get("parts", message.get("content", "")), what)))
    return found


OPENLIT_ROLE = re.compile(r"^(system|developer|user|assistant|tool|function):[ \t]?", re.MULTILINE)


def _openlit_messages(text: object, default_role: str) -> list[tuple[str, str]]:
    """openlit's `gen_ai.prompt` / `gen_ai.completion`: one string, each message a line `role: content` (a
    message's text may run over several lines); a string with no role prefix is one message of `default_role`."""
    if not isinstance(text, str) or not text.strip():
        return []
    starts = list(OPENLIT_ROLE.finditer(text))
    if not starts or starts[0].start() != 0:
        return [(default_role, text.strip())]
    found = []
    for index, match in enumerate(starts):
        stop = starts[index + 1].start() if index + 1 < len(starts) else len(text)
        found.append((match.group(1), text[match.end():stop].strip()))
    return found


def _indexed(attributes: dict, prefix: str, role_key: str, content_key: str) -> list[tuple[str, str]]:
    """Flattened messages: `<prefix>.<i>.<role_key>` and `<prefix>.<i>.<content_key>`, by i."""
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.")
    indexes = sorted({int(match.group(1)) for key in attributes if (match := pattern.match(key))})
    found = []
    for index in indexes:
        role = attributes.get(f"{prefix}.{index}.{role_key}")
        content = attributes.get(f"{prefix}.{index}.{content_key}")
        if content is not None:
            found.append((str(role or "assistant"), _parts_text(content, f"attribute {prefix}.{index}")))
    return found


EVENT_ROLES = {"gen_ai.system.message": "system", "gen_ai.user.message": "user",
               "gen_ai.assistant.message": "assistant", "gen_ai.tool.message": "tool"}


def input_messages(attributes: dict, events: list[tuple[str, dict]]) -> list[tuple[str, str]]:
    """The prompt as (role, text): current conventions first, then OpenInference, then v1.36's span events,
    then the older indexed gen_ai.prompt attributes, then openlit's gen_ai.prompt string (attribute or event)."""
    if "gen_ai.input.messages" in attributes:
        return _json_messages(attributes["gen_ai.input.messages"], "attribute gen_ai.input.messages")
    found = _indexed(attributes, "llm.input_messages", "message.role", "message.content")
    if found:
        return found
    found = [(EVENT_ROLES[name], _parts_text(values.get("content", ""), f"event {name}")) for name, values in events
             if name in EVENT_ROLES]
    if found:
        return found
    found = _indexed(attributes, "gen_ai.prompt", "role", "content")
    if found:
        return found
    return _openlit_messages(_openlit_text(attributes, events, "prompt"), "user")


def output_messages(attributes: dict, events: list[tuple[str, dict]]) -> list[tuple[str, str]]:
    """The completion as (role, text), by the same conventions in the same order."""
    if "gen_ai.output.messages" in attributes:
        return _json_messages(attributes["gen_ai.output.messages"], "attribute gen_ai.output.messages")
    found = _indexed(attributes, "llm.output_messages", "message.role", "message.content")
    if found:
        return found
    found = [("assistant", _parts_text(values.get("message", values.get("content", "")), "event gen_ai.choice"))
             for name, values in events if name == "gen_ai.choice"]
    if found:
        return found
    found = _indexed(attributes, "gen_ai.completion", "role", "content")
    if found:
        return found
    return _openlit_messages(_openlit_text(attributes, events, "completion"), "assistant")


def _openlit_text(attributes: dict, events: list[tuple[str, dict]], part: str) -> object:
    """openlit's gen_ai.prompt / gen_ai.completion string: an attribute, or its gen_ai.content.<part> event's."""
    key = f"gen_ai.{part}"
    return attributes.get(key) or next((values.get(key) for name, values in events if name == f"gen_ai.content.{part}"),
                                       None)


def system_text(attributes: dict, inputs: list[tuple[str, str]]) -> str | None:
    """The system instructions: gen_ai.system_instructions, else the prompt's system messages."""
    if "gen_ai.system_instructions" in attributes:
        return _parts_text(attributes["gen_ai.system_instructions"], "attribute gen_ai.system_instructions") or None
    texts = [text for role, text in inputs if role in ("system", "developer") and text]
    return "\n\n".join(texts) or None

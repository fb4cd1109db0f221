"""An OTLP request whose attribute values nest too deep for the decoders, cut so that only its spans are refused.

A span's attribute nested past core.domain.otlp_spans.MAX_DEPTH levels refuses that span. But the decoders have
their own limits, met before any span is read: Python's JSON parser and the protobuf decoder (upb's 64 levels) fail
the whole request, and exporters do not retry a 400, so the good spans beside the deep one were lost (issue 61: an
attribute 14 levels deep in OTLP/JSON, 60 in protobuf, stored 0 of 10). Here, when the plain decode fails, the body
is read once more with every value nested past CUT_AT attribute levels replaced by a marker string: the structure
above the cut is still deeper than MAX_DEPTH, so the span checks refuse exactly the spans that were too deep, with
their reason, and the rest are stored.

Both passes walk the body without recursion (a 5,000-deep body must not exhaust Python's stack): the JSON one over
its strings and brackets, the protobuf one over the wire format with the OTLP schema's message fields.
"""

from __future__ import annotations

import re

CUT_AT = 12  # attribute levels (AnyValue inside AnyValue) kept; more than MAX_DEPTH (8), so the span is refused
JSON_CUT_AT = 4 * CUT_AT + 8  # JSON levels: about four per attribute level, plus the request's own eight
MARKER = "(nested too deep: cut by the studio)"

_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def cut_deep_json(body: bytes, cut_at: int = JSON_CUT_AT) -> bytes:
    """The JSON text with every array or object that opens deeper than `cut_at` replaced by the marker string
    (strings are skipped whole, so a bracket inside one is not counted)."""
    out, depth, skip_from, start = [], 0, None, 0
    for match in _TOKENS.finditer(body):
        token = match.group(0)
        if token[:1] == b'"':
            continue
        if token in (b"[", b"{"):
            depth += 1
            if depth == cut_at + 1 and skip_from is None:
                out.append(body[start:match.start()])
                skip_from = match.start()
        else:
            if depth == cut_at + 1 and skip_from is not None:
                out.append(b'"' + MARKER.encode() + b'"')
                start, skip_from = match.end(), None
            depth -= 1
    if skip_from is not None:  # unbalanced: leave it to the parser to refuse
        return body
    out.append(body[start:])
    return b"".join(out)


# The OTLP trace request's message fields (field number -> message type); every other field is copied as it is.
_SCHEMA: dict[str, dict[int, str]] = {
    "request": {1: "resource_spans"},
    "resource_spans": {1: "resource", 2: "scope_spans"},
    "resource": {1: "key_value"},
    "scope_spans": {1: "scope", 2: "span"},
    "scope": {3: "key_value"},
    "span": {9: "key_value", 11: "event", 13: "link"},
    "event": {3: "key_value"},
    "link": {5: "key_value"},
    "key_value": {2: "any_value"},
    "any_value": {5: "array_value", 6: "key_value_list"},
    "array_value": {1: "any_value"},
    "key_value_list": {1: "key_value"},
}


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("a truncated varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _marker_value() -> bytes:
    text = MARKER.encode()
    return b"\x0a" + _encode_varint(len(text)) + text  # AnyValue.string_value (field 1, length-delimited)


def _fields(data: bytes) -> list[tuple[int, int, bytes, bytes]]:
    """(field number, wire type, the field's whole bytes, a length-delimited field's payload) of one message."""
    fields, at = [], 0
    while at < len(data):
        start = at
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        payload = b""
        if wire == 0:
            _value, at = _varint(data, at)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            length, at = _varint(data, at)
            payload, at = data[at:at + length], at + length
        else:
            raise ValueError(f"wire type {wire} is not one OTLP uses")
        if at > len(data):
            raise ValueError("a truncated field")
        fields.append((number, wire, data[start:at], payload))
    return fields


def cut_deep_protobuf(body: bytes, cut_at: int = CUT_AT) -> bytes:
    """The protobuf request with every AnyValue nested deeper than `cut_at` attribute levels replaced by the marker
    string; ValueError when the body is not protobuf. Iterative: a stack of (message type, payload, depth) frames,
    each rebuilt from its fields once its submessages are."""
    root: list = ["request", _fields(body), 0, [], 0]  # [type, fields, next field, rebuilt parts, attribute level]
    stack = [root]
    while True:
        frame = stack[-1]
        kind, fields, index, parts, level = frame
        if index == len(fields):
            stack.pop()
            built = b"".join(parts)
            if not stack:
                return built
            parent = stack[-1]
            number = parent[1][parent[2] - 1][0]
            parent[3].append(_encode_varint(number << 3 | 2) + _encode_varint(len(built)) + built)
            continue
        number, wire, whole, payload = fields[index]
        frame[2] = index + 1
        child = _SCHEMA[kind].get(number) if wire == 2 else None
        if child is None:
            parts.append(whole)
            continue
        child_level = level + 1 if child == "any_value" else level
        if child == "any_value" and child_level > cut_at:
            marker = _marker_value()
            parts.append(_encode_varint(number << 3 | 2) + _encode_varint(len(marker)) + marker)
            continue
        stack.append([child, _fields(payload), 0, [], child_level])


def count_spans(body: bytes, kind: str) -> int:
    """How many spans the request holds, counted without decoding them, so a request over the span cap is refused
    in milliseconds (issue 61, item 5): protobuf by walking three levels of the wire format (spans are skipped whole),
    JSON by its `"startTimeUnixNano"` keys (one a span; events and links have none). 0 when the body cannot be read
    this way: the decoder then says why."""
    if kind != "protobuf":
        return body.count(b'"startTimeUnixNano"')
    try:
        total = 0
        for number, wire, _whole, resource_spans in _fields(body):
            if number != 1 or wire != 2:
                continue
            for inner, inner_wire, _w, scope_spans in _fields(resource_spans):
                if inner == 2 and inner_wire == 2:
                    total += sum(1 for field, kind_, _x, _y in _fields(scope_spans) if field == 2 and kind_ == 2)
        return total
    except ValueError:
        return 0

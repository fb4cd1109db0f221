"""Spans made by the real OpenTelemetry SDK and encoded by its own OTLP encoder (the one the HTTP exporter
posts), as protobuf or as OTLP/JSON through protobuf's json_format with the specification's hex ids."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}
ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def sdk_request(make: Callable, resource: dict | None = None, scope: str = "my.agent") -> ExportTraceServiceRequest:
    """The ExportTraceServiceRequest the SDK's exporter would send for the spans `make(tracer)` records."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(resource or {"service.name": "agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    make(provider.get_tracer(scope, "1.0"))
    provider.shutdown()
    return encode_spans(exporter.get_finished_spans())


def chat_span(tracer, user: str = "What is 2 + 2?", reply: str = "4", system: str | None = None,
              **attributes) -> None:
    """A model call as the current GenAI conventions record it (gen_ai.input/output.messages)."""
    with tracer.start_as_current_span("chat stub") as span:
        span.set_attribute("gen_ai.operation.name", "chat")
        span.set_attribute("gen_ai.provider.name", "openai")
        span.set_attribute("gen_ai.request.model", "stub")
        span.set_attribute("gen_ai.usage.input_tokens", 12)
        span.set_attribute("gen_ai.usage.output_tokens", 3)
        span.set_attribute("gen_ai.input.messages", json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": user}]}]))
        span.set_attribute("gen_ai.output.messages", json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": reply}], "finish_reason": "stop"}]))
        if system is not None:
            span.set_attribute("gen_ai.system_instructions", json.dumps([{"type": "text", "content": system}]))
        for name, value in attributes.items():
            span.set_attribute(name.replace("__", "."), value)


def to_json(request: ExportTraceServiceRequest) -> bytes:
    """OTLP/JSON: json_format's mapping with trace and span ids as hex, as the specification writes them."""
    payload = json_format.MessageToDict(request)

    def hexify(node: object) -> None:
        if isinstance(node, list):
            for item in node:
                hexify(item)
        elif isinstance(node, dict):
            for name, value in node.items():
                if name in ID_FIELDS and isinstance(value, str):
                    node[name] = base64.b64decode(value).hex()
                else:
                    hexify(value)

    hexify(payload)
    return json.dumps(payload).encode()

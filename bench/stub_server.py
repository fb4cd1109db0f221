"""An OpenAI-compatible chat-completions stub for benchmarking the engine's real model-call path.

It runs in a subprocess of its own (so its CPU never counts toward the engine's), on 127.0.0.1 at a
free port, and answers `POST /v1/chat/completions` (also `/chat/completions`) after a fixed latency,
with injected faults on demand and a log of every request as JSON lines. `GET /v1/models` (also `/models`)
lists the model names given as `models` (`--models`), as an OpenAI-compatible server lists what it serves;
it is not logged and draws no fault. Any model name is answered alike.

    with StubServer(latency_s=1.0, fault_rate=0.3) as stub:
        ...  # call it as model "openai/<anything>" with api_base=stub.url
        stub.requests()  # [{"t", "key", "stage", "model", "outcome", "status", ...}, ...]

Standalone: `python bench/stub_server.py --port 8000 --latency 1 --fault-rate 0.3 --log /tmp/stub.jsonl`.

The replies make the studio's engine do real work, by stage:
- a structured call (its `response_format.json_schema.name` is the stage: advantage, update, judge,
  direct, ...) gets valid JSON for that schema; the update ADDs one experience whose text depends on
  the request (MODIFY when the library is full), so every step makes a new version;
- a summary request (core.domain.prompts.summary_messages) gets a one-sentence summary (stage "summary");
- any other request is an agent rollout (stage "rollout"): "... so the answer is \\boxed{N}", N the
  demo task's reference answer or a wrong number. The engine's agent seeds each call from
  (query, sample index, turn); the stub recognises the sample index g from the seed and answers right
  for even g, wrong for odd g, so every group of G >= 2 is mixed. An unrecognised seed falls back to
  the parity of the request's key.
Every "ok" reply carries `ref <first 16 hex digits of its key>` in its text, so a ledger row's
response names the stub request it came from (bench/engine_path.py uses this to find repaid calls).

Faults: "429" (with `Retry-After: <retry_after_s>` unless None), "500", "503" (OpenAI-style error
bodies), "timeout" (hold the connection `hang_s` seconds, then close it without an answer), "reset"
(the TCP connection is aborted with an RST at once), "bad_body" (200 whose body is not JSON),
"bad_reply" (a 200 completion whose content is not the JSON asked for; a request without a
response_format gets a normal reply and is logged "ok").
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import weakref
from pathlib import Path

ALL_FAULTS = ("429", "500", "503", "timeout", "reset", "bad_body", "bad_reply")
MODELS = ("stub", "stub-large")  # what GET /v1/models lists unless told otherwise
STATUS = {"ok": 200, "429": 429, "500": 500, "503": 503, "timeout": None, "reset": None, "bad_body": 200,
          "bad_reply": 200}
DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "demo"
SUMMARY_OPENING = "An AI agent attempted the following task."
WRONG_ANSWER = "-12345"
MAX_GROUP_INDEX = 64  # sample indices 0..63 (and run seed s: s*10000 + g) are recognised from the seed
_ARITH = re.compile(r"What is (-?\d+(?:\.\d+)?) ([-+*]) (-?\d+(?:\.\d+)?)\?")


# --------------------------------------------------------------------------------------------- replies


def request_key(body: dict) -> str:
    """sha256 of the canonical JSON of (model, messages, temperature, max_tokens, seed, response_format)."""
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    parts = [body.get("model"), body.get("messages"), body.get("temperature"), max_tokens, body.get("seed"),
             body.get("response_format")]
    payload = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def _load_references() -> dict[str, str]:
    references: dict[str, str] = {}
    for name in ("arithmetic_train.jsonl", "arithmetic_test.jsonl"):
        path = DATA_DIR / name
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                if row.get("query") and row.get("answer") is not None:
                    references[str(row["query"]).strip()] = str(row["answer"]).strip()
    return references


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _agent_seed(query: str, sample_index: int, turn: int) -> int:
    """The seed core.grpo.agent sends for (query, sample index, turn) (core.models.gateway._seed of a sha256)."""
    digest = hashlib.sha256(f"{query}\x00{sample_index}\x00{turn}".encode()).hexdigest()
    return int(digest[:8], 16) % (2**31 - 1)


class Replier:
    """Builds the content of an "ok" (or "bad_reply") completion for one request."""

    def __init__(self) -> None:
        self.references = _load_references()
        self._seeds: dict[str, dict[int, int]] = {}

    def stage(self, body: dict) -> str:
        response_format = body.get("response_format") or {}
        if isinstance(response_format, dict):
            name = (response_format.get("json_schema") or {}).get("name")
            if name:
                return str(name)
        messages = body.get("messages") or []
        texts = [_text(m.get("content")) for m in messages if isinstance(m, dict)]
        if any(t.startswith(SUMMARY_OPENING) for t in texts):
            return "summary"
        joined = "\n".join(texts)
        if 'Reply with JSON only: {"operations"' in joined:
            return "update"
        if 'Reply with JSON only: {"analysis"' in joined:
            return "advantage"
        if "Example problems it will face" in joined:
            return "direct"
        if "You are a strict, fair grader" in joined:
            return "judge"
        return "rollout"

    def content(self, stage: str, body: dict, key: str) -> str:
        ref = key[:16]
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        user = next((_text(m.get("content")) for m in messages if m.get("role") == "user"), "")
        system = next((_text(m.get("content")) for m in messages if m.get("role") == "system"), "")
        h = int(key[16:24], 16)
        if stage == "rollout":
            return self._rollout(body, messages, user, key)
        if stage == "summary":
            return (f"The attempt read the problem, computed the result in one pass and boxed it, using none of the "
                    f"experiences (ref {ref}).")
        if stage == "advantage":
            return json.dumps({
                "analysis": f"The correct attempts re-read the question and checked each operation; the wrong ones "
                            f"combined the quantities in the wrong order (ref {ref}).",
                "experiences": [f"Before computing, restate which quantity the question asks for, check {key[:6]}.",
                                "Check each arithmetic step against the numbers given in the problem."][: 1 + h % 2],
            })
        if stage == "update":
            return json.dumps({"operations": [self._update_op(user, key)]})
        if stage == "direct":
            match = re.search(r"Write (\d+) general", user)
            count = max(1, min(int(match.group(1)) if match else 3, 12))
            return json.dumps({"experiences": [f"Write down each quantity with its unit, lesson {i} {key[:6]}."
                                               for i in range(count)]})
        if stage == "judge":
            match = re.search(r"<integer (\d+)-(\d+)>", system + user)
            low, high = (int(match.group(1)), int(match.group(2))) if match else (0, 1)
            return json.dumps({"reason": f"The answer meets the criteria in part (ref {ref}).",
                               "score": low + h % (high - low + 1), "confident": h % 5 != 0})
        schema = (((body.get("response_format") or {}).get("json_schema") or {}).get("schema")) or {}
        return json.dumps(_fill(schema, ref))

    def bad_content(self, key: str) -> str:
        return f"I think the library looks fine as it is, nothing to add (ref {key[:16]})."

    def _rollout(self, body: dict, messages: list[dict], query: str, key: str) -> str:
        query = query.strip()
        reference = self.references.get(query)
        if reference is None:
            arith = _ARITH.search(query)
            if arith:
                a, op, b = float(arith.group(1)), arith.group(2), float(arith.group(3))
                value = a + b if op == "+" else a - b if op == "-" else a * b
                reference = f"{value:g}"
        right = self._right(query, body.get("seed"), messages, key)
        answer = (reference if right else WRONG_ANSWER) if reference is not None else str(int(key[:4], 16) % 100)
        return (f"Step by step: I read the problem, pick out the quantities and compute (ref {key[:16]}), "
                f"so the answer is \\boxed{{{answer}}}")

    def _right(self, query: str, seed: object, messages: list[dict], key: str) -> bool:
        if isinstance(seed, int):
            turn = sum(1 for m in messages if m.get("role") == "assistant")
            table = self._seeds.get(query)
            if table is None:
                table = self._seeds[query] = {}
            if turn not in table:
                table[turn] = {_agent_seed(query, g, turn): g for g in range(MAX_GROUP_INDEX)}  # type: ignore[assignment]
            g = table[turn].get(seed)  # type: ignore[union-attr]
            if g is None:  # a run seed s > 0: sample index s * 10000 + g
                g = self._run_seed_index(query, seed, turn)
            if g is not None:
                return g % 2 == 0
        return int(key[-2:], 16) % 2 == 0

    @staticmethod
    def _run_seed_index(query: str, seed: int, turn: int) -> int | None:
        for run_seed in range(1, 4):
            for g in range(16):
                if _agent_seed(query, run_seed * 10_000 + g, turn) == seed:
                    return g
        return None

    @staticmethod
    def _update_op(user: str, key: str) -> dict:
        library = re.search(r"Current experience library \(ids in brackets\):\n(.*?)\n\nProposed experiences", user,
                            re.DOTALL)
        ids = re.findall(r"^\[(\w+)\] ", library.group(1), re.MULTILINE) if library else []
        limit = re.search(r"keep the library at\s+most (\d+) experiences", user)
        full = limit is not None and len(ids) >= int(limit.group(1))
        text = f"Re-read the question and name the quantity it asks for before computing, note {key[:8]}."
        if full and ids:
            return {"op": "MODIFY", "ids": [ids[-1]], "text": text,
                    "rationale": "the library is full, so the newest lesson is revised"}
        return {"op": "ADD", "ids": [], "text": text, "rationale": f"failed attempts answered the wrong quantity ({key[:6]})"}


def _fill(schema: dict, ref: str) -> object:
    """A minimal valid value for a JSON schema (for structured stages the stub does not know)."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "object":
        return {name: _fill(prop, ref) for name, prop in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [_fill(schema.get("items") or {"type": "string"}, ref)] if schema.get("minItems", 1) else []
    if kind == "integer":
        return int(schema.get("minimum", 1))
    if kind == "number":
        return float(schema.get("minimum", 1))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return f"A stub reply for this field (ref {ref})."


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def completion(body: dict, content: str) -> dict:
    prompt = sum(_tokens(_text(m.get("content"))) + 4 for m in body.get("messages") or [] if isinstance(m, dict))
    out = _tokens(content)
    return {
        "id": f"chatcmpl-stub{random.getrandbits(48):012x}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(body.get("model") or "stub"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop",
                     "logprobs": None}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out},
        "system_fingerprint": "stub",
    }


def streamed(reply: dict) -> str:
    """A completion as the server-sent events of a streamed one (`"stream": true`): its text word by word, then
    its usage, then [DONE], as OpenAI's and llama.cpp's servers send them."""
    head = {key: reply[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    words = re.findall(r"\S*\s*", reply["choices"][0]["message"]["content"])
    events = [head | {"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
              for word in words if word]
    events.append(head | {"choices": [], "usage": reply["usage"]})
    return "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"


def error_body(outcome: str) -> dict:
    kinds = {"429": ("Rate limit reached for requests (stub)", "rate_limit_error", "rate_limit_exceeded"),
             "500": ("The server had an error while processing your request (stub)", "server_error", None),
             "503": ("The engine is currently overloaded, please try again later (stub)", "server_error", None)}
    message, kind, code = kinds[outcome]
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# ---------------------------------------------------------------------------------------------- server


class _App:
    def __init__(self, args: argparse.Namespace) -> None:
        self.latency = max(0.0, args.latency)
        self.fault_rate = args.fault_rate
        self.faults = tuple(f for f in args.faults.split(",") if f) if args.faults else ALL_FAULTS
        unknown = [f for f in self.faults if f not in ALL_FAULTS]
        if unknown:
            raise SystemExit(f"unknown fault(s) {unknown}; known: {', '.join(ALL_FAULTS)}")
        self.script: list[str] = json.loads(Path(args.script_file).read_text()) if args.script_file else []
        for item in self.script:
            if item != "ok" and item not in ALL_FAULTS:
                raise SystemExit(f"unknown script outcome {item!r}")
        self.use_script = args.script_file is not None
        self.retry_after = None if args.retry_after in (None, "none", "") else float(args.retry_after)
        self.hang = args.hang
        self.random = random.Random(args.seed)
        self.count = 0
        self.replier = Replier()
        self.models = [name for name in (args.models or "").split(",") if name]
        self.log = open(args.log, "a", encoding="utf-8")  # noqa: SIM115  (open for the server's lifetime)

    def outcome(self) -> str:
        index = self.count
        self.count += 1
        if self.use_script:
            return self.script[index] if index < len(self.script) else "ok"
        if self.fault_rate > 0 and self.random.random() < self.fault_rate:
            return self.random.choice(self.faults)
        return "ok"

    def write(self, record: dict) -> None:
        self.log.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.log.flush()

    async def chat(self, request):
        from aiohttp import web

        arrived = time.time()
        raw = await request.read()
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            return web.json_response({"error": {"message": "the request body is not a JSON object", "type":
                                                "invalid_request_error", "param": None, "code": None}}, status=400)
        key = request_key(body)
        stage = self.replier.stage(body)
        outcome = self.outcome()
        if outcome == "bad_reply" and not body.get("response_format"):
            outcome = "ok"
        self.write({"i": self.count - 1, "t": arrived, "key": key, "stage": stage, "model": str(body.get("model")),
                    "outcome": outcome, "status": STATUS[outcome]})
        if outcome == "reset":
            _reset(request)
            return _dropped()
        if self.latency:
            await asyncio.sleep(self.latency)
        if outcome == "timeout":
            await asyncio.sleep(self.hang)
            transport = request.transport
            if transport is not None:
                transport.close()
            return _dropped()
        if outcome in ("429", "500", "503"):
            headers = {}
            if outcome == "429" and self.retry_after is not None:
                headers["Retry-After"] = f"{self.retry_after:g}"
            return web.json_response(error_body(outcome), status=int(outcome), headers=headers)
        if outcome == "bad_body":
            return web.Response(text='{"id": "chatcmpl-stub", "choices": [ this is not JSON', status=200,
                                content_type="application/json")
        content = (self.replier.bad_content(key) if outcome == "bad_reply"
                   else self.replier.content(stage, body, key))
        if body.get("stream"):
            return web.Response(text=streamed(completion(body, content)), content_type="text/event-stream")
        return web.Response(text=json.dumps(completion(body, content)), content_type="application/json")

    async def models_list(self, _request):
        from aiohttp import web

        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "stub"} for name in self.models]})

    async def health(self, _request):
        from aiohttp import web

        return web.Response(text="ok")

    async def reset_log(self, _request):
        from aiohttp import web

        self.log.seek(0)
        self.log.truncate()
        self.log.flush()
        return web.Response(text="ok")


def _reset(request) -> None:
    """Abort the connection with an RST (SO_LINGER 0), without a response."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()


def _dropped():
    """What a handler returns for a connection it closed without answering: aiohttp cannot write it, and
    a closed transport makes it give up quietly."""
    from aiohttp import web

    return web.Response(status=204)


def serve(args: argparse.Namespace) -> None:
    from aiohttp import web

    app_state = _App(args)
    app = web.Application(client_max_size=64 * 1024**2)
    app.router.add_post("/v1/chat/completions", app_state.chat)
    app.router.add_post("/chat/completions", app_state.chat)
    app.router.add_get("/v1/models", app_state.models_list)
    app.router.add_get("/models", app_state.models_list)
    app.router.add_get("/health", app_state.health)
    app.router.add_get("/v1/health", app_state.health)
    app.router.add_post("/_stub/reset_log", app_state.reset_log)

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port, backlog=4096, reuse_address=True)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"http://{args.host}:{port}/v1", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        app_state.log.close()
        os._exit(0)  # requests still hanging ("timeout") are dropped with the process

    asyncio.run(main())


# ------------------------------------------------------------------------------------ parent-side API


class StubServer:
    """The stub in a subprocess: `with StubServer(...) as stub:` starts it and waits until it answers."""

    def __init__(self, *, latency_s: float = 0.0, fault_rate: float = 0.0, faults: tuple[str, ...] = ALL_FAULTS,
                 script: list[str] | None = None, retry_after_s: float | None = 0.05, hang_s: float = 30.0,
                 seed: int = 0, log_path: Path | None = None, models: tuple[str, ...] = MODELS) -> None:
        bad = [f for f in faults if f not in ALL_FAULTS] + [s for s in script or [] if s != "ok" and s not in ALL_FAULTS]
        if bad:
            raise ValueError(f"unknown fault(s) {bad}; known: ok, {', '.join(ALL_FAULTS)}")
        self.latency_s, self.fault_rate, self.faults = latency_s, fault_rate, tuple(faults)
        self.script, self.retry_after_s, self.hang_s, self.seed = script, retry_after_s, hang_s, seed
        self.models = tuple(models)
        self._tmp = tempfile.mkdtemp(prefix="stub_server_")
        weakref.finalize(self, shutil.rmtree, self._tmp, True)
        self.log_path = Path(log_path) if log_path else Path(self._tmp) / "requests.jsonl"
        self.url = ""
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def start(self) -> StubServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("")
        command = [sys.executable, str(Path(__file__).resolve()), "--port", "0", "--latency", str(self.latency_s),
                   "--fault-rate", str(self.fault_rate), "--faults", ",".join(self.faults),
                   "--retry-after", "none" if self.retry_after_s is None else str(self.retry_after_s),
                   "--hang", str(self.hang_s), "--seed", str(self.seed), "--log", str(self.log_path),
                   "--models", ",".join(self.models)]
        if self.script is not None:
            script_file = Path(self._tmp) / "script.json"
            script_file.write_text(json.dumps(list(self.script)))
            command += ["--script-file", str(script_file)]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=None, stdin=subprocess.DEVNULL,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = self._first_line(timeout=30)
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"the stub server did not start (it printed {line!r})")
        self.url = line.strip()
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.05)

    def _first_line(self, timeout: float) -> str:
        import selectors

        assert self.proc is not None and self.proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            if not selector.select(timeout):
                return ""
        return self.proc.stdout.readline()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def requests(self) -> list[dict]:
        """Every request received so far, in arrival order (see the module docstring for the fields)."""
        try:
            text = self.log_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        records = []
        for line in text.splitlines(keepends=True):
            if line.endswith("\n") and line.strip():
                records.append(json.loads(line))
        return records

    def reset_log(self) -> None:
        """Empty the request log (the script's position and the fault draws go on where they were)."""
        if self.proc is not None and self.proc.poll() is None:
            request = urllib.request.Request(f"http://127.0.0.1:{self.port}/_stub/reset_log", data=b"", method="POST")
            with urllib.request.urlopen(request, timeout=10):
                return
        self.log_path.write_text("")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 = a free port (the URL is printed)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each reply")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="share of requests that get a fault")
    parser.add_argument("--faults", default=",".join(ALL_FAULTS), help="comma-separated fault kinds to draw from")
    parser.add_argument("--script-file", default=None, help="JSON list of outcomes for requests 0, 1, ... (then ok)")
    parser.add_argument("--retry-after", default="0.05", help="Retry-After seconds of a 429, or none")
    parser.add_argument("--hang", type=float, default=30.0, help="seconds a 'timeout' holds its connection")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names GET /v1/models lists")
    parser.add_argument("--log", default=None, help="request log (JSON lines); default: a temp file")
    args = parser.parse_args(argv)
    if args.log is None:
        args.log = str(Path(tempfile.mkdtemp(prefix="stub_server_")) / "requests.jsonl")
        print(f"request log: {args.log}", file=sys.stderr, flush=True)
    serve(args)


if __name__ == "__main__":
    main()

"""A fake model API on loopback, for driving real coding clients without a model.

It records every request it receives (method, path, query, the headers of
interest and the parsed JSON body) in memory and, when given a file, as one JSON
line per request, so a test can check exactly what reached "the model". It
answers from a script: a list of replies, each plain text, a tool call, a list of
those (one answer with several blocks) or a function of the request that answers
one; every reply ends its turn, and when the script runs out it answers "ok". It
speaks three wire formats:

- Anthropic Messages: `POST /v1/messages` (SSE when "stream" is true, one JSON
  message otherwise) and `POST /v1/messages/count_tokens`; Claude Code.
- OpenAI Responses: `POST /v1/responses`, streamed as SSE (text, a
  function_call item, or a custom_tool_call for a tool taking text, such as
  apply_patch); Codex.
- Gemini: `POST .../models/M:streamGenerateContent?alt=sse`, `...:generateContent`
  and `...:countTokens` (text and functionCall parts); Gemini CLI.
- OpenAI Chat Completions: `POST .../chat/completions` (SSE chunks when "stream" is
  true, ending `data: [DONE]`; tool calls as `delta.tool_calls`); Qwen Code, Copilot CLI.

Only "turn" requests consume the script: the ones a client makes to run the
agent's conversation (an Anthropic or Chat Completions request with tools, any
Responses request, a Gemini streamGenerateContent). Side requests (titles, summaries, quota probes,
routing and next-speaker checks) are recorded too but answered "ok" (or, when
they ask for JSON by a schema, the smallest JSON that fits it), so they cannot
eat a scripted tool call. A callback registered with `before(n, fn)` runs just before
turn request n (1-based) is answered; `on_turn(fn)` runs before every one.

As a module:

    model = FakeModel(["hello", tool("mcp__agora__read", {})]).start()
    ... point a client at model.url ...
    model.wait_turns(2, timeout=30); model.turns()[1]["body"]; model.stop()

Standalone, for debugging: `python3 fake_model.py [--port N] [--log FILE]
[--reply TEXT | --tool NAME=JSON]...` prints its URL and serves until ^C.
Standard library only.
"""

import argparse
import http.server
import itertools
import json
import sys
import threading
import time
import urllib.parse

HEADERS_OF_INTEREST = ("user-agent", "content-type", "authorization", "x-api-key",
                       "x-goog-api-key", "anthropic-version", "anthropic-beta", "accept")


def text(value):
    """Answer a scripted reply that is plain text."""
    return {"text": str(value)}


def tool(name, arguments=None, namespace=None):
    """Answer a scripted reply that calls tool NAME with ARGUMENTS (a dict; for an OpenAI
    Responses custom tool, such as Codex's apply_patch, the text it takes). NAMESPACE
    is for an OpenAI Responses tool of type "namespace" (Codex puts each MCP server's
    tools in one: namespace "mcp__agora", name "read")."""
    reply = {"tool": name, "input": arguments if isinstance(arguments, str)
             else dict(arguments or {})}
    if namespace:
        reply["namespace"] = namespace
    return reply


def _blocks(reply, request=None):
    """Normalise one scripted reply into a list of {"text"} / {"tool", "input"} blocks.

    A callable reply is called with the request being answered and answers a reply:
    a script can then adapt, e.g. load deferred tools only when they are deferred."""
    if callable(reply):
        return reply if request is None else _blocks(reply(request))
    items = reply if isinstance(reply, list) else [reply]
    blocks = []
    for item in items:
        if isinstance(item, str):
            blocks.append(text(item))
        elif isinstance(item, dict) and ("text" in item or "tool" in item):
            blocks.append(item)
        else:
            raise ValueError(f"a scripted reply is text or tool(...), not {item!r}")
    return blocks


def classify(path, body):
    """Answer (api, kind) for a request: api anthropic/openai/gemini/other, kind
    turn/side/count/unknown."""
    body = body if isinstance(body, dict) else {}
    if path.startswith("/v1/messages/count_tokens"):
        return "anthropic", "count"
    if path.startswith("/v1/messages"):
        return "anthropic", "turn" if body.get("tools") else "side"
    if path.startswith("/v1/responses"):
        return "openai", "turn"
    if path.endswith("/chat/completions"):
        return "chat", "turn" if body.get("tools") else "side"
    if ":streamGenerateContent" in path:
        return "gemini", "turn"
    if ":generateContent" in path:
        return "gemini", "side"
    if ":countTokens" in path:
        return "gemini", "count"
    return "other", "unknown"


def schema_instance(schema):
    """Answer the smallest value that fits a JSON schema: the first enum value, the
    minimum of a number, every property of an object. Gemini CLI asks for JSON this
    way (routing, next-speaker checks) and retries for minutes on anything else."""
    if not isinstance(schema, dict):
        return None
    if schema.get("enum"):
        return schema["enum"][0]
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        return {key: schema_instance(sub) for key, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        return []
    if kind in ("number", "integer"):
        return schema.get("minimum", 1 if kind == "integer" else 1.0)
    if kind == "boolean":
        return False
    return "fake"


def request_text(request):
    """Answer every string in a recorded request's body joined by newlines: what the
    model was shown (system prompt, messages, tool results, tool specs)."""
    out = []

    def walk(value):
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
    walk(request.get("body"))
    return "\n".join(out)


def tool_names(request):
    """Answer the names of the tools a recorded turn request offered the model."""
    body = request.get("body") or {}
    names = []
    for spec in body.get("tools") or []:
        if not isinstance(spec, dict):
            continue
        if "name" in spec:                                   # anthropic, openai
            names.append(spec["name"])
        if isinstance(spec.get("function"), dict):           # chat completions
            names.append(spec["function"].get("name"))
        for declaration in spec.get("functionDeclarations") or []:   # gemini
            names.append(declaration.get("name"))
    return names


class FakeModel:
    """The fake model server: a script of replies, a record of requests, callbacks."""

    def __init__(self, script=(), log_path=None, port=0):
        self.log_path = log_path
        self.port = port
        self.requests = []
        self._script = [_blocks(reply) for reply in script]
        self._callbacks = {}
        self._every = []
        self._turns = 0
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._server = None
        self._thread = None
        self.errors = []                    # exceptions raised by callbacks

    # -- life cycle -------------------------------------------------------------
    def start(self):
        """Start serving in a daemon thread; answer self (model.url is then set)."""
        handler = type("Handler", (_Handler,), {"model": self})
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="fake-model", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Stop serving and close the socket."""
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self):
        """The base URL, e.g. http://127.0.0.1:PORT (no trailing slash)."""
        return f"http://127.0.0.1:{self.port}"

    # -- script and callbacks ---------------------------------------------------
    def set_script(self, replies):
        """Replace the replies still to come (the turn count goes on)."""
        with self._cond:
            self._script = [_blocks(reply) for reply in replies]

    def before(self, n, fn):
        """Run fn(request) just before turn request N (1-based) is answered."""
        with self._cond:
            self._callbacks.setdefault(n, []).append(fn)

    def on_turn(self, fn):
        """Run fn(request) just before every turn request is answered."""
        with self._cond:
            self._every.append(fn)

    # -- reading what arrived ---------------------------------------------------
    def turns(self):
        """Answer the recorded turn requests, oldest first."""
        with self._cond:
            return [r for r in self.requests if r["kind"] == "turn"]

    def wait_turns(self, count, timeout):
        """Block until COUNT turn requests arrived (answer True) or TIMEOUT s passed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while sum(r["kind"] == "turn" for r in self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def wait_for(self, predicate, timeout):
        """Block until a recorded request satisfies PREDICATE; answer it, or None."""
        deadline = time.monotonic() + timeout
        with self._cond:
            seen = 0
            while True:
                for request in self.requests[seen:]:
                    if predicate(request):
                        return request
                seen = len(self.requests)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    # -- the handler's side -----------------------------------------------------
    def _record(self, method, path, query, headers, body):
        api, kind = classify(path, body)
        with self._cond:
            request = {"n": len(self.requests) + 1, "time": time.time(),
                       "monotonic": time.monotonic(), "method": method, "path": path,
                       "query": query, "api": api, "kind": kind,
                       "headers": {k: v for k, v in headers.items()
                                   if k.lower() in HEADERS_OF_INTEREST},
                       "body": body}
            if kind == "turn":
                self._turns += 1
                request["turn"] = self._turns
                blocks = self._script.pop(0) if self._script else [text("ok")]
                callbacks = self._every + self._callbacks.get(self._turns, [])
                if callable(blocks):
                    try:
                        blocks = _blocks(blocks, request)
                    except Exception as error:
                        self.errors.append(f"turn {self._turns}: script: {error!r}")
                        blocks = [text("ok")]
            else:
                blocks, callbacks = [text("ok")], []
            request["reply"] = blocks
            self.requests.append(request)
            self._cond.notify_all()
        if self.log_path:
            with self._cond, open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(request, ensure_ascii=False) + "\n")
        for fn in callbacks:
            try:
                fn(request)
            except Exception as error:          # a test's callback must not kill the server
                self.errors.append(f"turn {request.get('turn')}: {error!r}")
        return request, blocks

    def next_id(self, prefix):
        return f"{prefix}_{next(self._ids):06d}"


class _Handler(http.server.BaseHTTPRequestHandler):
    """One request: record it, then answer in the wire format its path asks for."""

    model = None                    # set on the subclass FakeModel.start makes
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):   # quiet
        pass

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def do_HEAD(self):
        self._send(200, b"", "text/plain")

    def _handle(self, method):
        parsed = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        body = self._body() if method == "POST" else None
        request, blocks = self.model._record(method, parsed.path, query,
                                             dict(self.headers), body)
        api, kind = request["api"], request["kind"]
        body = body if isinstance(body, dict) else {}
        try:
            if kind == "count" and api == "anthropic":
                return self._json({"input_tokens": 100})
            if kind == "count" and api == "gemini":
                return self._json({"totalTokens": 100})
            if api == "anthropic":
                if body.get("stream"):
                    return self._anthropic_sse(body, blocks)
                return self._json(self._anthropic_message(body, blocks))
            if api == "openai":
                return self._openai_sse(body, blocks)
            if api == "chat":
                return self._chat(body, blocks)
            if api == "gemini":
                if ":streamGenerateContent" in parsed.path:
                    return self._gemini_sse(body, blocks)
                config = body.get("generationConfig") or {}
                schema = config.get("responseJsonSchema") or config.get("responseSchema")
                if kind == "side" and config.get("responseMimeType") == "application/json":
                    blocks = [text(json.dumps(schema_instance(schema or {})))]
                    request["reply"] = blocks
                return self._json(self._gemini_chunk(blocks))
            if method == "GET" and parsed.path.rstrip("/").endswith("/models"):
                return self._json({"data": [], "models": []})
            self._json({"error": {"type": "not_found", "message": parsed.path}}, 404)
        except (BrokenPipeError, ConnectionResetError):
            pass

    # -- plumbing ---------------------------------------------------------------
    def _send(self, status, data, content_type):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, value, status=200):
        self._send(status, json.dumps(value).encode(), "application/json")

    def _sse_start(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _event(self, data, name=None):
        head = f"event: {name}\n" if name else ""
        self.wfile.write((head + "data: " + json.dumps(data) + "\n\n").encode())
        self.wfile.flush()

    # -- Anthropic Messages -----------------------------------------------------
    def _anthropic_content(self, blocks):
        content = []
        for block in blocks:
            if "tool" in block:
                content.append({"type": "tool_use", "id": self.model.next_id("toolu"),
                                "name": block["tool"], "input": block["input"]})
            else:
                content.append({"type": "text", "text": block["text"]})
        return content

    def _anthropic_message(self, body, blocks):
        content = self._anthropic_content(blocks)
        stop = "tool_use" if any(c["type"] == "tool_use" for c in content) else "end_turn"
        return {"id": self.model.next_id("msg"), "type": "message", "role": "assistant",
                "model": body.get("model", "fake"), "content": content,
                "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": 100, "output_tokens": 10}}

    def _anthropic_sse(self, body, blocks):
        message = self._anthropic_message(body, blocks)
        content = message["content"]
        self._sse_start()
        self._event({"type": "message_start", "message": dict(
            message, content=[], stop_reason=None,
            usage={"input_tokens": 100, "output_tokens": 1})}, "message_start")
        for index, block in enumerate(content):
            if block["type"] == "tool_use":
                self._event({"type": "content_block_start", "index": index,
                             "content_block": dict(block, input={})}, "content_block_start")
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            else:
                self._event({"type": "content_block_start", "index": index,
                             "content_block": {"type": "text", "text": ""}},
                            "content_block_start")
                delta = {"type": "text_delta", "text": block["text"]}
            self._event({"type": "content_block_delta", "index": index, "delta": delta},
                        "content_block_delta")
            self._event({"type": "content_block_stop", "index": index}, "content_block_stop")
        self._event({"type": "message_delta",
                     "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                     "usage": {"output_tokens": 10}}, "message_delta")
        self._event({"type": "message_stop"}, "message_stop")

    # -- OpenAI Responses -------------------------------------------------------
    def _openai_sse(self, body, blocks):
        response_id = self.model.next_id("resp")
        base = {"id": response_id, "object": "response", "created_at": int(time.time()),
                "model": body.get("model", "fake"), "status": "in_progress", "output": []}
        self._sse_start()
        self._event({"type": "response.created", "response": base}, "response.created")
        output = []
        for index, block in enumerate(blocks):
            if "tool" in block and isinstance(block["input"], str):    # a custom tool
                item = {"type": "custom_tool_call", "id": self.model.next_id("ctc"),
                        "call_id": self.model.next_id("call"), "name": block["tool"],
                        "input": block["input"], "status": "completed"}
                self._event({"type": "response.output_item.added", "output_index": index,
                             "item": dict(item, input="", status="in_progress")},
                            "response.output_item.added")
            elif "tool" in block:
                item = {"type": "function_call", "id": self.model.next_id("fc"),
                        "call_id": self.model.next_id("call"), "name": block["tool"],
                        "arguments": json.dumps(block["input"]), "status": "completed"}
                if block.get("namespace"):
                    item["namespace"] = block["namespace"]
                self._event({"type": "response.output_item.added", "output_index": index,
                             "item": dict(item, arguments="", status="in_progress")},
                            "response.output_item.added")
                self._event({"type": "response.function_call_arguments.delta",
                             "item_id": item["id"], "output_index": index,
                             "delta": item["arguments"]},
                            "response.function_call_arguments.delta")
            else:
                item = {"type": "message", "id": self.model.next_id("msg"), "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": block["text"],
                                     "annotations": []}]}
                self._event({"type": "response.output_item.added", "output_index": index,
                             "item": dict(item, content=[], status="in_progress")},
                            "response.output_item.added")
                self._event({"type": "response.output_text.delta", "item_id": item["id"],
                             "output_index": index, "content_index": 0,
                             "delta": block["text"]}, "response.output_text.delta")
            self._event({"type": "response.output_item.done", "output_index": index,
                         "item": item}, "response.output_item.done")
            output.append(item)
        usage = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": 10, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": 110}
        self._event({"type": "response.completed",
                     "response": dict(base, status="completed", output=output, usage=usage)},
                    "response.completed")

    # -- OpenAI Chat Completions ------------------------------------------------
    def _chat(self, body, blocks):
        said = "".join(block["text"] for block in blocks if "text" in block)
        calls = [{"index": index, "id": self.model.next_id("call"), "type": "function",
                  "function": {"name": block["tool"], "arguments": json.dumps(block["input"])}}
                 for index, block in enumerate(b for b in blocks if "tool" in b)]
        finish = "tool_calls" if calls else "stop"
        base = {"id": self.model.next_id("chatcmpl"), "created": int(time.time()),
                "model": body.get("model", "fake")}
        usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
        message = {"role": "assistant", "content": said or None}
        if calls:
            message["tool_calls"] = [{k: v for k, v in call.items() if k != "index"}
                                     for call in calls]
        if not body.get("stream"):
            return self._json(dict(base, object="chat.completion", usage=usage, choices=[
                {"index": 0, "message": message, "finish_reason": finish}]))
        self._sse_start()
        chunk = dict(base, object="chat.completion.chunk")
        delta = {"role": "assistant", "content": said}
        if calls:
            delta["tool_calls"] = calls
        self._event(dict(chunk, choices=[{"index": 0, "delta": delta, "finish_reason": None}]))
        self._event(dict(chunk, choices=[{"index": 0, "delta": {}, "finish_reason": finish}],
                         usage=usage))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    # -- Gemini -----------------------------------------------------------------
    def _gemini_chunk(self, blocks):
        parts = []
        for block in blocks:
            if "tool" in block:
                parts.append({"functionCall": {"name": block["tool"], "args": block["input"]}})
            else:
                parts.append({"text": block["text"]})
        return {"candidates": [{"content": {"role": "model", "parts": parts},
                                "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 10,
                                  "totalTokenCount": 110},
                "modelVersion": "fake"}

    def _gemini_sse(self, body, blocks):
        self._sse_start()
        self.wfile.write(("data: " + json.dumps(self._gemini_chunk(blocks))
                          + "\r\n\r\n").encode())
        self.wfile.flush()


def main(argv=None):
    """Serve standalone until interrupted, printing each request's summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", help="append each request as a JSON line to this file")
    parser.add_argument("--reply", action="append", default=[], dest="script",
                        type=text, help="a plain-text reply (repeatable, in order)")
    parser.add_argument("--tool", action="append", dest="script", metavar="NAME=JSON",
                        type=lambda s: tool(s.split("=", 1)[0],
                                            json.loads(s.split("=", 1)[1] or "{}")),
                        help="a tool-call reply, e.g. read={} (repeatable, in order)")
    options = parser.parse_args(argv)
    model = FakeModel(options.script, log_path=options.log, port=options.port)
    model.on_turn(lambda r: print(f"turn {r['turn']}: {r['method']} {r['path']} -> "
                                  f"{json.dumps(r['reply'])}", flush=True))
    model.start()
    print(f"fake model listening on {model.url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        model.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

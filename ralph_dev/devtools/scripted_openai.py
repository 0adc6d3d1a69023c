"""A scripted stand-in for the OpenAI Responses API (streamed), served on loopback.

The Codex CLI's half of ``scripted_model``: the real Codex CLI talks to it
(``OPENAI_BASE_URL``), runs its real shell tool, writes its real session files,
while the answers come from the same Python brains Claude Code's fake uses. A
Responses request is read as the Messages-shaped request those brains know
(``instructions`` as the system prompt, ``input`` items as messages, the shell
tool offered as ``Bash``), and a brain's ``bash(...)`` step goes back as a call
of whichever shell tool this Codex offered. Faults (``api_faults``) answer as the
API refuses: a 429 with ``retry-after``, a 5xx, a hang, a malformed stream.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from ralph_dev.devtools.api_faults import Hang, Malformed, Refusal
from ralph_dev.devtools.loopback import LoopbackServer
from ralph_dev.devtools.scripted_model import (
    Block,
    Brain,
    Recorded,
    Text,
    ToolUse,
    ask_brain,
    is_key_probe,
    linger,
    recorded,
)

_ids = itertools.count(1)

SHELL_TOOLS = ("shell_command", "exec_command", "shell")
"""The shell tools Codex offers, by version and model family, most preferred first."""

_HIDDEN_HEADERS = {"authorization"}


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(str(part.get("text", "")) for part in content
                     if isinstance(part, dict) and isinstance(part.get("text"), str))


def shell_tool(request: Mapping[str, Any]) -> str | None:
    """The shell tool this request offers (its name), if any."""
    names = {str(t.get("name")) for t in request.get("tools", []) or [] if isinstance(t, dict)}
    return next((name for name in SHELL_TOOLS if name in names), None)


def _command_of(arguments: str) -> str:
    """A shell call's command line, whichever tool's argument shape it has."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return arguments
    if not isinstance(args, dict):
        return arguments
    command = args.get("command", args.get("cmd", ""))
    if isinstance(command, list):
        return str(command[-1]) if command else ""
    return str(command)


def as_messages_request(request: Mapping[str, Any]) -> dict[str, Any]:
    """The Responses request as the Messages-shaped request the brains read."""
    messages: list[dict[str, Any]] = []
    said = request.get("input")
    if isinstance(said, str):  # a plain text input (ralph-dev's probe of a key's limits)
        messages.append({"role": "user", "content": said})
    for item in said if isinstance(said, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            role = "assistant" if item.get("role") == "assistant" else "user"
            messages.append({"role": role, "content": [
                {"type": "text", "text": _content_text(item.get("content"))}]})
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            messages.append({"role": "assistant", "content": [{
                "type": "tool_use", "id": str(item.get("call_id", "")), "name": "Bash",
                "input": {"command": _command_of(str(item.get("arguments", "")))}}]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            text = output if isinstance(output, str) else json.dumps(output)
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": str(item.get("call_id", "")),
                 "content": text}]})
    return {
        "model": request.get("model"),
        "system": str(request.get("instructions") or ""),
        "messages": messages,
        "tools": [{"name": "Bash"}] if shell_tool(request) else [],
        "stream": True,
        **({"max_tokens": request["max_output_tokens"]} if "max_output_tokens" in request
           else {}),
    }


def _shell_arguments(tool: str, command: str) -> str:
    if tool == "shell":
        return json.dumps({"command": ["bash", "-lc", command]})
    if tool == "exec_command":
        return json.dumps({"cmd": command})
    return json.dumps({"command": command})


def output_items(blocks: Sequence[Block], tool: str | None) -> list[dict[str, Any]]:
    """The brain's answer as Responses output items."""
    items: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, Text):
            items.append({"type": "message", "id": f"msg_fake{next(_ids):06d}",
                          "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": block.text,
                                       "annotations": []}]})
        elif tool is not None:
            command = str(block.input.get("command", ""))
            items.append({"type": "function_call", "id": f"fc_fake{next(_ids):06d}",
                          "call_id": f"call_fake{next(_ids):06d}", "name": tool,
                          "status": "completed",
                          "arguments": _shell_arguments(tool, command)})
    return items


def _sse(data: Mapping[str, Any]) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def sse_events(response_id: str, model: str, items: Sequence[Mapping[str, Any]],
               prompt_size: int) -> list[bytes]:
    """The event stream the Responses API sends for ``items``, in its order."""
    base = {"id": response_id, "object": "response", "created_at": int(time.time()),
            "model": model, "output": []}
    out = [_sse({"type": "response.created", "response": {**base, "status": "in_progress"}})]
    for index, item in enumerate(items):
        out.append(_sse({"type": "response.output_item.added", "output_index": index,
                         "item": item}))
        if item["type"] == "message":
            text = item["content"][0]["text"]
            out.append(_sse({"type": "response.output_text.delta", "output_index": index,
                             "item_id": item["id"], "content_index": 0, "delta": text}))
        out.append(_sse({"type": "response.output_item.done", "output_index": index,
                         "item": item}))
    out.append(_sse({"type": "response.completed",
                     "response": {**base, "status": "completed", "output": list(items),
                                  "usage": usage_for(items, prompt_size)}}))
    return out


def usage_for(items: Sequence[Mapping[str, Any]], prompt_size: int) -> dict[str, Any]:
    """The ``usage`` an answer of ``items`` to a request of ``prompt_size`` bytes states: a
    token per four bytes, none cached."""
    output_tokens = max(1, len(json.dumps(list(items))) // 4)
    input_tokens = max(1, prompt_size // 4)
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


class FakeOpenAI(LoopbackServer):
    """``with FakeOpenAI(brain) as api: … api.url …`` — a loopback Responses API; point
    Codex at it with ``OPENAI_BASE_URL={api.url}/v1``."""

    name = "fake-openai"

    def __init__(self, brain: Brain, *, host: str = "127.0.0.1",
                 answer_headers: Callable[[], Mapping[str, str]] | None = None) -> None:
        super().__init__(host)
        self.brain = brain
        self.answer_headers = answer_headers
        """Headers of each answer (a ChatGPT plan's usage windows: ``x-codex-primary-*``)."""
        self.requests: list[Recorded] = []
        self.errors: list[str] = []
        self.answers: list[list[Block]] = []
        self.usages: list[dict[str, Any]] = []
        """The ``usage`` each answer to a worker stated, in order."""
        self.probes = 0
        """Answers to ralph-dev's probes of the key's limits (``is_key_probe``)."""
        self._lock = threading.Lock()

    def responses(self) -> list[dict[str, Any]]:
        """Bodies of every ``POST /v1/responses`` so far."""
        with self._lock:
            return [r.body for r in self.requests if r.method == "POST"
                    and r.path == "/v1/responses" and isinstance(r.body, dict)]

    def answered(self, text: str) -> bool:
        with self._lock:
            return any(isinstance(b, Text) and b.text == text for a in self.answers for b in a)

    def _record(self, request: web.Request, body: Any) -> None:
        with self._lock:
            self.requests.append(recorded(request, body, _HIDDEN_HEADERS))

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self._record(request, body)
        if not isinstance(body, dict):
            return web.json_response({"error": {"type": "invalid_request_error",
                                                "message": "body must be JSON"}}, status=400)
        asked = as_messages_request(body)
        blocks = ask_brain(self.brain, asked, self.errors)
        response_id = f"resp_fake{next(_ids):06d}"
        model = str(body.get("model", "fake-model"))
        if any(isinstance(b, Hang) for b in blocks):
            hang = next(b for b in blocks if isinstance(b, Hang))
            return await self._hang(request, hang, response_id, model)
        refused = [b for b in blocks if isinstance(b, Refusal)]
        if refused:
            code = "rate_limit_exceeded" if refused[0].status == 429 else "server_error"
            return web.json_response(
                {"error": {"type": refused[0].error_type, "code": code,
                           "message": refused[0].message, **refused[0].detail}},
                status=refused[0].status, headers=dict(refused[0].headers))
        stream = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
            **(self.answer_headers() if self.answer_headers else {})})
        await stream.prepare(request)
        if any(isinstance(b, Malformed) for b in blocks):
            await stream.write(b"event: response.created\ndata: {not json at all\n\n")
            await stream.write_eof()
            return stream
        answer = [b for b in blocks if isinstance(b, Text | ToolUse)]
        items = output_items(answer, shell_tool(body))
        with self._lock:
            if is_key_probe(asked):  # ralph-dev's, not a worker's: in no session file
                self.probes += 1
            else:
                self.answers.append(answer)
                self.usages.append(usage_for(items, len(raw)))
        for chunk in sse_events(response_id, model, items, len(raw)):
            await stream.write(chunk)
        await stream.write_eof()
        return stream

    async def _hang(self, request: web.Request, hang: Hang, response_id: str,
                    model: str) -> web.StreamResponse:
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                             "Cache-Control": "no-cache"})
        await stream.prepare(request)
        await stream.write(sse_events(response_id, model, [], 0)[0])  # created, then nothing
        await linger(request, hang.seconds)
        return stream

    async def _anything(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self._record(request, raw.decode("utf-8", "replace") if raw else None)
        if request.path.rstrip("/") == "/v1/models":
            return web.json_response({"object": "list", "data": [], "models": []})
        return web.json_response({})

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_route("*", "/{tail:.*}", self._anything)
        return app

"""A scripted stand-in for the Anthropic Messages API, served on loopback.

Used by the tests and by ``ralph-dev demo``: the model is the one part of a
swarm that cannot run here, so it is scripted; everything else is real.

The real Claude Code CLI talks to it (``ANTHROPIC_BASE_URL``), so hooks,
skills, permissions and tool calls run for real while the model's answers are
scripted by a Python "brain". Every request is recorded so a test can assert
on what Claude Code actually sent (system prompt, messages, tools, model).

The server runs on its own event loop in a daemon thread so synchronous tests
(tmux polling with ``retry_until``) can use it without an async fixture.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ralph_dev.core.model import check_identifier
from ralph_dev.devtools.api_faults import Hang, Malformed, Refusal
from ralph_dev.devtools.loopback import LoopbackServer

# --- what a brain answers with ----------------------------------------------------


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class ToolUse:
    name: str
    input: Mapping[str, Any]


Block = Text | ToolUse
Brain = Callable[[dict[str, Any]], Sequence[Block | Refusal | Hang | Malformed]]

_ids = itertools.count(1)


def bash(command: str, description: str = "scripted step") -> ToolUse:
    return ToolUse("Bash", {"command": command, "description": description})


# --- reading a request ------------------------------------------------------------


def _texts(content: Any) -> Iterable[str]:
    """Every piece of text in a message content (strings, text blocks, tool results)."""
    if isinstance(content, str):
        yield content
        return
    if not isinstance(content, list):
        return
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            yield str(block.get("text", ""))
        elif block.get("type") == "tool_result":
            yield from _texts(block.get("content"))
        elif block.get("type") == "tool_use":
            yield json.dumps(block.get("input", {}))


def system_text(request: Mapping[str, Any]) -> str:
    return "\n".join(_texts(request.get("system", "")))


def conversation_text(request: Mapping[str, Any]) -> str:
    """System prompt plus every message's text, for routing and assertions."""
    parts = [system_text(request)]
    for message in request.get("messages", []) or []:
        parts.extend(_texts(message.get("content")))
    return "\n".join(parts)


def tool_names(request: Mapping[str, Any]) -> list[str]:
    return [str(t.get("name")) for t in request.get("tools", []) or [] if isinstance(t, dict)]


def tool_uses_so_far(request: Mapping[str, Any]) -> int:
    """How many assistant turns in the conversation asked for a tool."""
    count = 0
    for message in request.get("messages", []) or []:
        if message.get("role") != "assistant" or not isinstance(message.get("content"), list):
            continue
        if any(isinstance(b, dict) and b.get("type") == "tool_use" for b in message["content"]):
            count += 1
    return count


def tool_results(request: Mapping[str, Any]) -> list[str]:
    """Text of every tool_result in the conversation, oldest first."""
    out: list[str] = []
    for message in request.get("messages", []) or []:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                out.append("\n".join(_texts(block.get("content"))))
    return out


def is_key_probe(request: Mapping[str, Any]) -> bool:
    """ralph-dev's own smallest request for an API key's limits (``adapters.api_probe``:
    one output token of Anthropic's API, 16 of OpenAI's): no worker's conversation."""
    return request.get("max_tokens") in (1, 16) \
        and request.get("messages") == [{"role": "user", "content": "."}]


def is_main_conversation(request: Mapping[str, Any]) -> bool:
    """The worker's own conversation offers Bash; side calls (titles, summaries) do not."""
    return "Bash" in tool_names(request)


# --- ready-made brains --------------------------------------------------------------


Step = Block | Sequence[Block] | Callable[[dict[str, Any]], Sequence[Block]]


@dataclass
class ScriptedWorker:
    """Plays each issue's steps in order, one model turn per step.

    Stateless on purpose: the step to play is the number of tool-using
    assistant turns already in the conversation, so many concurrent sessions
    (one per issue) and Claude Code's own retries all get consistent answers.
    A session is routed to its issue by the first identifier from ``steps``
    found in its conversation. After the last step the worker ends its turn
    with ``final_text``.
    """

    steps: Mapping[str, Sequence[Step]]
    final_text: str = "Finished."
    side_answer: str = "ok"

    def issue_of(self, request: Mapping[str, Any]) -> str | None:
        text = conversation_text(request)
        found = [(text.find(issue), issue) for issue in self.steps if issue in text]
        return min(found)[1] if found else None

    def __call__(self, request: dict[str, Any]) -> Sequence[Block]:
        if not is_main_conversation(request):
            return [Text(self.side_answer)]
        issue = self.issue_of(request)
        if issue is None:
            return [Text("No issue of mine in this conversation.")]
        index = tool_uses_so_far(request)
        steps = self.steps[issue]
        if index >= len(steps):
            return [Text(self.final_text)]
        step = steps[index]
        if callable(step):
            return list(step(request))
        if isinstance(step, Text | ToolUse):
            return [step]
        return list(step)


def demo_brain(key: str) -> Brain:
    """A worker for any issue ``KEY-N``: make one small change, report done, stop (a
    reviewer: read the change, approve it).

    The identifier is taken from the conversation (ralph-dev's prompt names it)
    and checked before it goes into a command, like any text from outside.
    """
    pattern = re.compile(rf"\b({re.escape(key)}-[1-9][0-9]{{0,8}})\b")

    def brain(request: dict[str, Any]) -> Sequence[Block]:
        if not is_main_conversation(request):
            return [Text("ok")]
        found = pattern.search(conversation_text(request))
        if found is None:
            return [Text("No ralph-dev issue in this conversation.")]
        issue = check_identifier(found.group(1))
        steps = [
            bash(f"mkdir -p changes && echo '{issue}: made by a scripted model' "
                 f"> changes/{issue}.txt", "make the change"),
            bash(f"ralph-dev worker done {issue} --summary 'Wrote changes/{issue}.txt.'",
                 "report done"),
        ]
        if "Your role: review." in conversation_text(request):  # read it, approve it
            steps = [
                bash(f"test -s changes/{issue}.txt && cat changes/{issue}.txt",
                     "read the change"),
                bash(f"ralph-dev worker done {issue} --summary 'Reviewed changes/{issue}.txt: "
                     "it says what the issue asks.'", "approve"),
            ]
        index = tool_uses_so_far(request)
        return [steps[index]] if index < len(steps) else [Text(f"{issue} is done.")]

    return brain


def always(text: str) -> Brain:
    return lambda _request: [Text(text)]


# --- the server ---------------------------------------------------------------------


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


_HIDDEN_HEADERS = {"x-api-key", "authorization"}


def recorded(request: web.Request, body: Any, hidden: Collection[str]) -> Recorded:
    """A request as a fake API keeps it: its key's headers (``hidden``) never kept."""
    headers = {k.lower(): v for k, v in request.headers.items() if k.lower() not in hidden}
    return Recorded(request.method, request.path, dict(request.query), body, headers)


def ask_brain(brain: Brain, asked: dict[str, Any], errors: list[str]
              ) -> list[Block | Refusal | Hang | Malformed]:
    """The brain's answer to ``asked``; a broken brain's error is kept in ``errors`` and
    answered as text, so it shows up in the test instead of hanging the CLI."""
    try:
        return list(brain(asked))
    except Exception as exc:  # whatever a test's brain raises is the test's to see
        errors.append(f"{type(exc).__name__}: {exc}")
        return [Text(f"brain error: {exc}")]


async def linger(request: web.Request, seconds: float) -> None:
    """Say nothing for ``seconds``, or until the client goes (a hung API call)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        if request.transport is None or request.transport.is_closing():
            break
        await asyncio.sleep(0.1)


def _message(blocks: Sequence[Block], model: str, prompt_size: int = 40) -> dict[str, Any]:
    """The answer as the API returns it; its ``usage`` is sized like the real API's
    (about 4 bytes per token of the request and of the answer), so a long conversation
    costs more, as it does."""
    content: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, Text):
            content.append({"type": "text", "text": block.text})
        else:
            content.append({
                "type": "tool_use",
                "id": f"toolu_fake{next(_ids):06d}",
                "name": block.name,
                "input": dict(block.input),
            })
    stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    return {
        "id": f"msg_fake{next(_ids):06d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": max(1, prompt_size // 4),
                  "output_tokens": max(1, len(json.dumps(content)) // 4),
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    }


def _sse(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def sse_events(message: Mapping[str, Any]) -> list[bytes]:
    """The event stream the real API sends for ``message``, in the real order."""
    start = dict(message, content=[], stop_reason=None)
    start["usage"] = dict(message["usage"], output_tokens=1)
    out = [_sse("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            out.append(_sse("content_block_start", {
                "type": "content_block_start", "index": index,
                "content_block": {"type": "text", "text": ""}}))
            out.append(_sse("content_block_delta", {
                "type": "content_block_delta", "index": index,
                "delta": {"type": "text_delta", "text": block["text"]}}))
        else:
            out.append(_sse("content_block_start", {
                "type": "content_block_start", "index": index,
                "content_block": {"type": "tool_use", "id": block["id"],
                                  "name": block["name"], "input": {}}}))
            out.append(_sse("content_block_delta", {
                "type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta",
                          "partial_json": json.dumps(block["input"])}}))
        out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    out.append(_sse("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
        "usage": {"output_tokens": message["usage"]["output_tokens"]}}))
    out.append(_sse("message_stop", {"type": "message_stop"}))
    return out


class FakeAnthropic(LoopbackServer):
    """``with FakeAnthropic(brain) as api: … api.url …`` — a loopback Messages API."""

    name = "fake-anthropic"

    def __init__(self, brain: Brain, *, host: str = "127.0.0.1",
                 answer_headers: Callable[[], Mapping[str, str]] | None = None) -> None:
        super().__init__(host)
        self.brain = brain
        self.answer_headers = answer_headers
        """The headers every answer carries besides its content type (as the real API's
        carry its rate-limit windows), asked anew for each answer."""
        self.requests: list[Recorded] = []
        self.errors: list[str] = []
        self.answers: list[list[Block]] = []
        """What the brain answered, one list per ``POST /v1/messages``, in order."""
        self._lock = threading.Lock()

    # -- recorded traffic ----------------------------------------------------------

    def messages(self) -> list[dict[str, Any]]:
        """Bodies of every ``POST /v1/messages`` so far."""
        with self._lock:
            return [r.body for r in self.requests
                    if r.method == "POST" and r.path == "/v1/messages" and isinstance(r.body, dict)]

    def main_messages(self) -> list[dict[str, Any]]:
        return [m for m in self.messages() if is_main_conversation(m)]

    def answered(self, text: str) -> bool:
        """True once the brain has answered with a text block equal to ``text``."""
        with self._lock:
            return any(isinstance(b, Text) and b.text == text for a in self.answers for b in a)

    # -- handlers --------------------------------------------------------------------

    def _record(self, request: web.Request, body: Any) -> None:
        with self._lock:
            self.requests.append(recorded(request, body, _HIDDEN_HEADERS))

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        self._record(request, body)
        if not isinstance(body, dict):
            return web.json_response(
                {"type": "error", "error": {"type": "invalid_request_error",
                                            "message": "body must be JSON"}}, status=400)
        blocks = ask_brain(self.brain, body, self.errors)
        if any(isinstance(b, Hang) for b in blocks):
            return await self._hang(request, next(b for b in blocks if isinstance(b, Hang)))
        if any(isinstance(b, Malformed) for b in blocks):
            if not body.get("stream"):
                return web.Response(text="<html>not an API answer</html>", status=200,
                                    content_type="application/json")
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b"event: message_start\ndata: {not json at all\n\n")
            await response.write_eof()
            return response
        refused = [b for b in blocks if isinstance(b, Refusal)]
        if refused:
            return web.json_response(
                {"type": "error", "error": {"type": refused[0].error_type,
                                            "message": refused[0].message}},
                status=refused[0].status, headers=dict(refused[0].headers))
        answer = [b for b in blocks if isinstance(b, Text | ToolUse)]
        with self._lock:
            self.answers.append(answer)
        message = _message(answer or [Text("")], str(body.get("model", "fake-model")),
                           len(json.dumps(body)))
        extra = dict(self.answer_headers()) if self.answer_headers is not None else {}
        if not body.get("stream"):
            return web.json_response(message, headers=extra)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache", **extra})
        await response.prepare(request)
        for chunk in sse_events(message):
            await response.write(chunk)
        await response.write_eof()
        return response

    async def _hang(self, request: web.Request, hang: Hang) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        start = sse_events(_message([Text("")], "fake-model"))[0]  # message_start only
        await response.write(start)
        await linger(request, hang.seconds)
        return response

    async def _count_tokens(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        self._record(request, body)
        size = len(json.dumps(body)) if body is not None else 0
        return web.json_response({"input_tokens": max(1, size // 4)})

    async def _anything(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        self._record(request, body)
        if request.path.rstrip("/") == "/v1/models":
            return web.json_response({"data": [], "has_more": False})
        return web.json_response({})

    # -- lifecycle ---------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_route("*", "/{tail:.*}", self._anything)
        return app


"""A scripted stand-in for the Gemini API (``streamGenerateContent``), served on loopback.

Gemini CLI's half of ``scripted_model``: the real Gemini CLI talks to it
(``GOOGLE_GEMINI_BASE_URL``, plain HTTP on loopback), runs its real shell tool, writes
its real session files, while the answers come from the same Python brains Claude
Code's fake uses. A request's ``contents`` are read as the Messages-shaped request
those brains know (``systemInstruction`` as the system prompt, ``functionCall`` and
``functionResponse`` parts as tool uses and results, ``run_shell_command`` offered as
``Bash``), and a brain's ``bash(...)`` step goes back as a ``run_shell_command`` call.
Faults (``api_faults``) answer as Google's API refuses: a JSON ``error`` with its code,
status and ``details`` (``QuotaFailure``, ``ErrorInfo``, ``RetryInfo``), a hang, a
stream that is not one.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
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
    linger,
    recorded,
)

SHELL_TOOL = "run_shell_command"

_HIDDEN_HEADERS = {"x-goog-api-key", "authorization"}


def _offers_shell(request: Mapping[str, Any]) -> bool:
    return any(isinstance(d, dict) and d.get("name") == SHELL_TOOL
               for tool in request.get("tools", []) or [] if isinstance(tool, dict)
               for d in tool.get("functionDeclarations", []) or [])


def _part_block(part: Mapping[str, Any]) -> dict[str, Any] | None:
    if isinstance(part.get("text"), str) and not part.get("thought"):
        return {"type": "text", "text": part["text"]}
    call = part.get("functionCall")
    if isinstance(call, dict):
        args = call["args"] if isinstance(call.get("args"), dict) else {}
        return {"type": "tool_use", "id": str(call.get("id", "")), "name": "Bash",
                "input": {"command": str(args.get("command", ""))}}
    answer = part.get("functionResponse")
    if isinstance(answer, dict):
        said = answer.get("response")
        text = said.get("output", json.dumps(said)) if isinstance(said, dict) else str(said)
        return {"type": "tool_result", "tool_use_id": str(answer.get("id", "")),
                "content": str(text)}
    return None


def as_messages_request(request: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The Gemini request as the Messages-shaped request the brains read."""
    messages: list[dict[str, Any]] = []
    for content in request.get("contents", []) or []:
        if not isinstance(content, dict):
            continue
        blocks = [b for p in content.get("parts", []) or [] if isinstance(p, dict)
                  and (b := _part_block(p)) is not None]
        if blocks:
            role = "assistant" if content.get("role") == "model" else "user"
            messages.append({"role": role, "content": blocks})
    system = request.get("systemInstruction")
    parts = system.get("parts", []) if isinstance(system, dict) else []
    return {
        "model": model,
        "system": "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, dict)),
        "messages": messages,
        "tools": [{"name": "Bash"}] if _offers_shell(request) else [],
        "stream": True,
    }


def answer_parts(blocks: Sequence[Block], shell: bool) -> list[dict[str, Any]]:
    """The brain's answer as the parts of the model's content."""
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, Text):
            parts.append({"text": block.text})
        elif shell:
            parts.append({"functionCall": {"name": SHELL_TOOL, "args": {
                "command": str(block.input.get("command", "")),
                "description": str(block.input.get("description", ""))}}})
    return parts


def usage_for(parts: Sequence[Mapping[str, Any]], prompt_size: int) -> dict[str, int]:
    """The ``usageMetadata`` an answer of ``parts`` to a request of ``prompt_size`` bytes
    states: a token per four bytes, none cached."""
    prompt = max(1, prompt_size // 4)
    answer = max(1, len(json.dumps(list(parts))) // 4)
    return {"promptTokenCount": prompt, "candidatesTokenCount": answer,
            "totalTokenCount": prompt + answer}


def refusal_body(refusal: Refusal) -> dict[str, Any]:
    """A refusal as Google's APIs say one: ``{"error": {code, message, status, details}}``
    (``error_type`` is the status, e.g. ``RESOURCE_EXHAUSTED``)."""
    return {"error": {"code": refusal.status, "message": refusal.message,
                      "status": refusal.error_type, **refusal.detail}}


class FakeGemini(LoopbackServer):
    """``with FakeGemini(brain) as api: … api.url …`` — a loopback Gemini API; point Gemini
    CLI at it with ``GOOGLE_GEMINI_BASE_URL={api.url}``."""

    name = "fake-gemini"

    def __init__(self, brain: Brain, *, host: str = "127.0.0.1") -> None:
        super().__init__(host)
        self.brain = brain
        self.requests: list[Recorded] = []
        self.errors: list[str] = []
        self.answers: list[list[Block]] = []
        self.usages: list[dict[str, int]] = []
        """The ``usageMetadata`` each answer stated, in order."""
        self._lock = threading.Lock()

    def generations(self) -> list[dict[str, Any]]:
        """Bodies of every ``streamGenerateContent`` so far."""
        with self._lock:
            return [r.body for r in self.requests if r.method == "POST"
                    and r.path.endswith(":streamGenerateContent") and isinstance(r.body, dict)]

    def models(self) -> list[str]:
        """The model each ``streamGenerateContent`` asked for (its path names it)."""
        with self._lock:
            return [r.path.rsplit("/", 1)[-1].split(":", 1)[0] for r in self.requests
                    if r.path.endswith(":streamGenerateContent")]

    def _record(self, request: web.Request, body: Any) -> None:
        with self._lock:
            self.requests.append(recorded(request, body, _HIDDEN_HEADERS))

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self._record(request, body)
        if not isinstance(body, dict):
            return web.json_response({"error": {"code": 400, "status": "INVALID_ARGUMENT",
                                                "message": "body must be JSON"}}, status=400)
        model = request.match_info["model"]
        blocks = ask_brain(self.brain, as_messages_request(body, model), self.errors)
        refused = [b for b in blocks if isinstance(b, Refusal)]
        if refused:
            return web.json_response(refusal_body(refused[0]), status=refused[0].status,
                                     headers=dict(refused[0].headers))
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                             "Cache-Control": "no-cache"})
        await stream.prepare(request)
        hang = next((b for b in blocks if isinstance(b, Hang)), None)
        if hang is not None:
            await linger(request, hang.seconds)
            return stream
        if any(isinstance(b, Malformed) for b in blocks):
            await stream.write(b"data: {not json at all\r\n\r\n")
            await stream.write_eof()
            return stream
        answer = [b for b in blocks if isinstance(b, Text | ToolUse)]
        parts = answer_parts(answer, _offers_shell(body))
        usage = usage_for(parts, len(raw))
        with self._lock:
            self.answers.append(answer)
            self.usages.append(usage)
        chunk = {"candidates": [{"content": {"role": "model", "parts": parts},
                                 "finishReason": "STOP", "index": 0}],
                 "usageMetadata": usage, "modelVersion": model}
        await stream.write(f"data: {json.dumps(chunk)}\r\n\r\n".encode())
        await stream.write_eof()
        return stream

    async def _anything(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self._record(request, raw.decode("utf-8", "replace") if raw else None)
        if request.path.endswith(":countTokens"):
            return web.json_response({"totalTokens": max(1, len(raw) // 4)})
        return web.json_response({})

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/{version}/models/{model}:streamGenerateContent", self._generate)
        app.router.add_route("*", "/{tail:.*}", self._anything)
        return app

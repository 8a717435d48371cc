"""Tool calls (OpenAI's ``tools`` / ``tool_choice``) through a chat template, decoded under a
grammar so that every call parses and its arguments keep to the tool's JSON schema.

Two ways a template speaks tools:

- ``hermes``: the template renders ``tools`` itself and the model writes
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen 2.5 and 3, Hermes, SmolLM3 and
  the many templates that follow them; found by the template naming ``<tool_call>``);
- ``generic`` (any other template): the tools are described in the system message and the answer
  is one JSON object, ``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` or
  ``{"response": ...}`` (llama.cpp's generic format for templates without tool support).

Torch-free; the grammar needs ``llguidance``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from edgeattn.runtime.constrained import JSON_LAYOUT
from edgeattn.runtime.exported_model import InputError

#: the most tools one request may describe
MAX_TOOLS = 128
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
#: calls laid out as every JSON answer is (", " and ": " between items, no newlines): fewer tokens, no runaway indents
COMPACT = {"x-guidance": JSON_LAYOUT}


@dataclass(frozen=True)
class Tool:
    """One function a model may call: its name, description and the JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]

    def spec(self) -> dict[str, Any]:
        """As OpenAI's ``tools`` entries write it (what templates are handed)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}  # fmt: skip

    def call_schema(self) -> dict[str, Any]:
        """The JSON schema of one call of this tool."""
        return {"type": "object", "properties": {"name": {"const": self.name}, "arguments": self.parameters},
                "required": ["name", "arguments"], "additionalProperties": False}  # fmt: skip


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]
    id: str = ""

    def openai(self) -> dict[str, Any]:
        """As OpenAI's ``message.tool_calls`` entries write it (arguments as a JSON string)."""
        arguments = json.dumps(self.arguments, ensure_ascii=False)
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": arguments}}


def read_tools(tools: Any) -> list[Tool]:
    """The ``tools`` field of a request (``[{"type": "function", "function": {"name", "description",
    "parameters"}}]``) checked; InputError naming what is wrong."""
    if not isinstance(tools, list) or not 0 < len(tools) <= MAX_TOOLS:
        raise InputError(f"tools is a list of 1 to {MAX_TOOLS} function tools")
    read: list[Tool] = []
    for i, entry in enumerate(tools):
        function = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or entry.get("type") != "function" or not isinstance(function, dict):
            raise InputError(f"tools[{i}] is {{'type': 'function', 'function': {{'name': ...}}}}")
        name = function.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise InputError(f"tools[{i}].function.name is a name of 1 to 64 characters")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise InputError(f"tools[{i}].function.parameters is a JSON schema (an object)")
        description = function.get("description", "")
        if not isinstance(description, str):
            raise InputError(f"tools[{i}].function.description is a string")
        read.append(Tool(name, description, parameters))
    names = [t.name for t in read]
    if len(set(names)) != len(names):
        raise InputError("tools holds two functions of the same name")
    return read


def read_choice(choice: Any, tools: list[Tool]) -> tuple[str, list[Tool]]:
    """``tool_choice`` (``"none"``, ``"auto"``, ``"required"`` or ``{"type": "function",
    "function": {"name": ...}}``) as a mode (none / auto / required) and the tools it allows."""
    if choice is None:
        return "auto", tools
    if choice in ("none", "auto", "required"):
        return choice, tools
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str) or (isinstance(choice, dict) and choice.get("type") != "function"):
        raise InputError("tool_choice is 'none', 'auto', 'required' or {'type': 'function', 'function': "
                         "{'name': ...}}")  # fmt: skip
    chosen = [t for t in tools if t.name == name]
    if not chosen:
        raise InputError(f"tool_choice names {name!r}, which is not among the tools")
    return "required", chosen


def template_format(template_source: str) -> str:
    """How a chat template speaks tools: ``hermes`` or ``generic``."""
    return "hermes" if HERMES_OPEN in template_source and "tools" in template_source else "generic"


@dataclass(frozen=True)
class ToolUse:
    """What a request's tools ask of one chat: the tools offered, the mode (``auto``: the model
    may answer or call; ``required``: it calls), whether several calls are allowed, the template's
    format, and the answer's own schema (``response_format``) when it answers."""

    tools: list[Tool]
    mode: str
    parallel: bool
    format: str
    response_schema: dict[str, Any] | None = None

    # ---------------------------------------------------------------- prompt
    def messages(self, conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation as the template is given it: earlier calls and their results in the
        format's words, and (``generic``) the tools described in the system message."""
        shown = history(self.format, conversation)
        if self.format == "hermes":
            return shown
        described = self._describe()
        if shown and shown[0]["role"] == "system":
            return [{**shown[0], "content": f"{shown[0]['content']}\n\n{described}"}, *shown[1:]]
        return [{"role": "system", "content": described}, *shown]

    def template_tools(self) -> list[dict[str, Any]] | None:
        """What the template's ``tools`` variable holds (hermes: the tools; generic: none)."""
        return [t.spec() for t in self.tools] if self.format == "hermes" else None

    def _describe(self) -> str:
        listed = json.dumps([t.spec()["function"] for t in self.tools], ensure_ascii=False)
        call = '{"tool_calls": [{"name": "<tool name>", "arguments": {<its arguments>}}]}'
        offer = f"You can call these tools to answer: {listed}\n\nTo call tools, answer with JSON: {call}"
        direct = '; to answer directly, with JSON: {"response": <your answer>}'
        return offer if self.mode == "required" else offer + direct


    # --------------------------------------------------------------- grammar
    def _calls_schema(self) -> dict[str, Any]:
        one = {"anyOf": [t.call_schema() for t in self.tools]} if len(self.tools) > 1 else self.tools[0].call_schema()
        return {"type": "array", "items": one, "minItems": 1, **({} if self.parallel else {"maxItems": 1})}

    def grammar(self) -> tuple[str, str]:
        """The answer's grammar: (``"json_schema"``, schema text) or (``"lark"``, grammar text)."""
        if self.format == "generic":
            calls = {"type": "object", "properties": {"tool_calls": self._calls_schema()},
                     "required": ["tool_calls"], "additionalProperties": False}  # fmt: skip
            if self.mode == "required":
                return "json_schema", json.dumps({**calls, **COMPACT})
            answer = {"type": "object", "properties": {"response": self.response_schema or {"type": "string"}},
                      "required": ["response"], "additionalProperties": False}  # fmt: skip
            return "json_schema", json.dumps({"anyOf": [calls, answer], **COMPACT})
        one = {"anyOf": [t.call_schema() for t in self.tools]} if len(self.tools) > 1 else self.tools[0].call_schema()
        one = {**one, **COMPACT}
        rules = [f"call: {json.dumps(HERMES_OPEN)} \"\\n\" %json {json.dumps(one)} \"\\n\" {json.dumps(HERMES_CLOSE)}",
                 "calls: call (\"\\n\" call)*" if self.parallel else "calls: call"]  # fmt: skip
        if self.mode == "required":
            return "lark", "\n".join(["start: calls", *rules])
        text = f"%json {json.dumps(self.response_schema)}" if self.response_schema else "/[^<](.|\\n)*/"
        return "lark", "\n".join(["start: calls | text", *rules, f"text: {text}"])

    # ---------------------------------------------------------------- answer
    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """An answer as (content, calls): the calls it made (each with a new id) and its text
        besides. A generic answer cut short (a length limit) is its text as it came; a hermes call
        cut short is left out."""
        if self.format == "generic":
            try:
                answer = json.loads(text)
            except json.JSONDecodeError:
                return text, []
            if isinstance(answer, dict) and isinstance(answer.get("tool_calls"), list):
                return None, [_call(c) for c in answer["tool_calls"]]
            if isinstance(answer, dict) and "response" in answer:
                response = answer["response"]
                return (response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)), []
            return text, []
        calls, rest = [], text
        while HERMES_OPEN in rest and HERMES_CLOSE in rest.split(HERMES_OPEN, 1)[1]:
            before, after = rest.split(HERMES_OPEN, 1)
            inner, rest = after.split(HERMES_CLOSE, 1)
            try:
                calls.append(_call(json.loads(inner)))
            except (json.JSONDecodeError, InputError):
                return text, []
            rest = before + rest
        if HERMES_OPEN in rest:  # a call cut short (a length limit): not text
            rest = rest.split(HERMES_OPEN, 1)[0]
        stripped = rest.rstrip()
        for cut in range(len(HERMES_OPEN) - 1, 0, -1):  # ... nor the start of one
            if stripped.endswith(HERMES_OPEN[:cut]):
                rest = stripped[:-cut]
                break
        content = rest.strip()
        return content or None, calls

    def may_be_call(self, text: str) -> bool:
        """Whether an answer beginning ``text`` may still become calls (its text is held back)."""
        if self.format == "generic" or self.mode == "required":
            return True
        stripped = text.lstrip()
        return not stripped or HERMES_OPEN.startswith(stripped[: len(HERMES_OPEN)])


def history(format: str, conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation's earlier tool calls and results as a template of ``format`` is given them:
    hermes templates take them as they are (arguments as objects); generic ones as the JSON the
    model was asked to write, and results as ``tool`` messages."""
    shown = []
    for message in conversation:
        calls = message.get("tool_calls")
        if format == "hermes":
            if calls:  # templates take arguments as objects; OpenAI's clients send JSON strings
                message = {**message, "content": message.get("content") or "",
                           "tool_calls": [{**c, "function": {**c["function"], "arguments": _arguments(c)}}
                                          for c in calls]}  # fmt: skip
        elif calls:
            text = json.dumps({"tool_calls": [{"name": c["function"]["name"], "arguments": _arguments(c)}
                                              for c in calls]}, ensure_ascii=False)  # fmt: skip
            message = {"role": "assistant", "content": text}
        elif message["role"] == "tool":
            message = {"role": "tool", "content": message.get("content") or ""}
        shown.append(message)
    return shown


def _arguments(call: dict[str, Any]) -> Any:
    arguments = call.get("function", {}).get("arguments", {})
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
    return arguments


def _call(entry: Any) -> ToolCall:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise InputError("a tool call names its tool")
    arguments = entry.get("arguments", {})
    return ToolCall(entry["name"], arguments if isinstance(arguments, dict) else {"value": arguments},
                    "call_" + uuid.uuid4().hex[:24])  # fmt: skip


def tool_use(template_source: str, tools: Any, choice: Any = None, parallel: Any = True,
             response_schema: dict[str, Any] | None = None) -> ToolUse | None:  # fmt: skip
    """A request's tool fields read against its model's chat template; None when no tool may be
    called (no tools, or ``tool_choice`` ``"none"``)."""
    if tools in (None, []):
        if choice not in (None, "none", "auto"):
            raise InputError("tool_choice names a tool but no tools are given")
        return None
    read = read_tools(tools)
    mode, allowed = read_choice(choice, read)
    if mode == "none":
        return None
    if not isinstance(parallel, bool):
        raise InputError("parallel_tool_calls is true or false")
    return ToolUse(allowed, mode, parallel, template_format(template_source), response_schema)

"""A Hugging Face folder's chat template, rendered as ``transformers``' ``apply_chat_template``
renders it, in a sandbox.

A chat template is Jinja code written by the folder's author: it is rendered in Jinja's immutable
sandbox (no attribute of Python's internals, no mutation of the messages, no file: there is no
loader to include one from), with what ``transformers`` gives templates (``trim_blocks`` and
``lstrip_blocks``, the loop controls, ``raise_exception``, ``strftime_now``, a ``tojson`` that
keeps non-ASCII text, the folder's special tokens by name) and a bound on what it may write.
Anything a template does that the sandbox refuses, or that the template itself raises, is one
:class:`ChatTemplateError` naming the folder.

The template is read as ``transformers`` reads it: ``chat_template.jinja``, else
``chat_template.json``, else ``tokenizer_config.json``'s ``chat_template`` (a string, or named
templates of which ``default`` is used); the special tokens from ``tokenizer_config.json`` and
``special_tokens_map.json``. Torch-free: needs ``jinja2`` (the ``text`` extra).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.jsonfile import read_json_object

#: Files a folder keeps its template in, in the order ``transformers`` looks.
TEMPLATE_FILE, TEMPLATE_JSON, TOKENIZER_CONFIG, SPECIAL_TOKENS = (
    "chat_template.jinja", "chat_template.json", "tokenizer_config.json", "special_tokens_map.json",
)  # fmt: skip
#: The special tokens ``transformers`` hands a template by name.
TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: The most characters a rendered conversation may have (a template that loops to fill memory stops here).
MAX_RENDERED = 4_000_000


class ChatTemplateError(EdgeattnError):
    """A chat template that cannot be read, or that fails or is refused while it renders."""


def _token(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string, or an AddedToken's dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    return read_json_object(path, ChatTemplateError)


def _named(value: Any, where: Path) -> str:
    """The template of a ``chat_template`` value: a string, or named templates (``default`` used)."""
    if isinstance(value, list):  # [{"name": ..., "template": ...}, ...]
        value = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
    if isinstance(value, dict):
        value = value.get("default")
    if not isinstance(value, str):
        raise ChatTemplateError(f"{where} has no usable chat template (a string, or named ones with a 'default')")
    return value


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template and the special tokens it is rendered with."""

    source: str
    special_tokens: dict[str, Any] = field(default_factory=dict)
    #: where it came from, for messages
    origin: str = "the chat template"

    def save(self, path: str | Path) -> None:
        """Write the template and its special tokens as one JSON file (an export's copy)."""
        data = {"chat_template": self.source, "special_tokens": self.special_tokens}
        Path(path).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> ChatTemplate:
        """A template :meth:`save` wrote."""
        path = Path(path)
        data = _read_json(path)
        tokens = data.get("special_tokens", {})
        if not isinstance(data.get("chat_template"), str) or not isinstance(tokens, dict):
            raise ChatTemplateError(f"{path} holds no chat template (a 'chat_template' string and 'special_tokens')")
        return cls(data["chat_template"], tokens, origin=f"the chat template in {path}")

    @cached_property
    def _compiled(self) -> Any:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        class Sandbox(ImmutableSandboxedEnvironment):
            """Jinja's immutable sandbox, refusing an unsafe attribute at once (Jinja would render it
            as an empty string and refuse only what is then done with it)."""

            def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
                raise jinja2.exceptions.SecurityError(
                    f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
                )

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
                   sort_keys: bool = False) -> str:  # fmt: skip
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return env.from_string(self.source)
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"{self.origin} is not a valid Jinja template: {exc}") from exc

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False, *,
               tools: list[dict[str, Any]] | None = None, documents: list[dict[str, Any]] | None = None,
               **kwargs: Any) -> str:  # fmt: skip
        """The conversation as the model's prompt text (what ``apply_chat_template(...,
        tokenize=False)`` returns); ``add_generation_prompt`` opens the assistant's turn."""
        import jinja2

        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ChatTemplateError("messages must be a list of {'role': ..., 'content': ...} dicts")
        context = {**self.special_tokens, **kwargs, "messages": messages, "tools": tools, "documents": documents,
                   "add_generation_prompt": add_generation_prompt}  # fmt: skip
        pieces: list[str] = []
        size = 0
        try:
            for piece in self._compiled.generate(**context):
                size += len(piece)
                if size > MAX_RENDERED:
                    raise ChatTemplateError(f"{self.origin} wrote over {MAX_RENDERED:,} characters; it was stopped")
                pieces.append(piece)
        except jinja2.exceptions.SecurityError as exc:
            raise ChatTemplateError(f"{self.origin} was refused by the sandbox: {exc}") from exc
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"{self.origin} failed: {exc}") from exc
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError, RecursionError) as exc:
            raise ChatTemplateError(f"{self.origin} failed: {type(exc).__name__}: {exc}") from exc
        return "".join(pieces)


def load_chat_template(folder: str | Path) -> ChatTemplate | None:
    """The chat template of a Hugging Face folder, with its special tokens; None when it has none."""
    folder = Path(folder)
    config_path = folder / TOKENIZER_CONFIG
    config = _read_json(config_path) if config_path.is_file() else {}
    if (folder / TEMPLATE_FILE).is_file():
        path = folder / TEMPLATE_FILE
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ChatTemplateError(f"{path} is not readable text: {exc}") from exc
    elif (folder / TEMPLATE_JSON).is_file():
        path = folder / TEMPLATE_JSON
        source = _named(_read_json(path).get("chat_template"), path)
    elif config.get("chat_template") is not None:
        path = config_path
        source = _named(config["chat_template"], path)
    else:
        return None
    tokens: dict[str, Any] = {}
    special_path = folder / SPECIAL_TOKENS
    for data in (_read_json(special_path) if special_path.is_file() else {}, config):  # the config wins
        for name in TOKEN_NAMES:
            if (token := _token(data.get(name))) is not None:
                tokens[name] = token
        extra = data.get("additional_special_tokens")
        if isinstance(extra, list):
            tokens["additional_special_tokens"] = [t for t in map(_token, extra) if t is not None]
    return ChatTemplate(source, tokens, origin=f"the chat template of {path}")

"""A served model's task: the tensors a client sends and gets back, and the answers to a batch of
requests, shared by the Triton repository's Python-backend model and ``edgeattn serve``.

Every task takes ``text`` (strings, one per row; the batch axis is Triton's). What comes back
depends on the task (:func:`task_of`): labels and probabilities (classify), entities as JSON
(tag), pooled vectors (embed), token vectors (encode), or the answer and its tokens (generate
and complete, with optional decoding settings as extra inputs; a language model's ``chat`` flag
takes each text as a conversation, JSON messages or one user message, and ``stop`` as stop
strings). Requests are answered together in one call of the model where their settings agree; a
request that fails is answered with its own error and the others still get theirs. Torch-free
(numpy + the runtime).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeattn.errors import EdgeattnError
from edgeattn.runtime.families import all_tasks, family_of, resolve, task_family
from edgeattn.runtime.text import label_names

log = logging.getLogger(__name__)

TASKS = all_tasks()

#: numpy dtype name -> Triton data type
TRITON_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "int64": "TYPE_INT64", "int32": "TYPE_INT32",
                "bool": "TYPE_BOOL", "bytes": "TYPE_STRING"}  # fmt: skip


@dataclass(frozen=True)
class ServedTensor:
    """One input or output of a served task: name, numpy dtype name (``bytes`` for strings), the
    shape of one row (-1 where it varies), and whether a request may leave it out."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    optional: bool = False

    @property
    def triton_type(self) -> str:
        return TRITON_TYPES[self.dtype]


#: Decoding settings a generate request may send, with their types.
GENERATION_INPUTS = (
    ServedTensor("max_new_tokens", "int32", (1,), True),
    ServedTensor("strategy", "bytes", (1,), True),
    ServedTensor("num_beams", "int32", (1,), True),
    ServedTensor("temperature", "float32", (1,), True),
    ServedTensor("top_k", "int32", (1,), True),
    ServedTensor("top_p", "float32", (1,), True),
    ServedTensor("seed", "int64", (1,), True),
    ServedTensor("repetition_penalty", "float32", (1,), True),
)

#: What a language model's request may send besides: whether each text is a conversation (JSON
#: messages, or one user message rendered by the chat template), and stop strings (a JSON list, or
#: one string).
COMPLETION_INPUTS = (
    ServedTensor("chat", "bool", (1,), True),
    ServedTensor("stop", "bytes", (1,), True),
)

#: The tasks that generate, and the settings their requests may send.
_SETTINGS = {"generate": GENERATION_INPUTS, "complete": GENERATION_INPUTS + COMPLETION_INPUTS}


#: the tasks a served model can do
_SERVED = ("generate", "complete", "classify", "tag", "embed", "encode")


def own_task(task: str) -> Any | None:
    """The served task a family answers itself (its record's ``served``), or None for a text task."""
    try:
        family = task_family(task)
    except EdgeattnError:
        return None
    return None if family.served is None else resolve(family.served)


def task_of(config: Any, task: str | None = None, recorded: str | None = None) -> str:
    """The served task of a model: ``task`` when given and the model can do it, else the task its
    export recorded (``recorded``, when it is one of :data:`TASKS`), else what its head says
    (generate for encoder-decoders, classify / tag for sequence / token heads, else embed)."""
    task = task or (recorded if recorded in TASKS else None)
    family = family_of(config)
    if family.served is not None:
        served = resolve(family.served).name
        if task not in (None, "", served, *family.tasks):  # its one served task answers each of its tasks
            raise EdgeattnError(f"this model cannot serve task {task!r}; it serves {served}")
        return str(served)
    natural = (next(iter(family.tasks)) if len(family.tasks) == 1 else "classify" if config.head == "sequence"
               else "tag" if config.head == "token" else "embed")  # fmt: skip
    if natural not in _SERVED:
        raise EdgeattnError(f"serving a {family.name} export ({natural}) is not built; run it with edgeattn run or "
                            "edgeattn.runtime.load")  # fmt: skip
    if task in (None, "", natural):
        return natural
    possible = {"generate": {"generate"}, "complete": {"complete"}, "classify": {"classify", "encode"},
                "tag": {"tag", "encode"}, "embed": {"embed", "encode"}}[natural]  # fmt: skip
    if task not in possible:
        raise EdgeattnError(f"this model cannot serve task {task!r}; it serves {', '.join(sorted(possible))}")
    return task


def task_inputs(task: str) -> tuple[ServedTensor, ...]:
    """What a request of ``task`` sends."""
    own = own_task(task)
    if own is not None:
        return tuple(own.inputs)
    return (ServedTensor("text", "bytes", (1,)), *_SETTINGS.get(task, ()))


def task_outputs(task: str, config: Any) -> tuple[ServedTensor, ...]:
    """What a request of ``task`` gets back (one row per text)."""
    own = own_task(task)
    if own is not None:
        return tuple(own.outputs(config))
    d = config.d_model
    return {
        "classify": (ServedTensor("label", "bytes", (1,)), ServedTensor("score", "float32", (1,)),
                     ServedTensor("probabilities", "float32", (config.num_labels,))),
        "tag": (ServedTensor("entities", "bytes", (1,)),),
        "embed": (ServedTensor("embedding", "float32", (d,)),),
        "encode": (ServedTensor("last_hidden_state", "float32", (-1, d)),
                   ServedTensor("attention_mask", "int64", (-1,))),
        "generate": (ServedTensor("answer", "bytes", (1,)), ServedTensor("tokens", "int64", (-1,))),
        "complete": (ServedTensor("answer", "bytes", (1,)), ServedTensor("tokens", "int64", (-1,))),
    }[task]  # fmt: skip


def generates(task: str) -> bool:
    """Whether ``task`` generates text (its requests may carry decoding settings; it can stream)."""
    return task in _SETTINGS


# ------------------------------------------------------------------------------------- requests
def request_texts(inputs: dict[str, np.ndarray]) -> list[str]:
    """The texts of one request (``text`` of shape (rows,) or (rows, 1), bytes or str)."""
    if "text" not in inputs:
        raise EdgeattnError("the request has no 'text' input")
    values = np.asarray(inputs["text"], dtype=object).reshape(-1)
    if values.size == 0:
        raise EdgeattnError("the request's 'text' input is empty")
    out = []
    for v in values:
        if isinstance(v, bytes | np.bytes_):
            try:
                v = bytes(v).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise EdgeattnError(f"'text' is not UTF-8 (byte {exc.object[exc.start]:#04x})") from exc
        if not isinstance(v, str):
            raise EdgeattnError(f"'text' must hold strings, not {type(v).__name__}")
        out.append(v)
    return out


def generation_options(inputs: dict[str, np.ndarray], task: str = "generate") -> dict[str, Any]:
    """The decoding settings a request of ``task`` sent (scalars; the first row's where it sends several)."""
    options = request_settings(inputs, _SETTINGS[task])
    if "stop" in options:
        options["stop"] = stop_strings(options["stop"])
    return options


def request_settings(inputs: dict[str, np.ndarray], tensors: Sequence[ServedTensor]) -> dict[str, Any]:
    """The settings among ``tensors`` a request sent, as Python scalars (the first row's where it
    sends several)."""
    options: dict[str, Any] = {}
    for t in tensors:
        if t.name not in inputs:
            continue
        value = np.asarray(inputs[t.name]).reshape(-1)
        if value.size == 0:
            raise EdgeattnError(f"the request's {t.name!r} input is empty")
        item = value[0]
        if t.dtype == "bytes":
            options[t.name] = item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
        elif t.dtype == "bool":
            options[t.name] = bool(item)
        elif t.dtype.startswith("float"):
            options[t.name] = float(item)
        else:
            options[t.name] = int(item)
    return options


def stop_strings(value: str) -> list[str]:
    """A request's ``stop``: a JSON list of strings, or one string as it is."""
    text = value.strip()
    if text.startswith("["):
        try:
            found = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EdgeattnError(f"'stop' looks like a JSON list but is not one: {exc}") from exc
        if not all(isinstance(s, str) for s in found):
            raise EdgeattnError("'stop' must be a JSON list of strings")
        return [s for s in found if s]
    return [value] if value else []


def conversation(text: str) -> list[dict[str, Any]]:
    """A chat request's text as a conversation: JSON messages (``[{"role": ..., "content": ...}]``),
    or any other text as one user message."""
    if text.lstrip().startswith("["):
        try:
            messages = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EdgeattnError(f"a chat text that starts with '[' must be JSON messages: {exc}") from exc
        if not messages or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise EdgeattnError('chat messages must be a non-empty JSON list of {"role": ..., "content": ...}')
        return messages
    return [{"role": "user", "content": text}]


def decoding(options: dict[str, Any]) -> tuple[int | None, dict[str, Any]]:
    """(max_new_tokens, the runtime's generation options) from a request's settings, without the
    settings its strategy does not use."""
    options = dict(options)
    steps = options.pop("max_new_tokens", None)
    if options.get("strategy") != "beam":
        options.pop("num_beams", None)
    if options.get("strategy") != "sample":
        for key in ("temperature", "top_k", "top_p", "seed"):
            options.pop(key, None)
    return steps, options


def prompts(texts: list[str], options: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """A generating request's prompts (conversations where it set ``chat``) and the rest of its options."""
    options = dict(options)
    if options.pop("chat", False):
        return [conversation(t) for t in texts], options
    return list(texts), options


def each_alone(one: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], requests: list[dict[str, np.ndarray]]
               ) -> list[dict[str, np.ndarray] | Exception]:  # fmt: skip
    """``one(request)`` of each request in turn, or the error that request alone caused."""
    results: list[dict[str, np.ndarray] | Exception] = []
    for request in requests:
        try:
            results.append(one(request))
        except (EdgeattnError, ValueError) as exc:
            results.append(exc)
    return results


def strings(values: Sequence[str]) -> np.ndarray:
    """Strings as a Triton string tensor, one a row."""
    return np.array([v.encode("utf-8") for v in values], dtype=np.object_).reshape(-1, 1)


def answer_texts(model: Any, task: str, texts: list[str], options: dict[str, Any]) -> dict[str, np.ndarray]:
    """The task's outputs for ``texts`` (one row each) in one call of the model."""
    if task == "classify":
        found = model.classify(texts)
        labels = label_names(model.labels, model.config.num_labels)
        return {
            "label": strings([c.label for c in found]),
            "score": np.array([[c.score] for c in found], np.float32),
            "probabilities": np.array([[c.scores[name] for name in labels] for c in found], np.float32),
        }
    if task == "tag":
        found = model.tag(texts)
        return {"entities": strings([json.dumps([e.to_dict() for e in row]) for row in found])}
    if task == "embed":
        return {"embedding": np.asarray(model.embed(texts), np.float32)}
    if task == "encode":
        batch = model.text_batch(texts)
        hidden = model.encode(batch.ids, batch.mask, batch.type_ids if model.config.token_types else None)
        return {"last_hidden_state": hidden, "attention_mask": batch.mask}
    steps, options = decoding(options)
    asked, options = prompts(texts, options)
    found = model.generate_answers(asked, steps, **options)
    width = max(len(tokens) for _, tokens in found)
    rows = np.full((len(found), width), model.config.pad_id, np.int64)
    for i, (_, tokens) in enumerate(found):
        rows[i, : len(tokens)] = tokens
    return {"answer": strings([text for text, _ in found]), "tokens": rows}


def _trim_encoded(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Token vectors of one request cut to its longest text (the padding its batch-mates added removed)."""
    width = int(outputs["attention_mask"].sum(axis=1).max())
    return {"last_hidden_state": outputs["last_hidden_state"][:, :width],
            "attention_mask": outputs["attention_mask"][:, :width]}  # fmt: skip


def answer(model: Any, task: str, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray] | Exception]:
    """Each request's outputs (or the error that request alone caused), answering requests with the
    same decoding settings in one call of the model."""
    own = own_task(task)
    if own is not None:
        return list(own.answer(model, requests))
    results: list[dict[str, np.ndarray] | Exception] = [EdgeattnError("not answered")] * len(requests)
    groups: dict[str, list[tuple[int, list[str]]]] = {}
    settings: dict[str, dict[str, Any]] = {}
    for i, request in enumerate(requests):
        try:
            texts = request_texts(request)
            options = generation_options(request, task) if generates(task) else {}
        except EdgeattnError as exc:
            results[i] = exc
            continue
        key = json.dumps(options, sort_keys=True)
        settings[key] = options
        groups.setdefault(key, []).append((i, texts))
    for key, members in groups.items():
        try:
            _answer_group(model, task, members, settings[key], results)
        except (EdgeattnError, ValueError) as exc:
            if len(members) == 1:
                results[members[0][0]] = exc
                continue
            log.debug("a batch of %d requests failed (%s); answering each alone", len(members), exc)
            for member in members:  # only the request at fault fails
                try:
                    _answer_group(model, task, [member], settings[key], results)
                except (EdgeattnError, ValueError) as one:
                    results[member[0]] = one
    return results


def _answer_group(model: Any, task: str, members: list[tuple[int, list[str]]], options: dict[str, Any],
                  results: list[Any]) -> None:  # fmt: skip
    texts = [t for _, request_texts_ in members for t in request_texts_]
    outputs = answer_texts(model, task, texts, options)
    start = 0
    for index, request_texts_ in members:
        rows = slice(start, start + len(request_texts_))
        start = rows.stop
        own = {name: value[rows] for name, value in outputs.items()}
        if task == "encode":
            own = _trim_encoded(own)
        elif generates(task):
            own["tokens"] = _trim_tokens(own["tokens"], model.config.pad_id)
        results[index] = own


def _trim_tokens(tokens: np.ndarray, pad_id: int) -> np.ndarray:
    """A request's generated tokens without the padding columns only its batch-mates needed."""
    used = [int(np.flatnonzero(row != pad_id).max()) + 1 if (row != pad_id).any() else 0 for row in tokens]
    return tokens[:, : max(used)]

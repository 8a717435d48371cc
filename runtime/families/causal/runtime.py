"""The decoder-only family's runtime: prompts and chats in, tokens and text out, over the exported
``causal_decoder`` graph.

A prompt batch (rows of different lengths, padded on either side) runs through the graph in one
call, then one token a row a step, over a cache of fixed capacity: one buffer per layer of prompt
+ ``max_new_tokens`` slots, allocated once and bound as both the graph's cache input and its
updated-cache output, so each call writes its keys and values in place (:class:`CausalState`).
Greedy, sampling (temperature, top-k, top-p, seed), beam search and a repetition penalty come from
:mod:`edgeattn.runtime.generate`; generation stops at any of the model's stop ids and, for text,
at stop strings. :meth:`CausalRuntime.chat` renders a conversation with the export's chat
template (sandboxed, :mod:`edgeattn.runtime.families.causal.chat`); a :class:`Conversation` keeps its cache
between turns and feeds only what a turn adds. Torch-free: numpy and onnxruntime (and
``tokenizers`` / ``jinja2`` for text).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from edgeattn.config import ModelConfig
from edgeattn.errors import EdgeattnError
from edgeattn.runtime.exported_model import ExportedModel, InputError, input_dtype
from edgeattn.runtime.families.causal.chat import ChatTemplate, ChatTemplateError
from edgeattn.runtime.generate import GenerationConfig, prompt_seen, stream_tokens
from edgeattn.runtime.layout import TOKENIZER
from edgeattn.runtime.slot_cache import LOGITS, SlotCache, cache_contract
from edgeattn.runtime.specs import LOGITS_AT, POSITION, POSITION_IDS, SLOT_CACHE, cache_names
from edgeattn.runtime.text_generation import TokenGeneration, answer_pieces
from edgeattn.runtime.tokenizer import TextTokenizer

#: the family's one graph (see the family record in edgeattn.runtime.families)
CAUSAL_DECODER = "causal_decoder"


def causal_contract(n_layers: int) -> dict[str, Any]:
    """The graph and feed names of decoding as a bundle carries them to the JS module (which types
    none of them): what :class:`CausalState` feeds the ``causal_decoder`` graph."""
    return {"decoder": {"graph": CAUSAL_DECODER, "ids": "input_ids", "mask": "attention_mask",
                        "positions": POSITION_IDS, "position": POSITION, "logits_at": LOGITS_AT, "logits": LOGITS,
                        "cache": cache_contract(n_layers)}}  # fmt: skip


#: Given a prompt's logits after each of its tokens as a chunk of it is read: (the chunk's first
#: column, logits (rows, columns, vocab)), valid during the call only
PromptLogits = Callable[[int, np.ndarray], None]

#: New tokens when none are asked for: a completion's, a chat answer's
DEFAULT_NEW_TOKENS, DEFAULT_CHAT_TOKENS = 64, 256


class CausalState:
    """Decoding state of a prompt batch over the ``causal_decoder`` graph (a
    :class:`~edgeattn.runtime.generate.Stepper`).

    The prompt runs at construction; the first :meth:`step` returns its next-token logits (the
    tokens it is given, the search's start tokens, stand for the prompt), each later one feeds one
    token a row. Every layer's cache is one buffer of ``capacity`` slots bound as the graph's cache
    input and its updated output: the graph writes each call's keys and values into it in place.
    ``attention_mask`` marks which slots hold real tokens, so a row padded on either side answers
    as it would alone. On the CPU the buffers are numpy arrays the session writes into; on a device
    they stay there and only ids, masks and logits cross.
    """

    def __init__(self, model: CausalRuntime, ids: np.ndarray, mask: np.ndarray, repeat: int = 1,
                 capacity: int | None = None, prompt_logits: PromptLogits | None = None) -> None:  # fmt: skip
        if repeat > 1:
            ids, mask = np.repeat(ids, repeat, axis=0), np.repeat(mask, repeat, axis=0)
        self.model = model
        self.session = model.sessions[CAUSAL_DECODER]
        self.rows = ids.shape[0]
        self.capacity = capacity or ids.shape[1]
        if self.capacity < ids.shape[1]:
            raise InputError(f"a cache of {self.capacity} slots cannot hold a prompt of {ids.shape[1]} tokens")
        self.on_host = model.device == "cpu"
        #: the next slot written, and each row's next token position (its real tokens so far)
        self.position = 0
        self.next_position = np.zeros(self.rows, dtype=np.int64)
        self._allocate(self.capacity)
        self.prompt_ids, self.prompt_mask = ids, mask
        self._pending: np.ndarray | None = self.feed(ids, mask, prompt_logits)

    # ------------------------------------------------------------------ cache
    def _allocate(self, capacity: int, keep: int = 0) -> None:
        """Buffers of ``capacity`` slots (the first ``keep`` copied from the current ones), bound."""
        c = self.model.config.section
        assert c is not None
        names = cache_names(SLOT_CACHE, c.n_layers)
        dtype = input_dtype(self.session, names[0])  # float16 for an fp16 graph
        # zeros, not garbage: unwritten slots are masked, but a NaN there would still reach the sums
        arrays = {n: np.zeros((self.rows, c.n_kv_heads, capacity, c.dim), dtype) for n in names}
        slots = np.zeros((self.rows, capacity), dtype=np.int64)
        if keep:
            for name, array in self.cache.arrays().items():
                arrays[name][:, :, :keep] = array[:, :, :keep]
            slots[:, :keep] = self.slots[:, :keep]
        self.capacity, self.slots = capacity, slots
        self.cache = SlotCache(arrays, self.model.device)
        self.binding = self.session.io_binding()
        self.cache.bind(self.binding)
        self._logits_width = 1  # the tokens a run's logits are picked at, as last bound

    @property
    def host(self) -> dict[str, np.ndarray]:
        """The caches as numpy arrays over the bound memory (on the CPU; empty on a device)."""
        return self.cache.host

    def reserve(self, slots: int) -> None:
        """Room for ``slots`` more tokens: the cache grows (its filled slots copied) when it lacks
        them, up to the model's ``max_len``."""
        needed = self.position + slots
        if needed <= self.capacity:
            return
        limit = self.model.config.max_len
        if needed > limit:
            raise InputError(f"{needed} tokens would not fit: this model attends over at most {limit} (max_len)")
        self._allocate(min(limit, max(needed, 2 * self.capacity)), keep=self.position)

    # --------------------------------------------------------------- decoding
    def feed(self, ids: np.ndarray, mask: np.ndarray | None = None, every: PromptLogits | None = None) -> np.ndarray:
        """Run ``ids`` (rows, T) after what the cache holds (``mask`` marks padding in them; every
        row needs a real token); returns each row's next-token logits after its last real token.
        A longer run than the runtime's ``prefill_chunk`` tokens (counted over the rows) goes in
        chunks. ``every(column, logits)`` is given each chunk's logits after every one of its
        tokens, (rows, columns, vocab) from ``column`` of ``ids`` on: teacher forcing as the
        prompt is read."""
        rows, t = ids.shape
        if rows != self.rows:
            raise InputError(f"this state has {self.rows} rows, got {rows}")
        mask = np.ones_like(ids) if mask is None else mask
        self.reserve(t)
        total = self.model.prefill_chunk  # tokens a run, counted over the rows
        chunk = total and max(1, total // rows)  # columns a run
        if chunk and t > chunk:
            last = (mask * np.arange(t)).argmax(axis=1)  # each row's last real token
            logits = self._feed(ids[:, :chunk], mask[:, :chunk], every, 0)
            for start in range(chunk, t, chunk):
                part = self._feed(ids[:, start : start + chunk], mask[:, start : start + chunk], every, start)
                here = last >= start  # rows whose last real token is in this chunk or a later one
                logits[here] = part[here]
            return logits
        return self._feed(ids, mask, every, 0)

    def _feed(self, ids: np.ndarray, mask: np.ndarray, every: PromptLogits | None = None, column: int = 0
              ) -> np.ndarray:  # fmt: skip
        t = ids.shape[1]
        start = self.position
        self.slots[:, start : start + t] = mask
        positions = self.next_position[:, None] + np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        last = (mask * np.arange(t)).argmax(axis=1)[:, None]  # each row's last real token
        picked = last if every is None else np.tile(np.arange(t), (self.rows, 1))
        if picked.shape[1] != self._logits_width:  # a bound output keeps its last shape: bound afresh
            self.cache.bind(self.binding)
            self._logits_width = picked.shape[1]
        feeds = {"input_ids": ids, "attention_mask": self.slots, POSITION_IDS: positions,
                 POSITION: np.array([start], dtype=np.int64), LOGITS_AT: picked}  # fmt: skip
        for name, value in feeds.items():
            self.binding.bind_cpu_input(name, np.ascontiguousarray(value, dtype=np.int64))
        self.session.run_with_iobinding(self.binding)
        self.position += t
        self.next_position += mask.sum(axis=1)
        logits = self.binding.get_outputs()[0].numpy()
        if every is not None:
            every(column, logits)
            logits = np.take_along_axis(logits, last[:, :, None], axis=1)
        # a copy: the bound output's memory is the session's to reuse at the next call
        return np.array(logits[:, 0])

    def step(self, tokens: np.ndarray) -> np.ndarray:
        if self._pending is not None:  # the prompt's logits stand for the start tokens'
            logits, self._pending = self._pending, None
            return logits
        return self.feed(np.asarray(tokens, dtype=np.int64).reshape(self.rows, 1))

    def reorder(self, index: np.ndarray) -> None:
        if np.array_equal(index, np.arange(self.rows)):
            return
        self.slots[:] = self.slots[index]
        self.next_position = self.next_position[index]
        self.cache.reorder(index)

    def rewind(self, position: int) -> None:
        """Forget every slot from ``position`` on (a batch of one: its positions count from the start)."""
        if not 0 <= position <= self.position:
            raise InputError(f"position {position} is outside the {self.position} slots written")
        self.slots[:, position:] = 0
        self.position = position
        self.next_position = self.slots[:, :position].sum(axis=1)
        self._pending = None

    def seen(self) -> np.ndarray:
        """(rows, vocab) True for every token of each row's prompt (where a repetition penalty starts)."""
        return prompt_seen(self.prompt_ids, self.prompt_mask, self.model.config.vocab_size)

    def place(self, row: int, other: CausalState, r: int) -> bool:
        """Row ``row`` becomes row ``r`` of ``other`` (a running batch's row taken over by a prompt
        run alone): ``other``'s filled slots copied to the front of the row, the rest of it masked;
        the next :meth:`step` feeds it a token as every other row. False, with nothing changed,
        where they would not fit before the slot written next (then merge instead), or a cache
        is not on the host."""
        filled = np.flatnonzero(other.slots[r, : other.position])
        if len(filled) > self.position or not (self.on_host and other.on_host):
            return False
        for name, array in self.host.items():
            array[row, :, : len(filled)] = other.host[name][r][:, filled]
        self.slots[row] = 0
        self.slots[row, : len(filled)] = 1
        self.next_position[row] = other.next_position[r]
        return True

    @classmethod
    def merged(cls, model: CausalRuntime, rows: Sequence[tuple[CausalState, int]], room: int = 0) -> CausalState:
        """A state whose row i is row ``r`` of state ``s`` for each ``(s, r)`` of ``rows`` (a
        running batch that rows join and leave): each row's filled slots copied to the front in
        order, ``room`` free slots after the longest (fewer where the model's max_len ends first).
        The next :meth:`step` feeds a token a row.
        On the CPU (the caches are host arrays)."""
        if not rows:
            raise InputError("a merged state needs at least one row")
        if any(not s.on_host for s, _ in rows):
            raise InputError("rows are merged on the CPU; this state keeps its cache on a device")
        filled = [np.flatnonzero(s.slots[r, : s.position]) for s, r in rows]
        width = max(len(f) for f in filled)
        state = cls.__new__(cls)
        state.model, state.session = model, model.sessions[CAUSAL_DECODER]
        state.rows, state.on_host, state.position = len(rows), True, width
        state.next_position = np.array([s.next_position[r] for s, r in rows], dtype=np.int64)
        if width >= model.config.max_len:
            raise InputError(f"a row of {width} tokens leaves no room: this model attends over at most "
                             f"{model.config.max_len} (max_len)")  # fmt: skip
        state._allocate(min(model.config.max_len, width + max(room, 1)))  # the room, within max_len
        for i, ((s, r), slots) in enumerate(zip(rows, filled, strict=True)):
            for name, array in state.host.items():
                array[i, :, : len(slots)] = s.host[name][r][:, slots]
            state.slots[i, : len(slots)] = 1
        state.prompt_ids = np.zeros((state.rows, 1), np.int64)
        state.prompt_mask = np.zeros_like(state.prompt_ids)
        state._pending = None
        return state


class CausalRuntime(TokenGeneration, ExportedModel):
    """A decoder-only language model's export (GPT-2, Llama, Qwen, Phi-3): generate and stream
    tokens or text for prompts, chat with the export's chat template."""

    #: a longer prompt (or conversation turn) runs in chunks of this many tokens counted over the
    #: rows (a batch of 4: 32 columns a run; 0: whole): the activations of a whole prompt grow the
    #: session's arena for good (docs/language-models.md: the prompt in chunks)
    prefill_chunk: int = 128

    def _attached(self) -> None:
        manifest = self.manifest
        ids = manifest.stop_ids if manifest is not None and manifest.stop_ids else [self.config.eos_id]
        #: the tokens that end a row (a chat model may have several: end of text, end of turn)
        self.stop_ids: list[int] = list(ids)
        self.chat_template: ChatTemplate | None = None
        if manifest is not None and manifest.chat_template is not None and self.export_dir is not None:
            from edgeattn.runtime.manifest import check_file

            self.chat_template = ChatTemplate.load(check_file(self.export_dir, manifest.chat_template))

    # ------------------------------------------------------------- generation
    def state(self, input_ids: np.ndarray, attention_mask: np.ndarray, repeat: int = 1,
              capacity: int | None = None, prompt_logits: PromptLogits | None = None) -> CausalState:  # fmt: skip
        """A decoding state for checked prompts: the prompt runs here, into a cache of ``capacity``
        slots (default: the prompt's width), its logits after every token given to
        ``prompt_logits`` as they are made (see :meth:`CausalState.feed`)."""
        return CausalState(self, input_ids, attention_mask, repeat, capacity, prompt_logits)

    #: what benchmarks and the seq2seq-shaped helpers call a decoding state
    stepper = state

    def _decoding(self, input_ids: Any, attention_mask: Any, max_new_tokens: int, strategy: str,
                  eos_id: int | Sequence[int] | None, options: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        """Checked settings and prompts as the keyword arguments of the search functions."""
        if CAUSAL_DECODER not in self.sessions:
            raise EdgeattnError(f"generation needs the {CAUSAL_DECODER} graph, which this export lacks")
        options = dict(options)
        schema, regex = options.pop("json_schema", None), options.pop("regex", None)
        prompt_logits = options.pop("prompt_logits", None)
        cfg = self.generation_config(max_new_tokens, strategy, options)
        if prompt_logits is not None and cfg.strategy == "beam":
            raise InputError("prompt_logits reads the prompt once; beam search repeats it for every beam")
        ids, mask = self.check_source(input_ids, attention_mask)
        capacity = ids.shape[1] + cfg.max_new_tokens
        if capacity > self.config.max_len:
            raise InputError(f"a prompt of {ids.shape[1]} tokens and {cfg.max_new_tokens} new ones exceed the "
                             f"model's max_len {self.config.max_len}")  # fmt: skip
        c = self.config

        def make(n: int) -> Any:
            return self.state(ids, mask, n, capacity=capacity, prompt_logits=prompt_logits)

        if schema is not None or regex is not None:  # every row's answer decoded under its grammar
            from edgeattn.runtime.constrained import Constrained, Constraint

            if schema is not None and regex is not None:
                raise InputError("give json_schema or regex, not both")
            if cfg.strategy == "beam":
                raise InputError("a grammar constrains greedy and sampled decoding, not beam search")
            plain = make

            def make(n: int) -> Any:
                grammars = [Constraint.json_schema(self, schema) if schema is not None
                            else Constraint.regex(self, regex) for _ in range(ids.shape[0] * n)]  # fmt: skip
                return Constrained(plain(n), grammars, self.stop_ids)

        return {
            "make": make,
            "batch": ids.shape[0],
            "bos_id": c.bos_id,  # stands for the prompt: the state answers the first step from it
            "eos_id": self.stop_ids if eos_id is None else eos_id,
            "pad_id": c.pad_id,
            "cfg": cfg,
        }

    def next_token_logits(self, input_ids: Any, attention_mask: Any = None) -> np.ndarray:
        """(B, T, vocab) logits after every token of each prompt (teacher forcing; the gate's and
        perplexity's measure), in one call."""
        ids, mask = self.check_source(input_ids, attention_mask)
        return self.run(CAUSAL_DECODER, forced_feeds(self.config, ids, mask))["logits"]

    # ------------------------------------------------------------------- text
    def _tokenizer(self) -> TextTokenizer:
        if not isinstance(self.tokenizer, TextTokenizer):
            where = self.export_dir or "this model"
            raise EdgeattnError(f"{where} has no Hugging Face {TOKENIZER}; pass token ids to generate() instead")
        return self.tokenizer

    def encode_prompts(self, prompts: Any, special_tokens: bool = True, room: int = 0, truncate: bool = False
                       ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """(ids, mask) of prompts through the export's tokenizer, padded on the left, each with
        ``room`` for new tokens within the model's max_len (else an error, or with ``truncate``
        the prompt's last tokens). A prompt is a text, or a conversation (a list of ``{"role": ...,
        "content": ...}`` messages) rendered by the chat template, whose markup carries its own
        special tokens."""
        tokenizer = self._tokenizer()
        if isinstance(prompts, list | tuple) and not prompts:
            raise InputError("give at least one prompt")
        rows = _rows(prompts)
        for p in rows:
            if not isinstance(p, str) and not is_conversation(p):
                raise InputError(f"a prompt is a text or a list of messages ({{'role': ..., 'content': ...}}), not "
                                 f"{type(p).__name__}")  # fmt: skip
        encoded = [tokenizer.encode(self.render_chat(p), False) if is_conversation(p)
                   else tokenizer.encode(p, special_tokens) for p in rows]  # fmt: skip
        if any(not e for e in encoded):
            raise InputError("a prompt encodes to no tokens; give it some text")
        limit = self.config.max_len - room
        if limit < 1:
            raise InputError(f"{room} new tokens leave no room for a prompt: this model takes {self.config.max_len} "
                             "tokens in all (max_len)")
        if truncate:
            encoded = [e[-limit:] for e in encoded]
        width = max(len(e) for e in encoded)
        if width > limit:
            raise InputError(f"a prompt is {width} tokens long; with {room} new ones this model takes at most "
                             f"{limit} (max_len {self.config.max_len}); shorten it or truncate")  # fmt: skip
        ids = np.full((len(encoded), width), self.config.pad_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, e in enumerate(encoded):
            ids[i, width - len(e) :] = e
            mask[i, width - len(e) :] = 1
        return ids, mask

    def generate_text(self, prompts: Any, max_new_tokens: int | None = None, *, stop: Sequence[str] = (),
                      truncate: bool = False, **options: Any) -> list[str]:  # fmt: skip
        """The continuation of each prompt (one string or a list), as text: up to a stop token, or
        up to (not including) the first of the ``stop`` strings; ``max_new_tokens`` defaults to
        64. A prompt longer than the model takes is an error unless ``truncate`` (its last
        tokens are kept)."""
        return [text for text, _ in self.generate_answers(prompts, max_new_tokens, stop=stop, truncate=truncate,
                                                           **options)]  # fmt: skip

    def generate_answers(self, prompts: Any, max_new_tokens: int | None = None, *, stop: Sequence[str] = (),
                         truncate: bool = False, **options: Any) -> list[tuple[str, np.ndarray]]:  # fmt: skip
        """As :meth:`generate_text`, with each answer's tokens (up to, not including, a stop
        token; up to the one that completed a stop string). Prompts may be texts or
        conversations (see :meth:`encode_prompts`), mixed in one batch; ``max_new_tokens``
        defaults to 64, or 256 where a conversation is among them."""
        steps = max_new_tokens or self._default_steps(
            DEFAULT_CHAT_TOKENS if any(is_conversation(p) for p in _rows(prompts)) else DEFAULT_NEW_TOKENS)
        ids, mask = self.encode_prompts(prompts, room=steps, truncate=truncate)
        return self._answers(self._tokenizer(), ids, mask, steps, stop, options)

    def stream_text(self, prompt: str | list[dict[str, Any]], max_new_tokens: int | None = None, *,
                    stop: Sequence[str] = (), truncate: bool = False, **options: Any) -> Iterator[str]:  # fmt: skip
        """The continuation of one prompt (a text or a conversation) as it grows: each piece is
        what the tokens so far add to the decoded text (a piece that could be the start of a stop
        string waits), so the pieces join to :meth:`generate_text`'s answer."""
        chat = is_conversation(prompt)
        steps = max_new_tokens or self._default_steps(DEFAULT_CHAT_TOKENS if chat else DEFAULT_NEW_TOKENS)
        ids, mask = self.encode_prompts([prompt], room=steps, truncate=truncate)
        yield from self._pieces(self._tokenizer(), ids, mask, steps, stop, options)

    def _default_steps(self, wanted: int) -> int:
        """New tokens when none are asked for: ``wanted``, within half the model's max_len."""
        return max(1, min(wanted, self.config.max_len // 2))

    # ------------------------------------------------------------------- chat
    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The conversation as the model's prompt text, by the export's chat template."""
        if self.chat_template is None:
            raise ChatTemplateError(f"{self.export_dir or 'this model'} has no chat template; use generate_text")
        return self.chat_template.render(messages, add_generation_prompt, **kwargs)

    def chat(self, messages: list[dict[str, Any]], max_new_tokens: int | None = None, *, stop: Sequence[str] = (),
             **options: Any) -> str:  # fmt: skip
        """The assistant's answer to a conversation (``[{"role": ..., "content": ...}, ...]``), at
        most ``max_new_tokens`` (default 256) tokens."""
        return self.generate_answers([messages], max_new_tokens, stop=stop, **options)[0][0]

    def stream_chat(self, messages: list[dict[str, Any]], max_new_tokens: int | None = None, *,
                    stop: Sequence[str] = (), **options: Any) -> Iterator[str]:  # fmt: skip
        """:meth:`chat`'s answer as it grows (see :meth:`stream_text`)."""
        yield from self.stream_text(messages, max_new_tokens, stop=stop, **options)

    def conversation(self, system: str | None = None) -> Conversation:
        """A conversation that keeps its messages and its cache between turns."""
        return Conversation(self, system)


class Conversation:
    """A chat that keeps its messages and its decoding state: each turn renders the whole
    conversation by the chat template, keeps the cached tokens it still begins with, and runs only
    what the turn adds (the new message, the template's markup) before answering."""

    def __init__(self, model: CausalRuntime, system: str | None = None) -> None:
        self.model = model
        self.messages: list[dict[str, Any]] = [] if system is None else [{"role": "system", "content": system}]
        self.state: CausalState | None = None
        #: the tokens the cache holds, slot by slot
        self.cached: list[int] = []
        #: tokens the last turn ran through the graph (the rest came from the cache)
        self.fed = 0

    def say(self, text: str, max_new_tokens: int | None = None, **options: Any) -> Iterator[str]:
        """Add the user's message and stream the assistant's answer (greedy or sampled, at most
        ``max_new_tokens``, default 256); the answer joins the conversation once it is complete."""
        model = self.model
        max_new_tokens = max_new_tokens or model._default_steps(DEFAULT_CHAT_TOKENS)
        cfg = GenerationConfig(max_new_tokens=max_new_tokens, **options)
        if cfg.strategy == "beam":
            raise InputError("a conversation streams greedy or sampled answers; beam search is for generate()")
        messages = [*self.messages, {"role": "user", "content": text}]
        prompt = model.render_chat(messages)
        ids = model.encode_prompts([prompt], special_tokens=False, room=max_new_tokens)[0][0].tolist()
        keep = 0
        while keep < min(len(ids), len(self.cached)) and ids[keep] == self.cached[keep]:
            keep += 1
        keep = min(keep, len(ids) - 1)  # at least one token runs, to give the next token's logits
        if self.state is None:
            first = np.array([ids], dtype=np.int64)
            self.state = model.state(first, np.ones_like(first), capacity=len(ids) + max_new_tokens)
            logits = self.state.step(first[:, -1])
        else:
            self.state.rewind(keep)
            self.state.reserve(len(ids) - keep + max_new_tokens)
            logits = self.state.feed(np.array([ids[keep:]], dtype=np.int64))
        self.fed = len(ids) - keep
        self.cached = list(ids)
        answer: list[int] = []
        turn = _Turn(self, logits, answer)
        steps = stream_tokens(lambda n: turn, 1, model.config.bos_id, model.stop_ids, model.config.pad_id, cfg)
        yield from answer_pieces(model._tokenizer(), (tokens for tokens, _ in steps), model.stop_ids)
        self.messages = [*messages, {"role": "assistant", "content": model._tokenizer().decode(answer)}]


class _Turn:
    """A conversation's state as a stepper for one answer: the first step's logits are the turn's
    (already run), each later token is fed and joins the cached tokens and the answer."""

    def __init__(self, conversation: Conversation, logits: np.ndarray, answer: list[int]) -> None:
        self.conversation, self.logits, self.answer = conversation, logits, answer

    def step(self, tokens: np.ndarray) -> np.ndarray:
        if self.logits is not None:
            logits, self.logits = self.logits, None
            return logits
        state = self.conversation.state
        assert state is not None
        token = int(tokens[0])
        self.answer.append(token)
        self.conversation.cached.append(token)
        return state.feed(np.array([[token]], dtype=np.int64))

    def reorder(self, index: np.ndarray) -> None:  # one row: nothing to reorder
        pass

    def seen(self) -> np.ndarray:
        """Every token of the conversation so far (where a repetition penalty starts)."""
        seen = np.zeros((1, self.conversation.model.config.vocab_size), dtype=bool)
        seen[0, self.conversation.cached] = True
        return seen


def is_conversation(prompt: Any) -> bool:
    """Whether a prompt is a conversation (a list of message dicts) rather than a text."""
    return isinstance(prompt, list | tuple) and bool(prompt) and all(isinstance(m, dict) for m in prompt)


def _rows(prompts: Any) -> list[Any]:
    """The prompts of a batch: one text or one conversation is a batch of one."""
    return [prompts] if isinstance(prompts, str) or is_conversation(prompts) else list(prompts)


def forced_feeds(config: ModelConfig, ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """The ``causal_decoder`` feeds of whole prompts (B, T) into an empty cache as wide as they are,
    every token's logits picked: teacher forcing."""
    c = config.section
    assert c is not None, "a decoder-only config has its causal section"
    b, t = ids.shape
    zeros = np.zeros((b, c.n_kv_heads, t, c.dim), np.float32)
    return {"input_ids": ids, "attention_mask": mask, POSITION_IDS: np.maximum(np.cumsum(mask, 1) - 1, 0),
            POSITION: np.zeros(1, np.int64), LOGITS_AT: np.tile(np.arange(t), (b, 1)),
            **{n: zeros for n in cache_names(SLOT_CACHE, c.n_layers)}}  # fmt: skip

"""The seq2seq family's calibration and gate hooks for its cross keys and values and its decoder
steps (teacher-forced on the eager model's own continuation)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from edgeattn.config import ModelConfig
from edgeattn.exporters.gate import Reference, cosine_metrics
from edgeattn.families.seq2seq.model import Seq2SeqTransformer
from edgeattn.model import TransformerModel
from edgeattn.runtime.exported_model import ExportedModel
from edgeattn.runtime.specs import POSITION, SLOT_CACHE, GraphSpec, cache_names


def cross_kv_calibration(model: TransformerModel, spec: GraphSpec, ids: np.ndarray, mask: np.ndarray,
                         rng: np.random.Generator, new_tokens: int) -> dict[str, np.ndarray]:  # fmt: skip
    """The eager encoder's hidden states of the source."""
    with torch.no_grad():
        hidden = model.encode(torch.from_numpy(ids), torch.from_numpy(mask))
    return {"encoder_hidden_states": hidden.numpy()}

def decoder_calibration(model: TransformerModel, spec: GraphSpec, ids: np.ndarray, mask: np.ndarray,
                        rng: np.random.Generator, new_tokens: int) -> dict[str, np.ndarray]:  # fmt: skip
    """The eager model's own continuation under teacher forcing (in cache slots for a graph that
    takes them)."""
    forced = teacher_forced(model, ids, mask, new_tokens).feeds  # type: ignore[arg-type]
    return slot_feeds(forced, model.config) if POSITION in spec.input_names else forced


def cross_kv_metrics(ref: Seq2SeqReference, runtime: ExportedModel, graph: str) -> dict[str, float]:
    """The worst layer's cross keys' and values' cosine to eager (real source positions)."""
    c = ref.model.config
    got = runtime.run(graph, {"encoder_hidden_states": ref.hidden.numpy()})
    rows = np.repeat(ref.valid[:, None, :], c.n_heads, axis=1)
    worst = {"cosine_mean": 1.0, "cosine_min": 1.0}
    for name, want in ref.cross.items():
        m = cosine_metrics(got[name], want, rows)
        worst = {k: min(worst[k], m[k]) for k in worst}
    return worst

def decoder_metrics(ref: Seq2SeqReference, runtime: ExportedModel, graph: str) -> dict[str, float]:
    """Next-token top-1 agreement under teacher forcing, and the logits' cosine to eager (in cache
    slots for a graph that takes them)."""
    want = ref.forced.logits
    feeds = ref.forced.feeds
    if POSITION in runtime.specs[graph].input_names:
        feeds = slot_feeds(feeds, ref.model.config)
    logits = runtime.run(graph, feeds)["logits"]
    agree = logits.argmax(-1) == want.argmax(-1)
    return {"teacher_top1": float(agree.mean()), **{f"logits_{k}": v for k, v in cosine_metrics(logits, want).items()}}


class Seq2SeqReference(Reference):
    """Eager float32's side of the gate for an encoder-decoder: besides the encoder's states, its
    cross keys and values and its decoder under teacher forcing."""

    @cached_property
    def cross(self) -> dict[str, np.ndarray]:
        """Every decoder layer's cross-attention keys and values, by cross_kv output name."""
        assert isinstance(self.model, Seq2SeqTransformer)
        with torch.no_grad():
            kv = self.model.cross_kv(self.hidden)
        names = cache_names("cross", self.model.config.n_decoder_layers)
        return {n: t.numpy() for n, t in zip(names, (t for pair in kv for t in pair), strict=True)}

    @cached_property
    def forced(self) -> TeacherForced:
        assert isinstance(self.model, Seq2SeqTransformer)
        return teacher_forced(self.model, self.ids, self.mask, self.new_tokens, self.hidden)


@dataclass
class TeacherForced:
    """Decoder inputs under teacher forcing and eager PyTorch's answers to them."""

    feeds: dict[str, np.ndarray]  # the decoder graph's inputs: targets shifted right, empty cache, cross K/V
    cross: dict[str, np.ndarray]  # eager cross-attention keys/values by input name
    logits: np.ndarray  # eager float32 logits for ``feeds``


def teacher_forced(
    model: Seq2SeqTransformer, ids: np.ndarray, mask: np.ndarray, new_tokens: int, hidden: torch.Tensor | None = None
) -> TeacherForced:
    """The eager model's own greedy continuation of each source, fed back as decoder input."""
    c = model.config
    t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)
    with torch.no_grad():
        hidden = model.encode(t_ids, t_mask) if hidden is None else hidden
        cross = model.cross_kv(hidden)
        targets = model.greedy(t_ids, t_mask, new_tokens, stop_at_eos=False)
        dec_in = torch.cat([torch.full_like(targets[:, :1], c.bos_id), targets[:, :-1]], dim=1)
        logits, _ = model.decode(dec_in, cross_kv=cross, memory_mask=t_mask)
    names = cache_names("cross", c.n_decoder_layers)
    cross_np = {n: t.numpy() for n, t in zip(names, (t for kv in cross for t in kv), strict=True)}
    past = {n: np.zeros((ids.shape[0], c.n_heads, 0, c.head_dim), np.float32)
            for n in cache_names("past", c.n_decoder_layers)}  # fmt: skip
    feeds = {"input_ids": dec_in.numpy(), "encoder_attention_mask": mask, **past, **cross_np}
    return TeacherForced(feeds, cross_np, logits.numpy())


def slot_feeds(feeds: dict[str, np.ndarray], config: ModelConfig) -> dict[str, np.ndarray]:
    """The ``decoder_fixed`` graph's inputs for the same step as ``decoder`` feeds with an empty
    cache: every target in slots 0 .. T - 1 of a cache of T slots."""
    rows, t = feeds["input_ids"].shape
    out = {k: v for k, v in feeds.items() if k not in cache_names("past", config.n_decoder_layers)}
    out[POSITION] = np.zeros(1, np.int64)
    for name in cache_names(SLOT_CACHE, config.n_decoder_layers):
        out[name] = np.zeros((rows, config.n_heads, t, config.head_dim), np.float32)
    return out

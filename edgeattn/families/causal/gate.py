"""The causal family's calibration and gate hooks: prompts as calibration, and the gate's per-token
judgement on held-out text (teacher-forced top-1, perplexity kept, loops)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import cached_property

import numpy as np
import torch

from edgeattn.exporters.gate import (
    EAGER_GREEDY_ROWS,
    LOGITS_BYTES,
    RUNTIME_GREEDY_ROWS,
    NextTokens,
    Reference,
    length_groups,
    scored,
    trimmed_rows,
)
from edgeattn.model import TransformerModel
from edgeattn.runtime.exported_model import ExportedModel
from edgeattn.runtime.specs import GraphSpec


def causal_calibration(model: TransformerModel, spec: GraphSpec, ids: np.ndarray, mask: np.ndarray,
                       rng: np.random.Generator, new_tokens: int) -> dict[str, np.ndarray]:  # fmt: skip
    """The prompts themselves, every token's logits, into an empty cache as wide as they are."""
    from edgeattn.runtime.families.causal.runtime import forced_feeds

    return forced_feeds(model.config, ids, mask)


def looped(row: np.ndarray, pad_id: int, longest: int = 8) -> bool:
    """Whether a generated row ends in a loop: its second half repeats with a period of at most
    ``longest`` tokens (a row that stopped early, padded after its end, is judged on what it has)."""
    ends = np.flatnonzero(row == pad_id)
    row = row[: ends[0]] if ends.size else row
    half = len(row) // 2
    if half < 4:
        return False
    tail = row[len(row) - half :]
    return any(np.array_equal(tail[p:], tail[:-p]) for p in range(1, min(longest, half // 2) + 1))

def causal_metrics(ref: CausalReference, runtime: ExportedModel, graph: str) -> dict[str, float]:
    """A decoder-only graph on the held-out text: teacher-forced next-token agreement with eager
    float32, the share of its perplexity kept (float32's perplexity / the graph's: 1 is none lost),
    and the share of greedy continuations that do not fall into a loop float32's does not."""
    want = ref.next_tokens
    got = ref.measured(runtime)
    valid = want.valid
    agree = float((got.top1 == want.top1)[valid].mean())
    kept = float(np.exp(got.logp[valid].mean() - want.logp[valid].mean()))
    pad = ref.model.config.pad_id
    eager = ref.long_greedy
    tokens = ref.generated(runtime, eager.shape[1])
    new_loops = [looped(t, pad) and not looped(e, pad) for t, e in zip(tokens, eager, strict=True)]
    return {"teacher_top1": agree, "perplexity_kept": min(kept, 1.0), "loop_free": 1.0 - float(np.mean(new_loops)),
            "perplexity_ratio": 1.0 / kept}  # fmt: skip


#: ``read(ids, mask, steps, every) -> tokens (rows, <= steps)``: rows read as a prompt, each chunk's
#: logits after every token given to ``every(column, logits)``, then continued greedily ``steps``
Read = Callable[[np.ndarray, np.ndarray, int, Callable[[int, np.ndarray], None]], np.ndarray]


class CausalReference(Reference):
    """Eager float32's side of the gate for a decoder-only model: its answers after every held-out
    token, and greedy continuations twice as long as the generation check's (where loops show),
    whose first steps are that check's.

    Each side reads every held-out row once, as a prompt: the answers after each token are taken
    as it is read, and the rows the generation check continues go on from the same cache, so no
    row is read twice (teacher forcing and the continuations' prompts were separate passes)."""

    @cached_property
    def _eager(self) -> tuple[NextTokens, np.ndarray]:
        vocab = self.model.config.vocab_size

        def read(ids: np.ndarray, mask: np.ndarray, steps: int, every: Callable[[int, np.ndarray], None]
                 ) -> np.ndarray:  # fmt: skip
            columns = max(1, LOGITS_BYTES // (4 * vocab * len(ids)))  # the logits of one call, bounded
            with torch.no_grad():
                return self.model.greedy(torch.from_numpy(ids), torch.from_numpy(mask), steps, prompt_logits=every,
                                         prompt_columns=columns).numpy()  # fmt: skip

        return self._read(read, EAGER_GREEDY_ROWS, "gate: eager float32")

    @cached_property
    def next_tokens(self) -> NextTokens:
        """A decoder-only model's answers after every held-out token (teacher forcing)."""
        return self._eager[0]

    @cached_property
    def long_greedy(self) -> np.ndarray:
        """Greedy continuations of :attr:`generation_rows`, :attr:`long_steps` long."""
        return self._eager[1]

    @property
    def long_steps(self) -> int:
        """Twice the generation check's steps, within the model's max_len."""
        return max(1, min(2 * self.new_tokens, self.model.config.max_len - self.generation_inputs[0].shape[1]))

    @cached_property
    def greedy(self) -> np.ndarray:
        """The first ``new_tokens`` steps of :attr:`long_greedy` (greedy decoding is the same however
        far it goes)."""
        if self.long_greedy.shape[1] >= self.new_tokens:
            return self.long_greedy[:, : self.new_tokens]
        return self._greedy(self.new_tokens)

    def _steps_made(self, steps: int) -> int:
        """A runtime's continuations are made as long as :attr:`long_greedy` at once."""
        return max(steps, self.long_greedy.shape[1]) if steps < 2 * self.new_tokens else steps

    def measured(self, runtime: ExportedModel) -> NextTokens:
        """``runtime``'s answers after every held-out token; its continuations of
        :attr:`generation_rows` made in the same pass are kept for the generation check."""

        def read(ids: np.ndarray, mask: np.ndarray, steps: int, every: Callable[[int, np.ndarray], None]
                 ) -> np.ndarray:  # fmt: skip
            if steps == 0:
                runtime.state(ids, mask, prompt_logits=every)
                return np.zeros((len(ids), 0), np.int64)
            return runtime.generate(ids, mask, steps, prompt_logits=every).tokens

        answers, tokens = self._read(read, RUNTIME_GREEDY_ROWS, f"gate: {runtime.precision}")
        self._generated = {id(runtime): (weakref.ref(runtime), tokens)}
        return answers

    def _read(self, read: Read, rows_per_call: int, desc: str) -> tuple[NextTokens, np.ndarray]:
        """Every held-out row through ``read`` in groups of at most ``rows_per_call`` rows of like
        length: (the answers after every token, the continuations of :attr:`generation_rows`,
        :attr:`long_steps` long)."""
        from tqdm import tqdm

        rows, width = self.ids.shape
        vocab = self.model.config.vocab_size
        top1 = np.zeros((rows, max(width - 1, 0)), np.int64)
        logp = np.zeros((rows, max(width - 1, 0)), np.float64)
        lengths = self.mask.sum(axis=1)
        continued = self.generation_rows
        steps = self.long_steps
        tokens = np.full((len(continued), steps), self.model.config.pad_id, dtype=np.int64)
        others = np.setdiff1d(np.arange(rows), continued)
        groups = [(continued[g], g, steps) for g in length_groups(lengths[continued], rows_per_call)]
        groups += [(others[g], None, 0) for g in length_groups(lengths[others], rows_per_call)]
        bar = tqdm(total=int(lengths.sum()), desc=desc, unit="token", leave=False, disable=not self.progress)
        for group, at, n in groups:
            ids, mask = trimmed_rows(self.ids[group], self.mask[group])

            def every(column: int, logits: np.ndarray, group: np.ndarray = group, ids: np.ndarray = ids) -> None:
                count = min(logits.shape[1], ids.shape[1] - 1 - column)  # the last token has no next one
                if count <= 0:
                    return
                truth = ids[:, column + 1 : column + 1 + count].reshape(-1)
                best, chosen = scored(logits[:, :count].reshape(-1, vocab), truth)
                top1[group, column : column + count] = best.reshape(len(group), count)
                logp[group, column : column + count] = chosen.reshape(len(group), count)

            made = read(ids, mask, n, every)
            if at is not None:
                tokens[at, : made.shape[1]] = made
            bar.update(int(lengths[group].sum()))
        bar.close()
        valid = (self.mask[:, :-1] * self.mask[:, 1:]).astype(bool)
        return NextTokens(top1, logp, valid), tokens

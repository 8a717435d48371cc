"""The causal family's calibration and gate hooks: prompts as calibration, and the gate's per-token
judgement on held-out text (teacher-forced top-1, perplexity kept, loops)."""

from __future__ import annotations

from functools import cached_property

import numpy as np

from edgeattn.exporters.gate import NextTokens, Reference, eager_logits, next_tokens
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
    got = next_tokens(runtime.next_token_logits, ref.ids, ref.mask, ref.model.config.vocab_size,
                      f"gate: {runtime.precision} text", ref.progress)  # fmt: skip
    valid = want.valid
    agree = float((got.top1 == want.top1)[valid].mean())
    kept = float(np.exp(got.logp[valid].mean() - want.logp[valid].mean()))
    pad = ref.model.config.pad_id
    eager = ref.long_greedy
    tokens = ref.generated(runtime, eager.shape[1])
    new_loops = [looped(t, pad) and not looped(e, pad) for t, e in zip(tokens, eager, strict=True)]
    return {"teacher_top1": agree, "perplexity_kept": min(kept, 1.0), "loop_free": 1.0 - float(np.mean(new_loops)),
            "perplexity_ratio": 1.0 / kept}  # fmt: skip


class CausalReference(Reference):
    """Eager float32's side of the gate for a decoder-only model: its answers after every held-out
    token, and greedy continuations twice as long as the generation check's (where loops show),
    whose first steps are that check's."""

    @cached_property
    def next_tokens(self) -> NextTokens:
        """A decoder-only model's answers after every held-out token (teacher forcing)."""
        return next_tokens(lambda ids, mask: eager_logits(self.model, ids, mask), self.ids, self.mask,
                           self.model.config.vocab_size, "gate: eager float32 text", self.progress)  # fmt: skip

    @cached_property
    def long_greedy(self) -> np.ndarray:
        """Greedy continuations of :attr:`generation_rows` twice as long as the generation check's,
        within the model's max_len."""
        steps = max(1, min(2 * self.new_tokens, self.model.config.max_len - self.generation_inputs[0].shape[1]))
        return self._greedy(steps)

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

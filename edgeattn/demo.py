"""The demo model: a small encoder-decoder trained to sort digit strings ("5 2 9 1" -> "1 2 5 9").

The task has an exact answer, so the exported model's output can be checked by eye and its
exact-match accuracy measured. Training is seeded and takes a few minutes on two CPU cores.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from edgeattn.config import get_preset
from edgeattn.families.seq2seq.model import Seq2SeqTransformer
from edgeattn.model import build_model
from edgeattn.runtime.tokenizer import WordTokenizer

log = logging.getLogger(__name__)

SPECIALS = ["<pad>", "<bos>", "<eos>"]
DIGITS = [str(d) for d in range(10)]
MIN_LEN, MAX_LEN = 1, 12
#: Held-out sequences at least this long are never trained on (shorter ones are too few to hold out).
UNSEEN_FROM = 5
DEMO_CONFIG = get_preset("demo")
CHECKPOINT = "demo-sort.safetensors"


def demo_tokenizer() -> WordTokenizer:
    """The demo's tokenizer: three specials and the ten digits."""
    return WordTokenizer(SPECIALS + DIGITS)


def shipped_checkpoint() -> Path:
    """Path of the trained demo checkpoint shipped inside the package."""
    return Path(str(resources.files("edgeattn") / "assets" / CHECKPOINT))


def sample_task(rng: np.random.Generator, n: int) -> list[list[int]]:
    """``n`` random digit sequences (as digits 0-9) of lengths MIN_LEN..MAX_LEN."""
    lengths = rng.integers(MIN_LEN, MAX_LEN + 1, size=n)
    return [rng.integers(0, 10, size=int(k)).tolist() for k in lengths]


def answer(digits: list[int]) -> list[int]:
    """The task's exact answer."""
    return sorted(digits)


def _batch(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Source ids and mask, decoder inputs (BOS + answer) and targets (answer + EOS), padded."""
    off = len(SPECIALS)
    b, s = len(seqs), max(len(x) for x in seqs)
    src = torch.zeros(b, s, dtype=torch.long)
    dec_in = torch.zeros(b, s + 1, dtype=torch.long)
    target = torch.full((b, s + 1), -100, dtype=torch.long)
    for i, seq in enumerate(seqs):
        src[i, : len(seq)] = torch.tensor(seq) + off
        out = [d + off for d in answer(seq)]
        dec_in[i, : len(seq) + 1] = torch.tensor([DEMO_CONFIG.bos_id, *out])
        target[i, : len(seq) + 1] = torch.tensor([*out, DEMO_CONFIG.eos_id])
    return src, (src != 0).long(), dec_in, target


@dataclass
class TrainResult:
    model: Seq2SeqTransformer
    steps: int
    seconds: float
    final_loss: float
    accuracy: float


def exact_match(model: Seq2SeqTransformer, seqs: list[list[int]], batch: int = 256) -> float:
    """Fraction of ``seqs`` whose greedy output is exactly the sorted sequence then EOS."""
    off = len(SPECIALS)
    right = 0
    for i in range(0, len(seqs), batch):
        chunk = seqs[i : i + batch]
        src, mask, _, _ = _batch(chunk)
        out = model.greedy(src, mask, max_new_tokens=MAX_LEN + 1)
        for seq, row in zip(chunk, out.tolist(), strict=True):
            expected = [d + off for d in answer(seq)] + [DEMO_CONFIG.eos_id]
            right += row[: len(expected)] == expected
    return right / len(seqs)


def heldout_set(n: int = 2000, seed: int = 20261129) -> list[list[int]]:
    """The held-out evaluation set (its own seed; training skips its sequences of length >= UNSEEN_FROM)."""
    return sample_task(np.random.default_rng(seed), n)


def heldout_ids(n: int = 200) -> list[list[int]]:
    """The first ``n`` held-out task inputs as token ids (for the accuracy gate)."""
    off = len(SPECIALS)
    return [[d + off for d in seq] for seq in heldout_set()[:n]]


def train_demo(
    steps: int = 2500, batch_size: int = 128, lr: float = 2e-3, seed: int = 0, progress: bool = False
) -> TrainResult:
    """Train the demo model from scratch with fixed seeds; returns it with its held-out accuracy."""
    from tqdm import tqdm

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    heldout = heldout_set()
    banned = {tuple(x) for x in heldout if len(x) >= UNSEEN_FROM}
    model = build_model(DEMO_CONFIG, seed=seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    start = time.perf_counter()
    loss_value = float("nan")
    bar = tqdm(range(steps), desc="train-demo", unit="step", disable=not progress)
    for step in bar:
        seqs = [s for s in sample_task(rng, batch_size) if tuple(s) not in banned]
        src, mask, dec_in, target = _batch(seqs)
        logits = model(src, dec_in, mask)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_value = float(loss.detach())
        if step % 100 == 0:
            bar.set_postfix(loss=f"{loss_value:.4f}")
            log.info("step %d loss %.4f", step, loss_value)
    model.eval()
    seconds = time.perf_counter() - start
    accuracy = exact_match(model, heldout)
    return TrainResult(model, steps, seconds, loss_value, accuracy)

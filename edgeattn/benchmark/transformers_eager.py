"""A Hugging Face folder's model run by ``transformers`` itself: the reference an imported
checkpoint's variants are measured against. Imports nothing but numpy until called (the memory
probe rebuilds it in a fresh process without ONNX Runtime)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np


def task_output(task: str | None) -> str:
    """The output a task's answers are read from: ``logits`` for a classification head."""
    return "logits" if task in ("classify", "tag") else "last_hidden_state"


def load_transformers(folder: str | Path, task: str | None) -> Any:
    """The folder's model in ``transformers``, float32, eager attention, in eval mode."""
    import transformers

    classes = {"classify": transformers.AutoModelForSequenceClassification,
               "tag": transformers.AutoModelForTokenClassification}  # fmt: skip
    cls = classes.get(task or "", transformers.AutoModel)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls.from_pretrained(str(folder), attn_implementation="eager").eval()


def transformers_answer(model: Any, task: str | None) -> Any:
    """``answer(ids, mask)``: the model's task output as numpy."""
    import torch

    name = task_output(task)

    def answer(ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
        return {name: getattr(out, name).numpy()}

    return answer

"""The peer users pick today: a Hugging Face ``BertModel`` of the same size, exported with
``torch.onnx``, fused with ONNX Runtime's transformer optimizer and int8-quantised with
``quantize_dynamic``, as Optimum does. Needs the ``peers`` extra (transformers)."""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from edgeattn.benchmark.latency import Variant
from edgeattn.config import ModelConfig
from edgeattn.host import dynamic_int8_weights, quiet_quantization
from edgeattn.runtime.session import CPU, create_session

log = logging.getLogger(__name__)


def bert_peer_variants(config: ModelConfig, threads: int, scratch: Path) -> tuple[list[Variant], dict[str, str]]:
    """HF BERT of ``config``'s encoder size: fused fp32 and fused int8 on ONNX Runtime's CPU provider."""
    try:
        import torch
        from transformers import BertConfig, BertModel
    except ImportError:
        return [], {"peer HF BERT": "transformers is not installed (pip install 'edgeattn[peers]')"}
    from onnxruntime.transformers.optimizer import optimize_model

    from edgeattn.benchmark.memory import onnx_probe

    act = "relu" if config.activation == "relu" else "gelu"
    bert_config = BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.d_model, num_hidden_layers=config.n_encoder_layers,
        num_attention_heads=config.n_heads, intermediate_size=config.d_ff, max_position_embeddings=config.max_len,
        hidden_act=act, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)

    class Hidden(torch.nn.Module):  # keyword arguments: BertModel's positional order differs between versions
        def __init__(self) -> None:
            super().__init__()
            self.bert = BertModel(bert_config, add_pooling_layer=False)

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    model = Hidden().eval()
    raw, fused, int8 = scratch / "bert.onnx", scratch / "bert.fused.onnx", scratch / "bert.int8.onnx"
    ids = torch.randint(3, config.vocab_size, (2, 16))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (ids, torch.ones_like(ids)), str(raw), dynamo=False, opset_version=17,
            input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
            dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                          "last_hidden_state": {0: "batch", 1: "seq"}},
        )  # fmt: skip
    with quiet_quantization():
        optimized = optimize_model(str(raw), model_type="bert", num_heads=config.n_heads, hidden_size=config.d_model)
        optimized.save_model_to_file(str(fused))
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # the weight type Optimum's AutoQuantizationConfig picks for this CPU (avx512_vnni: s8, avx2: u8)
        weights = QuantType.QInt8 if dynamic_int8_weights() == "int8" else QuantType.QUInt8
        quantize_dynamic(str(fused), str(int8), weight_type=weights, per_channel=True,
                         extra_options={"DefaultTensorType": 1})  # fmt: skip
    stats = optimized.get_fused_operator_statistics()
    variants = []
    for name, path in (("peer HF BERT ORT fused fp32", fused), ("peer HF BERT ORT fused int8", int8)):
        start = time.perf_counter()
        session = create_session(path, providers=[CPU], threads=threads, spinning="run")

        def run(i: np.ndarray, m: np.ndarray, session: Any = session) -> object:
            return session.run(["last_hidden_state"], {"input_ids": i, "attention_mask": m})

        run(np.ones((1, 8), np.int64), np.ones((1, 8), np.int64))
        note = f"attention fused {stats.get('Attention', 0)} of {config.n_encoder_layers}"
        cold = (time.perf_counter() - start) * 1e3
        probe = onnx_probe(str(path), CPU, threads)
        variants.append(Variant(name, run, cold, path.stat().st_size, note, probe=probe))
    return variants, {}

"""Clients that ask a running server: many requests at once, and a stream read piece by piece."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def ask_concurrently(server, model: str, texts: list[str], requests: int, threads: int) -> list[tuple[str, str]]:
    """``requests`` one-text requests of ``texts`` in turn from ``threads`` threads, over HTTP and gRPC
    alternately: (text, answer) each."""
    import tritonclient.grpc as grpc
    import tritonclient.http as http

    def ask(i: int) -> tuple[str, str]:
        text = texts[i % len(texts)]
        module, url = (http, server.http_url) if i % 2 else (grpc, server.grpc_url)
        client = module.InferenceServerClient(url)
        item = module.InferInput("text", [1, 1], "BYTES")
        item.set_data_from_numpy(text_tensor(text))
        return text, client.infer(model, [item]).as_numpy("answer")[0, 0].decode()

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(ask, range(requests)))


def stream_pieces(url: str, model: str, inputs: dict[str, np.ndarray], timeout: float = 120) -> list[str]:
    """The pieces a decoupled model sends for one request over gRPC streaming ("ERROR ..." for an
    error), ``inputs`` by name as one row each."""
    import tritonclient.grpc as grpc
    from tritonclient.utils import np_to_triton_dtype

    pieces: list[str] = []
    done = threading.Event()

    def callback(result, error):
        if error is not None:
            pieces.append(f"ERROR {error}")
            done.set()
        elif result.get_response().parameters["triton_final_response"].bool_param:
            done.set()
        else:
            pieces.append(result.as_numpy("answer")[0, 0].decode())

    client = grpc.InferenceServerClient(url)
    client.start_stream(callback)
    items = []
    for name, value in inputs.items():
        items.append(grpc.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype)))
        items[-1].set_data_from_numpy(value)
    client.async_stream_infer(model, items, enable_empty_final_response=True)
    assert done.wait(timeout)
    client.stop_stream()
    return pieces


def text_tensor(*texts: str) -> np.ndarray:
    return np.array([[t.encode()] for t in texts], dtype=object)

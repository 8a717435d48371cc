"""The speech family (Whisper's encoder-decoder: log-mel features in, text out): its PyTorch model,
config section, Hugging Face import, graphs, gate, fitting and bundle description."""

"""The seq2seq family (encoder-decoders: T5): its PyTorch model, Hugging Face import and benchmarks."""

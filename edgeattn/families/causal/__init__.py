"""The causal family (decoder-only language models: GPT-2, Llama, Qwen2, Phi-3, ...): its PyTorch
model and config section, Hugging Face import, graph builder, GPTQ fitting and benchmark driver."""

"""The causal family's torch-free side: its runtime class, chat templates and tool calls."""

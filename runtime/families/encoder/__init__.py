"""The encoder family's torch-free side: its runtime class."""

"""The seq2seq family's torch-free side: its runtime class."""

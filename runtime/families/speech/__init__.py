"""The speech family's torch-free side: its record, specs, log-mel features, audio input, decoding
rules, runtime class, served task, output formats and ES module."""

"""The speech family's torch-free side: Whisper's log-mel features (and, as the family grows, its
decoding rules and runtime)."""

"""The speech family: Whisper's encoder-decoder (log-mel features in, text out), its Hugging Face
importer and, on the runtime side, its features (``edgeattn.runtime.whisper.log_mel``) and audio
(``edgeattn.runtime.audio``)."""

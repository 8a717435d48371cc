"""Builders the tests share: small Hugging Face folders, audio, npm packages, servers to ask."""

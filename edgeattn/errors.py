"""Exceptions that carry a message a user can act on (torch-free)."""


class EdgeattnError(Exception):
    """A failure the user can fix: bad input, bad file, bad configuration."""


class ConfigError(EdgeattnError, ValueError):
    """A model configuration that is invalid or cannot be read."""


class CheckpointError(EdgeattnError):
    """A weights file that is missing, unreadable or does not match the model."""


class ExportError(EdgeattnError):
    """An export that could not be completed."""


class VerificationError(EdgeattnError):
    """Exported graphs that disagree with eager PyTorch."""

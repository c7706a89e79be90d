"""The one error the model layer raises for anything that cannot be loaded (defined beside the engine,
whose runtimes raise it too)."""

from ..engine.errors import ModelLoadError

__all__ = ["ModelLoadError"]

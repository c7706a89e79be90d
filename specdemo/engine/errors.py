"""The one error raised for anything that cannot be loaded: a model, a tokenizer, a runtime's export.
The model layer re-exports it (`specdemo.ModelLoadError`), so callers catch one class."""


class ModelLoadError(ValueError):
    """A model, tokenizer or runtime target could not be loaded; the message says why in plain words."""

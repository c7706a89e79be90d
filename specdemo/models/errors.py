"""The one error the model layer raises for anything that cannot be loaded."""


class ModelLoadError(ValueError):
    """A model or tokenizer could not be loaded; the message says why in plain words."""

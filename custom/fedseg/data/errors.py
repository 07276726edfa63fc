"""The data layer's error type, in a module of its own so that every data module can raise it without importing
the datalist reader (which itself uses the label spaces)."""


class DatalistError(ValueError):
    """A datalist or one of the files it references is missing, malformed or inconsistent.

    The message always names the offending file.
    """

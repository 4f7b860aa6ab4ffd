"""Errors meant for the user: the CLI prints their message (which names the fix) and exits non-zero."""


class UserError(Exception):
    """Bad input or environment that the user can fix; the message says how."""

    exit_code = 2


def brief(value: object, limit: int = 100) -> str:
    """repr(value) for an error message, bounded: nested or huge values from a file are cut, never formatted whole."""
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother = 3, limit, limit
    text = short.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

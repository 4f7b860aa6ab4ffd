"""Errors meant for the user: the CLI prints their message (which names the fix) and exits non-zero."""

import re


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


_CREDENTIALS_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*):[^/\s]*@")


def redact(text: str) -> str:
    """Hide the password of every URL in `text`: scheme://user:secret@host -> scheme://user:***@host. For what is
    printed or logged (a download's mirror, a dry run's --setenv HTTPS_PROXY=...), never for what is sent."""
    return _CREDENTIALS_RE.sub(r"\g<scheme>:***@", text)

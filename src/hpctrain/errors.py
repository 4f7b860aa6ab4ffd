"""Errors meant for the user: the CLI prints their message (which names the fix) and exits non-zero."""


class UserError(Exception):
    """Bad input or environment that the user can fix; the message says how."""

    exit_code = 2

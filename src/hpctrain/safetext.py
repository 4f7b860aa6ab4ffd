r"""Text from outside made safe to show: the one output boundary for strings hpctrain does not control (job, node,
host and partition names, labels, replica types, exit and termination messages, an API server's words).

A terminal obeys what such a string may hold: ESC starts an escape sequence (OSC 52 writes the clipboard, SGR
recolours, CSI moves the cursor and clears the screen), C1 controls do the same in one character, a bidi override
(U+202E) shows a name backwards, a line or paragraph separator (U+2028, U+2029, U+0085) or a newline forges a line,
and zero-width and other format characters hide text or make two names look alike. `for_terminal` shows every such
character as its escape, visibly (`\x1b`, `\u202e`), never dropped or replaced by `?`: what was there can be read
off the screen. A lone surrogate (a byte that was not UTF-8, kept by the `surrogateescape` decoding) shows as the
byte it stands for (`\xff`).

The rule is the character's Unicode category, not a list: Cc (C0, DEL, C1), Cf (bidi controls and marks, zero-width
space and joiners, U+FEFF, soft hyphen, tags), Cs (surrogates), Zl and Zp (line and paragraph separators). Python's
`str.isprintable()` is False for each of them, so printable text (nearly all of it) is returned as it is after one
C-level scan. Everything else (letters of any script, spaces, private-use and not yet assigned code points) is shown
as it is. A backslash is left as it is: the escapes are for reading, not for parsing back.

`for_html` is the same for an HTML page (the web console): the same characters made visible, then `html.escape`.
"""

from __future__ import annotations

import html
import unicodedata

HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _escape(code: int) -> str:
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for the undecodable byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


class _Escapes(dict):
    """str.translate's table, filled on first sight of each character: a hidden one maps to its escape, any other
    to itself."""

    def __missing__(self, code: int) -> str | int:
        value: str | int = _escape(code) if unicodedata.category(chr(code)) in HIDDEN_CATEGORIES else code
        self[code] = value
        return value


_ESCAPES = _Escapes()
_ESCAPES_BUT_NEWLINE = _Escapes({ord("\n"): ord("\n")})


def for_terminal(text: str, *, newlines: bool = False) -> str:
    """`text` with every control, format, surrogate and separator character shown as its escape (see the module
    docstring); printable text comes back as it is. `newlines`: keep LF (a message of several lines of our own, such
    as an error with a log's tail); CR, U+2028 and the rest are still escaped."""
    if text.isprintable():
        return text
    return text.translate(_ESCAPES_BUT_NEWLINE if newlines else _ESCAPES)


def for_html(text: str) -> str:
    """`text` for an HTML page, in an element or an attribute: the hidden characters made visible as for a
    terminal, then `&`, `<`, `>`, `"` and `'` escaped."""
    return html.escape(for_terminal(text), quote=True)

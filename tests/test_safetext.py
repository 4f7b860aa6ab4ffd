"""The output boundary (hpctrain.safetext): every character a terminal obeys or that hides text is shown as its escape,
visibly, never dropped and never `?`; printable text comes back as it is. Pure functions, run over every code point."""

from __future__ import annotations

import html
import sys
import unicodedata

import pytest

from hpctrain.safetext import HIDDEN_CATEGORIES, for_html, for_terminal

HOSTILE = [
    # (what arrives, what the terminal gets)
    ("job\x1b]52;c;cm0gLXJmIH4=\x07", "job\\x1b]52;c;cm0gLXJmIH4=\\x07"),  # OSC 52: write the clipboard
    ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),  # SGR
    ("a\x1b[2J\x1b[Hb", "a\\x1b[2J\\x1b[Hb"),  # CSI: clear the screen, cursor home
    ("\x9b31m", "\\x9b31m"),  # C1 CSI, one character
    ("\x9d52;c;x\x9c", "\\x9d52;c;x\\x9c"),  # C1 OSC and ST
    ("exe.\u202eetxt", "exe.\\u202eetxt"),  # RIGHT-TO-LEFT OVERRIDE: shows "exe.txte"
    ("\u2066a\u2067b\u2068c\u2069", "\\u2066a\\u2067b\\u2068c\\u2069"),  # bidi isolates
    ("\u202a\u202b\u202c\u202d", "\\u202a\\u202b\\u202c\\u202d"),  # bidi embeddings
    ("\u200e\u200f\u061c", "\\u200e\\u200f\\u061c"),  # LRM, RLM, ARABIC LETTER MARK
    ("one\u2028two\u2029three", "one\\u2028two\\u2029three"),  # line and paragraph separators
    ("one\x85two", "one\\x85two"),  # NEL
    ("one\ntwo\rthree\tfour", "one\\x0atwo\\x0dthree\\x09four"),
    ("ad\u200bmin", "ad\\u200bmin"),  # zero-width space: two names that look alike
    ("\u200c\u200d\u2060\ufeff\u00ad", "\\u200c\\u200d\\u2060\\ufeff\\xad"),  # joiners, word joiner, BOM, soft hyphen
    ("tag\U000e0041\U000e007f", "tag\\U000e0041\\U000e007f"),  # tag characters
    ("bell\x07nul\x00del\x7f", "bell\\x07nul\\x00del\\x7f"),
    ("byte\udcff\udc80", "byte\\xff\\x80"),  # surrogateescape's undecodable bytes: shown as those bytes
    ("lone\ud800", "lone\\ud800"),
    ("[bold red]x[/]", "[bold red]x[/]"),  # markup is text (the tables never read it as markup)
    ("naïve 名前 Ωmega", "naïve 名前 Ωmega"),
    ("C:\\x1b is text", "C:\\x1b is text"),  # a backslash stays what it is
    ("", ""),
]


@pytest.mark.parametrize(("raw", "shown"), HOSTILE)
def test_each_hostile_string_is_shown_escaped(raw: str, shown: str) -> None:
    assert for_terminal(raw) == shown
    assert for_terminal(shown) == shown  # what it shows is printable: shown again, unchanged


def test_printable_text_is_returned_as_it_is() -> None:
    text = "exp-42 node[001-064] gpu:a100:8 Ω 名前 " * 100
    assert for_terminal(text) is text  # the fast path: one isprintable() scan, no copy


def _hidden(code: int) -> bool:
    return unicodedata.category(chr(code)) in HIDDEN_CATEGORIES


def test_no_control_format_surrogate_or_separator_character_survives() -> None:
    """Every code point 0..0x10FFFF of category Cc, Cf, Cs, Zl or Zp comes out escaped (as ASCII only), and nothing
    else is changed; the fast path is sound: isprintable() is False for each hidden one."""
    hidden = [code for code in range(sys.maxunicode + 1) if _hidden(code)]
    assert len(hidden) > 2000  # 2048 surrogates alone
    assert not any(chr(code).isprintable() for code in hidden)
    everything = "".join(map(chr, range(sys.maxunicode + 1)))
    shown = for_terminal(everything)
    assert not any(_hidden(ord(ch)) for ch in shown)
    for code in hidden:
        out = for_terminal(f"a{chr(code)}b")
        assert out[0] == "a" and out[-1] == "b" and out[1] == "\\" and out.isascii() and out.isprintable(), hex(code)
    rest = "".join(chr(code) for code in range(sys.maxunicode + 1) if not _hidden(code))
    assert for_terminal(rest) == rest  # letters, marks, spaces, private use, unassigned: as they are


def test_newlines_may_be_kept_for_a_message_of_several_lines() -> None:
    assert for_terminal("a\nb\x1b[2J\u2028c\r", newlines=True) == "a\nb\\x1b[2J\\u2028c\\x0d"
    assert for_terminal("a\nb") == "a\\x0ab"


def test_for_html_escapes_markup_and_shows_hidden_characters() -> None:
    assert for_html("<img src=x onerror='alert(1)'>") == html.escape("<img src=x onerror='alert(1)'>", quote=True)
    assert for_html('a"b&c') == "a&quot;b&amp;c"
    assert for_html("evil\u202e\x1b[31m<b>") == "evil\\u202e\\x1b[31m&lt;b&gt;"
    assert for_html("\udcff") == "\\xff"

"""What the CLI prints from outside cannot act on a terminal or hide text from a reader."""

from __future__ import annotations

import json
import sys
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolkernel.terminal import json_text, printable

# Characters a terminal acts on, or that show as nothing: a reader cannot see them.
HIDING = ["\x1b", "\x9b", "\u202e", "\u200b", "\u034f", "\u115f", "\u1160", "\u3164", "\uffa0"]


@pytest.mark.parametrize("char", HIDING)
def test_a_hiding_character_is_escaped_in_text_and_json(char: str) -> None:
    shown = printable(f"notes{char}.txt")
    assert shown != "notes.txt"
    assert char not in shown
    assert shown.startswith("notes\\")
    assert shown.endswith(".txt")
    assert char not in json_text({"path": f"notes{char}.txt"})


@given(st.text())
def test_printable_output_holds_only_visible_characters(text: str) -> None:
    shown = printable(text, one_line=False)
    assert all(char.isprintable() and char not in HIDING for char in shown)


@given(
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    )
)
def test_json_text_is_strict_json_that_reads_back(value: object) -> None:
    text = json_text(value)

    def refuse(constant: str) -> object:
        raise AssertionError(f"{constant} is not JSON")

    json.loads(text, parse_constant=refuse)
    assert not any(char in text for char in HIDING)


def test_a_non_finite_number_is_written_as_its_name() -> None:
    assert json.loads(json_text({"a": float("nan"), "b": [float("inf"), -float("inf")]})) == {
        "a": "NaN",
        "b": ["Infinity", "-Infinity"],
    }


def test_json_text_escapes_every_control_format_separator_and_blank_character() -> None:
    """Every code point of Unicode's Cc, Cf, Zl, Zp and Cs categories, and every blank
    but the space: none is written raw (U+00A0 and U+3000 were)."""
    hiding = [
        chr(code)
        for code in range(0x20, sys.maxunicode + 1)
        if unicodedata.category(chr(code)) in {"Cc", "Cf", "Zl", "Zp", "Cs"}
        or (unicodedata.category(chr(code)) == "Zs" and code != 0x20)
    ]
    assert len(hiding) > 2000
    shown = json_text("".join(hiding))
    assert [char for char in hiding if char in shown] == []

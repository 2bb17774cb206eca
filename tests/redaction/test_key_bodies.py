"""A private key read without its BEGIN line: some of a file's lines, a search hit,
``sed -n 3,8p``. Its body lines are masked all the same, and ordinary base64-looking
lines (hex digests, padding, words) are not."""

from __future__ import annotations

import base64
import hashlib
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkernel.redaction import SECRET_MASK, Redactor, StreamRedactor


@pytest.fixture(scope="module")
def redactor(tmp_path_factory: pytest.TempPathFactory) -> Redactor:
    return Redactor(tmp_path_factory.mktemp("ws"))


def body(key: bytes, width: int) -> list[str]:
    """A key's base64 body wrapped as PEM (64) or OpenSSH (70) files have it."""
    return textwrap.wrap(base64.b64encode(key).decode(), width)


@settings(max_examples=300, deadline=None)
@given(
    key=st.binary(min_size=200, max_size=1800),
    width=st.sampled_from([64, 70]),
    cut=st.data(),
)
def test_no_full_line_of_a_key_body_survives_any_slice_of_its_lines(key, width, cut):
    lines = body(key, width)
    first = cut.draw(st.integers(0, len(lines) - 1))
    last = cut.draw(st.integers(first + 1, len(lines)))
    shown = lines[first:last]
    text = "notes about the deploy\n" + "\n".join(shown) + "\nthe end\n"
    counts: Counter[str] = Counter()
    redacted = Redactor(Path("/nonexistent-ws")).redact_text(text, counts)
    for line in shown:
        if len(line) == width and _mixed(line):
            assert line not in redacted
    assert "notes about the deploy" in redacted
    assert "the end" in redacted


def _mixed(line: str) -> bool:
    return line.lower() != line and line.upper() != line and any(c.isdigit() for c in line)


def test_a_slice_is_one_mask_and_counted_as_a_private_key(redactor):
    lines = body(bytes(range(256)) * 4, 64)
    text = "\n".join(lines[2:7])
    counts: Counter[str] = Counter()
    assert redactor.redact_text(text, counts) == SECRET_MASK
    assert counts == Counter({"private-key": 1})


def test_the_short_last_line_of_the_key_goes_with_it(redactor):
    lines = body(bytes(range(256)) * 3 + b"tail", 64)
    assert len(lines[-1]) < 64
    text = "\n".join(lines[-3:]) + "\n-----END RSA PRIVATE KEY-----\n"
    redacted = redactor.redact_text(text, Counter())
    assert redacted == f"{SECRET_MASK}\n-----END RSA PRIVATE KEY-----\n"


def test_a_single_line_of_a_key_is_masked(redactor):
    """A search hit shows one line: paging through searches must not rebuild the key."""
    line = body(bytes(range(256)), 64)[1]
    assert redactor.redact({"preview": line}, Counter()) == {"preview": SECRET_MASK}


def test_a_word_after_the_key_is_not_taken_for_its_last_line(redactor):
    lines = body(bytes(range(256)) * 4, 64)
    text = "\n".join(lines[1:4]) + "\ndone\n"
    assert redactor.redact_text(text, Counter()) == f"{SECRET_MASK}\ndone\n"


def test_a_key_body_streamed_in_small_chunks_is_masked(tmp_path):
    lines = body(bytes(range(256)) * 4, 70)
    text = "out:\n" + "\n".join(lines[1:9]) + "\ndone\n"
    stream = StreamRedactor(Redactor(tmp_path), hold=128)
    out = "".join(stream.redact_chunks(text[i : i + 37] for i in range(0, len(text), 37)))
    assert all(line not in out for line in lines[1:9])
    assert out.startswith("out:\n")
    assert out.endswith("\ndone\n")


@pytest.mark.parametrize(
    "line",
    [
        hashlib.sha256(b"x").hexdigest(),  # a digest: no capitals
        hashlib.sha256(b"x").hexdigest().upper(),  # nor lower case
        "A" * 64,
        "=" * 64,
        "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijkl",
        "x" * 80,
        "  const digest = 'abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123';",
    ],
)
def test_lines_that_only_look_like_base64_are_left_alone(redactor, line):
    assert redactor.redact_text(f"before\n{line}\nafter", Counter()) == f"before\n{line}\nafter"


@settings(max_examples=100, deadline=None)
@given(key=st.binary(min_size=600, max_size=1800))
def test_a_base64_encoded_pem_is_masked_whole(key):
    """``openssl base64 -in key.pem``, a Kubernetes secret: its first line is found from
    the encoded BEGIN, the rest as key lines; the two are one span, both masked."""
    pem = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(body(key, 64))
    pem += "\n-----END RSA PRIVATE KEY-----\n"
    encoded = body(pem.encode(), 64)
    redacted = Redactor(Path("/nonexistent-ws")).redact_text("\n".join(encoded) + "\n", Counter())
    assert all(line not in redacted for line in encoded if len(line) == 64 and _mixed(line))

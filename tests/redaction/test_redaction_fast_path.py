"""The short-text fast path of the redactor must change nothing: whatever it lets
through unscanned, the full scan would have returned unchanged too."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from toolkernel import redaction as R

REDACTOR = R.Redactor(Path("/tmp/ws"), ["hunter2secret"])

PIECES = st.sampled_from(
    [
        "pass",
        "PaSs",
        "tok",
        "en",
        "KEY",
        "auth",
        "_pat",
        " -u",
        "://",
        "hooks.slack",
        "/",
        "\\",
        ":",
        "C",
        "x",
        "a" * 10,
        "Z9_-" * 3,
        "İ",
        "\u212a",  # Kelvin sign: lower-cases to k
        "\u017f",  # long s: lower-cases oddly, a trap for keyword triggers
        "\t",
        "at ",
        'File "',
        "-----BEGIN",
        "LS0tLS1CRUdJT",
        "=",
        " ",
        "\n",
        "é",
        "ghp_",
        "AKIA",
        "eyJ",
        "sk-",
        "@",
        ".",
        "/tmp/ws",
        "hunter2secret",
    ]
)
TEXTS = st.one_of(
    st.text(max_size=80),
    st.lists(PIECES, max_size=12).map("".join),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789_-.:+/= ", max_size=60),
)


def full_scan(text: str) -> tuple[str, Counter[str]]:
    counts: Counter[str] = Counter()
    text = R.Redactor._mask_known(REDACTOR, text, counts)
    text = R._mask_traces(text, counts)
    text = R._mask_private_keys(text, counts)
    text = R._mask_secrets(text, counts)
    return REDACTOR._mask_paths(text, counts), counts


@settings(max_examples=3000, deadline=None)
@given(TEXTS)
def test_text_judged_plain_is_left_alone_by_the_full_scan(text):
    if R._is_plain(text) and REDACTOR.workspace not in text:
        redacted, counts = full_scan(text)
        assert redacted == text
        assert not counts


@settings(max_examples=3000, deadline=None)
@given(TEXTS)
def test_redact_text_equals_the_full_scan(text):
    counts: Counter[str] = Counter()
    fast = REDACTOR.redact_text(text, counts)
    slow, slow_counts = full_scan(text)
    assert fast == slow
    assert counts == slow_counts


@settings(max_examples=1000, deadline=None)
@given(TEXTS)
def test_a_text_redacted_again_from_the_plain_cache_equals_the_full_scan(text):
    slow, slow_counts = full_scan(text)
    for _ in range(2):  # the second time, a plain text comes from the redactor's cache
        counts: Counter[str] = Counter()
        assert REDACTOR.redact_text(text, counts) == slow
        assert counts == slow_counts


SECRETS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=8, max_size=24)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="abcdefgh .", max_size=20), SECRETS, st.text(alphabet="xyz .", max_size=20))
def test_a_text_once_plain_is_masked_after_the_redactor_learns_a_secret_it_holds(
    before, secret, after
):
    redactor = R.Redactor(Path("/tmp/ws"))
    text = f"{before}{secret}{after}"
    first = redactor.redact_text(text, Counter())
    redactor.add_secret(secret)
    counts: Counter[str] = Counter()
    masked = redactor.redact_text(text, counts)
    assert secret not in masked
    assert counts["known-secret"] >= 1
    if R._is_plain(text):  # the case the cache is for: it was let through at first
        assert first == text

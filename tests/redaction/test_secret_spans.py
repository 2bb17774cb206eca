"""``Redactor.secret_spans``: where ``redact_text`` masks secrets, as spans of the original."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from secret_strategies import mixed
from toolkernel.redaction import SECRET_MASK, Redactor

WORKSPACE = Path("/srv/ws")
KNOWN = "injected-known-value-9"
TOKEN = "ghp_" + "Zq8vN2kLmX4pRt7YbW1cJ9sD3fGh6KaE0uIo"
# What secret_spans does not look for: stack traces and paths.
NOT_LOOKED_FOR = ('File "', "\tat ", "    at ", "/", "\\")


def mask(text: str, spans: list[tuple[int, int, str]]) -> str:
    """``text`` with what the spans cover masked; overlapping spans make one mask."""
    stretches: list[list[int]] = []
    for start, end, _ in spans:
        if stretches and start < stretches[-1][1]:
            stretches[-1][1] = max(stretches[-1][1], end)
        else:
            stretches.append([start, end])
    out: list[str] = []
    done = 0
    for start, end in stretches:
        out += [text[done:start], SECRET_MASK]
        done = end
    return "".join(out) + text[done:]


def test_spans_are_offsets_of_the_original_text_after_earlier_masks():
    text = f"x {KNOWN}{KNOWN} {TOKEN} password = {KNOWN}xyz."
    spans = Redactor(WORKSPACE, secrets=[KNOWN]).secret_spans(text)
    assert [(text[start:end], kind) for start, end, kind in spans] == [
        (KNOWN, "known-secret"),
        (KNOWN, "known-secret"),
        (TOKEN, "github-token"),
        (KNOWN, "known-secret"),
    ]


def test_a_span_that_takes_in_a_mask_reaches_over_what_it_hides():
    block = f"-----BEGIN RSA PRIVATE KEY-----\nMIIabc {KNOWN}\n-----END RSA PRIVATE KEY-----"
    text = f"key:\n{block}\n"
    spans = Redactor(WORKSPACE, secrets=[KNOWN]).secret_spans(text)
    assert [(text[start:end], kind) for start, end, kind in spans] == [
        (block, "private-key"),
        (KNOWN, "known-secret"),
    ]


PIECES = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40),
    mixed(36).map(lambda s: "ghp_" + s),
    mixed(20).map(lambda s: "AKIA" + s.upper()[:16]),
    st.tuples(mixed(20), mixed(30), mixed(43)).map(lambda t: f"eyJ{t[0]}.eyJ{t[1]}.{t[2]}"),
    mixed(12).map(lambda s: f"password = {s}"),
    mixed(12).map(lambda s: f"api_token: {KNOWN}{s}"),
    mixed(40),
    st.lists(mixed(64), min_size=1, max_size=3).map(
        lambda rows: (
            "-----BEGIN PRIVATE KEY-----\n"
            + "\n".join([*rows, KNOWN])
            + "\n-----END PRIVATE KEY-----"
        )
    ),
    st.just(KNOWN),
    st.just(SECRET_MASK),
    st.sampled_from([" ", "\n", '"', "=", ": ", ", ", "\t", "token ", "secret="]),
)
TEXTS = st.lists(PIECES, max_size=10).map("".join)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(TEXTS)
def test_masking_the_spans_gives_what_redact_text_gives(text):
    assume(not any(anchor in text for anchor in NOT_LOOKED_FOR))
    redactor = Redactor(WORKSPACE, secrets=[KNOWN])
    counts: Counter[str] = Counter()
    expected = redactor.redact_text(text, counts)
    spans = redactor.secret_spans(text)
    assert spans == sorted(spans)
    assert mask(text, spans) == expected
    assert Counter(kind for _, _, kind in spans) == counts

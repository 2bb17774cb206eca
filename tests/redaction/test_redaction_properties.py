"""Hypothesis: redaction is idempotent and planted secrets never get through."""

from __future__ import annotations

import json
import string
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from secret_strategies import UPPER_DIGITS, chars, mixed
from toolkernel.redaction import Redactor, StreamRedactor
from toolkernel.secrets import shannon_entropy

WORKSPACE = Path("/srv/ws")
KNOWN = "injected-known-value-9"


TOKENS = st.one_of(
    mixed(36).map(lambda s: "ghp_" + s),
    mixed(36).map(lambda s: "gho_" + s),
    mixed(82).map(lambda s: "github_pat_" + s),
    chars(UPPER_DIGITS, 16).map(lambda s: "AKIA" + s),
    mixed(20).map(lambda s: "glpat-" + s),
    st.tuples(chars(string.digits, 12), chars(string.digits, 13), mixed(24)).map(
        lambda t: f"xoxb-{t[0]}-{t[1]}-{t[2]}"
    ),
    mixed(24).map(lambda s: "sk_live_" + s),
    mixed(35).map(lambda s: "AIza" + s),
    mixed(48).map(lambda s: "sk-proj-" + s),
    mixed(90).map(lambda s: "sk-ant-api03-" + s),
    st.tuples(mixed(20), mixed(30), mixed(43)).map(lambda t: f"eyJ{t[0]}.eyJ{t[1]}.{t[2]}"),
    # A bare token has only its look to go by: the generic rule's floor is 4.2 bits of
    # entropy per character (a generated 40-character token has about 5). Below it,
    # "0000…0000AAAaaa" is not a secret's look, and it is not redacted on purpose.
    mixed(40).filter(lambda s: shannon_entropy(s) >= 4.2),
    st.just(KNOWN),
)
# Secrets that only a keyword makes recognisable: the value, and its context.
PASSWORDS = st.tuples(
    st.sampled_from(["password", "DB_PASSWORD", "secret", "api_token", "client_secret"]),
    st.sampled_from(["=", ": ", " = ", "=>"]),
    mixed(12),
)
SEPARATORS = st.sampled_from([" ", "\n", '"', "'", "=", ": ", "(", ", ", "\t"])
SURROUNDING = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=200)
PY_TRACE = 'Traceback (most recent call last):\n  File "/x/y.py", line 1, in f\n    g()\nE: x\n'
CHUNKING = st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=50)


def make_redactor() -> Redactor:
    return Redactor(WORKSPACE, secrets=[KNOWN])


def redact(text: str) -> str:
    return make_redactor().redact_text(text, Counter())


def streamed(text: str, sizes: list[int]) -> str:
    chunks: list[str] = []
    at = 0
    for size in sizes * (len(text) // max(sum(sizes), 1) + 1):
        chunks.append(text[at : at + size])
        at += size
        if at >= len(text):
            break
    chunks.append(text[at:])
    streamer = StreamRedactor(make_redactor(), hold=64)
    return "".join(streamer.redact_chunks(chunks))


TEXT = st.one_of(
    SURROUNDING,
    st.lists(
        st.one_of(
            SURROUNDING,
            TOKENS,
            st.sampled_from(
                [
                    "/home/alice/.ssh/id_rsa",
                    f"{WORKSPACE}/src/app.py",
                    "https://user:pw@example.com/a/b",
                    PY_TRACE,
                    "\tat com.x.Y.m(Y.java:12)\n",
                    "password = hunter22",
                    "[REDACTED]",
                    "<host-path>",
                ]
            ),
        ),
        max_size=8,
    ).map(" ".join),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(TEXT)
def test_redaction_is_idempotent(text):
    once = redact(text)
    assert redact(once) == once


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(SURROUNDING, SEPARATORS, TOKENS, SEPARATORS, SURROUNDING, CHUNKING)
def test_a_planted_token_never_survives_whole_or_streamed(
    prefix, left, token, right, suffix, sizes
):
    assume(token not in prefix + suffix)
    text = prefix + left + token + right + suffix
    assert token not in redact(text)
    assert token not in streamed(text, sizes)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(SURROUNDING, PASSWORDS, SURROUNDING, CHUNKING)
def test_a_planted_password_assignment_never_survives(prefix, assignment, suffix, sizes):
    key, binder, value = assignment
    assume(value not in prefix + suffix)
    text = f"{prefix}\n{key}{binder}{value}\n{suffix}"
    assert value not in redact(text)
    assert value not in streamed(text, sizes)


LITERALS = st.sampled_from(
    [
        json.dumps,
        lambda v: json.dumps(v, ensure_ascii=False),
        lambda v: json.dumps(v).replace("/", "\\/"),
        repr,
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    secret=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=4),
    literal=LITERALS,
    around=st.sampled_from(["{0}", "value: {0} end", "{{'k': {0}}}", "[{0}, {0}]"]),
)
def test_a_known_secret_never_survives_as_a_string_literal_writes_it(secret, literal, around):
    """A secret the runtime hands out, with whatever quotes, backslashes, control or
    non-ASCII characters it holds, printed as JSON or a Python repr writes it."""
    written = literal(secret)
    out = Redactor(WORKSPACE, secrets=[secret]).redact_text(around.format(written), Counter())
    assert written not in out


_NAME_WORD = st.text(alphabet=string.ascii_letters, min_size=4, max_size=8)


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(st.tuples(_NAME_WORD, _NAME_WORD), min_size=1, max_size=3),
    depth=st.integers(min_value=1, max_value=3),
    around=st.sampled_from(["{}", "cwd: {}\n", "'{}'", "{}/other file.txt", "in {}: error"]),
)
def test_no_name_of_the_workspaces_parents_reaches_the_model(words, depth, around):
    """The generic host-path pattern stops at a space; the workspace's own parents are
    known, and masked whole whatever characters their names hold."""
    parents = [f"{a} {b}" for a, b in words]
    workspace = Path("/home/dev", *parents, "ws")
    shown_parent = Path("/home/dev", *parents[: max(1, len(parents) - depth + 1)])
    text = around.format(shown_parent)
    redacted = Redactor(workspace).redact_text(text, Counter())
    for a, b in words:
        assert f"{a} {b}" not in redacted
        assert f" {b}" not in redacted or f" {b}" in around

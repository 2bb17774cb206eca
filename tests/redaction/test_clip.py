"""``Redactor.clip``: part of a text, with nothing left of a secret its edges cut through."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from secret_strategies import mixed
from toolkernel.redaction import HOST_PATH_MASK, SECRET_MASK, Redactor

WORKSPACE = Path("/srv/ws")
KNOWN = "injected-known-value-9"
TOKEN = "ghp_" + "R8kT3mZq9XwL2vN7pB4sY6dF1hJ0cE5aG8uK"
PASSWORD = "S3cr3t-P4ss-2024-Vx9"
HOST_PATH = "/home/alice/.ssh/id_rsa"
REDACTOR = Redactor(WORKSPACE, secrets=[KNOWN])


def clip(text: str, start: int, end: int) -> tuple[str, Counter[str]]:
    counts: Counter[str] = Counter()
    return REDACTOR.clip(text, start, end, counts), counts


def test_a_token_the_end_cuts_through_is_masked_from_the_cut_back_to_its_start():
    text = "x" * 50 + " " + TOKEN + " tail"
    at = text.index(TOKEN)
    shown, counts = clip(text, 0, at + 30)
    assert shown == "x" * 50 + " " + SECRET_MASK
    assert counts == Counter({"github-token": 1})


def test_a_token_the_start_cuts_through_is_masked_up_to_where_it_ends():
    text = "head " + TOKEN + " tail"
    shown, counts = clip(text, text.index(TOKEN) + 9, len(text))
    assert shown == SECRET_MASK + " tail"
    assert counts == Counter({"github-token": 1})


def test_a_value_whose_keyword_lies_before_the_range_is_masked():
    text = "y" * 300 + ' "password": "' + PASSWORD + '", ' + "z" * 300
    at = text.index(PASSWORD)
    shown, counts = clip(text, at - 3, at + 40)
    assert shown == ': "' + SECRET_MASK + '", ' + "z" * 17
    assert counts == Counter({"password-assignment": 1})


def test_a_value_cut_off_from_its_keyword_by_the_end_is_masked():
    text = "db password = " + PASSWORD + " and more"
    shown, _ = clip(text, 0, text.index(PASSWORD) + 5)
    assert shown == "db password = " + SECRET_MASK


def test_a_known_secret_reaching_into_the_range_is_masked():
    text = "a" * 40 + KNOWN + "b" * 40
    shown, counts = clip(text, 0, 40 + len(KNOWN) // 2)
    assert shown == "a" * 40 + SECRET_MASK
    assert counts == Counter({"known-secret": 1})


def test_a_private_key_whose_begin_line_lies_far_before_the_range_is_masked():
    body = "\n".join("MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM" for _ in range(200))
    text = f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----\nend"
    start = text.index("-----END") - 10
    shown, counts = clip(text, start, len(text))
    assert shown == SECRET_MASK + "\nend"
    assert counts == Counter({"private-key": 1})


def test_a_host_path_an_edge_cuts_through_is_masked_and_a_whole_one_left_for_redact_text():
    text = f"cfg {HOST_PATH} and {HOST_PATH} done"
    second = text.rindex(HOST_PATH)
    shown, counts = clip(text, 7, len(text))
    assert shown == f"{HOST_PATH_MASK} and {HOST_PATH} done"
    assert counts == Counter({"host-path": 1})
    assert REDACTOR.redact_text(shown, Counter()) == f"{HOST_PATH_MASK} and {HOST_PATH_MASK} done"
    assert clip(text, 0, second + 6)[0] == f"cfg {HOST_PATH} and {HOST_PATH_MASK}"


def test_a_range_without_secrets_is_the_plain_slice_and_bounds_are_clamped():
    text = "plain words, nothing to hide"
    assert clip(text, 6, 11) == ("words", Counter())
    assert clip(text, -5, 500) == (text, Counter())
    assert clip(text, 9, 3) == ("", Counter())


# Filler holds no letter or digit, so a piece of a secret in the output can only come
# from the secret itself; single blanks between pieces keep each one a word of its own.
FILLER = st.text(st.sampled_from(" \n,;:()[]{}"), max_size=30)
SECRETS = st.one_of(
    mixed(36).map(lambda s: ("", "ghp_" + s)),
    st.tuples(
        st.sampled_from(["password = ", "DB_PASSWORD=", '"secret": "', "api_token: "]),
        mixed(14),
    ),
    st.just(("", KNOWN)),
    st.just(("", HOST_PATH)),
)
PIECE = 6


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parts=st.lists(st.tuples(FILLER, SECRETS), min_size=1, max_size=6),
    edges=st.tuples(st.floats(0, 1), st.floats(0, 1)),
)
def test_no_piece_of_a_secret_survives_a_clip_then_redact_text(parts, edges):
    """Wherever the range starts and ends: through a secret, between its keyword and its
    value, right at its edges, nothing is shown of a secret that redacting the whole
    text masks (a value of too little entropy is no secret's look: left alone whole)."""
    text = " ".join(f"{filler} {context}{value} " for filler, (context, value) in parts)
    start, end = sorted(round(edge * len(text)) for edge in edges)
    whole = REDACTOR.redact_text(text, Counter())
    shown = REDACTOR.redact_text(REDACTOR.clip(text, start, end, Counter()), Counter())
    for _, (_, value) in parts:
        if value in whole:
            continue
        pieces = {value[i : i + PIECE] for i in range(len(value) - PIECE + 1)}
        assert not any(piece in shown for piece in pieces), (value, shown)

"""StreamRedactor: secrets split across chunk boundaries, bytes, bounded memory."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from toolkernel.redaction import SECRET_MASK, Redactor, StreamRedactor

TOKEN = "ghp_" + "Q1w2E3r4T5y6U7i8O9p0A1s2D3f4G5h6J7k8"
KNOWN = "injected-db-password-77"
HOLD = 128


def filler(lines: int) -> str:
    return "".join(f"2025-06-01 INFO step {i} ok\n" for i in range(lines))


def stream(
    redactor: Redactor, chunks: list[bytes | str], hold: int = HOLD
) -> tuple[str, Counter[str]]:
    streamer = StreamRedactor(redactor, hold=hold)
    out = "".join(streamer.redact_chunks(chunks))
    return out, streamer.counts


def test_a_secret_split_at_every_position_is_still_redacted(tmp_path: Path):
    redactor = Redactor(tmp_path, secrets=[KNOWN])
    text = filler(20) + f"export GITHUB_TOKEN={TOKEN} DB={KNOWN}\n" + filler(20)
    whole = redactor.redact_text(text, Counter())
    for cut in range(len(text) + 1):
        out, counts = stream(redactor, [text[:cut], text[cut:]])
        assert TOKEN not in out, cut
        assert KNOWN not in out, cut
        assert out == whole, cut
        assert counts["github-token"] == 1
        assert counts["known-secret"] == 1


def test_one_character_chunks_and_split_utf8_bytes_are_handled(tmp_path: Path):
    redactor = Redactor(tmp_path)
    text = filler(10) + f"héllo wörld token: {TOKEN} ✓\n" + filler(10)
    encoded = text.encode()
    out, _ = stream(redactor, [encoded[i : i + 1] for i in range(len(encoded))])
    assert TOKEN not in out
    assert "héllo wörld" in out
    assert "✓" in out
    assert out == redactor.redact_text(text, Counter())


def test_a_private_key_split_over_many_chunks_is_redacted_whole(tmp_path: Path):
    redactor = Redactor(tmp_path)
    body = "".join(f"{'AbCdEf0123456789' * 4}\n" for _ in range(30))
    key = (
        "-----BEGIN "
        + "OPENSSH PRIVATE KEY-----\n"
        + body
        + "-----END "
        + "OPENSSH PRIVATE KEY-----\n"
    )
    text = filler(30) + key + filler(30)
    chunks = [text[i : i + 100] for i in range(0, len(text), 100)]
    out, counts = stream(redactor, chunks)
    assert "AbCdEf0123456789" not in out
    assert counts["private-key"] == 1


def test_memory_stays_bounded_while_a_process_writes_a_lot(tmp_path: Path):
    redactor = Redactor(tmp_path)
    streamer = StreamRedactor(redactor, hold=HOLD, max_line=4096)
    chunk = filler(200).encode()
    emitted = 0
    for _ in range(200):
        emitted += len(streamer.feed(chunk))
        assert len(streamer._buffer) <= 4096 + len(chunk)
    emitted += len(streamer.close())
    assert emitted == 200 * len(chunk)


def test_a_huge_line_without_breaks_is_cut_at_a_blank(tmp_path: Path):
    redactor = Redactor(tmp_path)
    words = (
        " ".join(f"w{i}" for i in range(5000))
        + f" {TOKEN} "
        + " ".join("x" * 3 for _ in range(5000))
    )
    chunks = [words[i : i + 1000] for i in range(0, len(words), 1000)]
    out, _ = stream(redactor, chunks)
    assert TOKEN not in out
    assert SECRET_MASK in out

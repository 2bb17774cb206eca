"""``toolkernel replay FILE``: a recorded conversation's tool calls, run under a policy.

The file is JSONL: one provider response per line, as the provider returned it (an
OpenAI chat completion, an OpenAI Responses ``response``, or an Anthropic ``message``;
blank lines are skipped). Each line is one model turn, and its calls run through the
kernel as ``Kernel.call_many`` runs a turn, against the configured workspace and
policy. This is how a team tries a policy on real traces before turning it on.

The whole file is read and parsed before anything runs: a bad line stops the replay
with exit code 2 and a message naming the line, and nothing has executed.

Output, one JSON object per call on ``out``, keys always in this order::

    line, toolName, providerCallId, [verdict,] toolCallId, status, errorCode,
    safeMessage, structuredOutput, artifacts, retryable

``line`` is the JSONL line of the call's response, ``toolName`` the tool the call was
read back as (the provider's spelling when no such tool exists), ``providerCallId``
the provider's id of the call (``null`` if it had none); the rest is the model
projection of the call's result.

With ``dry_run`` nothing executes at all, read-only tools included, and nothing is
written to the workspace or the ledger: each call is judged by ``Kernel.explain``
(lookup, argument parsing, validation with the path guard and tools' own checks such
as ``shell.run``'s command policy, authorization), and reported with an extra
``verdict`` key:

==================  ====================  ===============================================
verdict             ``status``            meaning
==================  ====================  ===============================================
ALLOWED             ``null``              would run; its outcome is unknown until it does
NEEDS_APPROVAL      ``null``              would run once a human approves it
DENIED              ``DENIED``            refused without running (``errorCode`` says why)
INVALID_ARGUMENTS   ``INVALID_ARGUMENTS`` refused without running (``errorCode`` says why)
==================  ====================  ===============================================

A call whose provider id an earlier call of its line already has is refused as a
real run refuses it (INVALID_ARGUMENTS, ``DUPLICATE_CALL_ID``), whatever it asks for.
A refused call's projection is the one a real run would give the model, except for
``toolCallId`` (the provider's id, or ``line<N>-<index>`` without one). Checks that
need the tool to run (``file.patch``'s ``baseHash``, a command's exit status) and
budgets and rate limits that earlier calls would have used up cannot be judged
without executing, so a dry run does not report them.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TextIO

import anyio

from toolkernel.approval import Approver
from toolkernel.calls import ToolCallResult
from toolkernel.cli import bridged
from toolkernel.codes import CATALOG, ErrorCode, Status, safe_field
from toolkernel.config import load_config
from toolkernel.errors import ToolkernelError
from toolkernel.kernel import Kernel
from toolkernel.ledger import SqliteLedger
from toolkernel.loop import FORMATS, Provider, tool_names
from toolkernel.providers import NameMap, ProviderFormatError
from toolkernel.run import Run, ToolCall
from toolkernel.terminal import json_text, printable

__all__ = ["EXIT_INVALID_INPUT", "EXIT_OK", "ReplayFamily", "Verdict", "run_replay"]

EXIT_OK: Final = 0
EXIT_INVALID_INPUT: Final = 2

ReplayFamily = Literal["openai", "anthropic"]
"""``--provider``: ``openai`` accepts Chat Completions and Responses lines alike."""

Verdict = Literal["ALLOWED", "NEEDS_APPROVAL", "DENIED", "INVALID_ARGUMENTS"]

_FAMILIES: Final[dict[ReplayFamily, frozenset[Provider]]] = {
    "openai": frozenset({"openai-chat", "openai-responses"}),
    "anthropic": frozenset({"anthropic"}),
}
_REFUSED: Final = frozenset({str(Status.DENIED), str(Status.INVALID_ARGUMENTS)})


class ReplayInputError(ToolkernelError):
    """The replay file cannot be used; the message names the file and the line.

    ``run_replay`` reports it on ``err`` and returns 2; it never escapes.
    """


@dataclass(frozen=True, slots=True)
class _Line:
    """One non-blank line of the file: its number, its provider, its response."""

    number: int
    provider: Provider
    document: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Turn:
    """One line of the file: its number and the calls its response proposes."""

    line: int
    calls: list[ToolCall]


def run_replay(
    path: Path,
    *,
    provider: ReplayFamily | None = None,
    dry_run: bool = False,
    workspace: Path | None = None,
    config_path: Path | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    approver: Approver | None = None,
) -> int:
    """Replay the tool calls of a recorded conversation; one JSON line per call.

    Args:
        path: the JSONL file of provider responses.
        provider: the responses' provider; ``None`` detects it line by line.
        dry_run: judge every call without executing any (see the module docstring).
        workspace: the workspace (default: the configuration's, or the current dir).
        config_path: ``toolkernel.toml`` (default: the workspace's, if present).
        out: where the per-call JSON lines go (default stdout).
        err: where an input error is reported (default stderr).
        approver: decides calls that need approval; without one they are DENIED.

    Returns:
        0 when the file was processed (whatever the calls' outcomes), 2 when it could
        not be read or a line is not a response of the expected provider.

    Raises:
        ConfigError: the configuration cannot be used.
    """
    out = out or sys.stdout
    config = load_config(config_path, workspace=workspace)
    try:
        lines = _read(path, provider)
    except ReplayInputError as exc:
        return _refuse(exc, err)
    with contextlib.ExitStack() as stack:
        ledger = None
        if dry_run:  # a dry run leaves no trace: its ledger is a scratch file, thrown away
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="toolkernel-"))
            ledger = SqliteLedger(Path(scratch) / "dry-run-ledger.db")
        kernel = stack.enter_context(Kernel(config, ledger=ledger, approver=approver))
        try:
            anyio.run(_replay, kernel, path, lines, dry_run, out)
        except ReplayInputError as exc:
            return _refuse(exc, err)
    return EXIT_OK


async def _replay(
    kernel: Kernel, path: Path, lines: list[_Line], dry_run: bool, out: TextIO
) -> None:
    """The lines' calls, judged or run, with the configured MCP servers bridged: the
    verdicts are those ``serve`` and ``call`` would give, bridged tools included."""
    run = kernel.start_run()
    async with bridged(kernel, run):
        names = tool_names(kernel, kernel.list_available(run.context))
        cap = kernel.config.max_argument_bytes
        turns = [_Turn(line.number, _calls(path, line, names, cap)) for line in lines]
        if dry_run:
            for turn in turns:
                _emit(out, _judge(kernel, run, turn))
        else:
            kernel.expose(run)  # the tools the recorded model saw, as far as policy allows
            await _execute(kernel, run, turns, out)


def _refuse(exc: ReplayInputError, err: TextIO | None) -> int:
    print(f"{type(exc).__name__}: {printable(str(exc))}", file=err or sys.stderr)
    return EXIT_INVALID_INPUT


# -- reading ----------------------------------------------------------------------------


def _read(path: Path, family: ReplayFamily | None) -> list[_Line]:
    """Every non-blank line as a response document of a known provider."""
    try:
        data = _regular_file_bytes(path)
    except OSError as exc:
        raise ReplayInputError(f"{path}: cannot read the file ({exc.strerror})") from exc
    return [
        _document(path, number, raw, family)
        for number, raw in enumerate(data.splitlines(), start=1)
        if raw.strip()
    ]


def _regular_file_bytes(path: Path) -> bytes:
    """The file's bytes, if it is a regular file: a FIFO or a device (``/dev/zero``)
    could block or never end."""
    # Non-blocking, so that opening a FIFO does not wait for a writer.
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise ReplayInputError(f"{path}: not a regular file")
        return file.read()


def _document(path: Path, number: int, raw: bytes, family: ReplayFamily | None) -> _Line:
    where = f"{path}: line {number}"
    try:
        document = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise ReplayInputError(f"{where}: not UTF-8 text") from exc
    except (ValueError, RecursionError) as exc:
        raise ReplayInputError(f"{where}: not a JSON object ({exc})") from exc
    if not isinstance(document, dict):
        raise ReplayInputError(f"{where}: not a JSON object")
    detected = _detect(document)
    if detected is None:
        raise ReplayInputError(
            f"{where}: not a provider response (expected an OpenAI chat completion, "
            "an OpenAI Responses response, or an Anthropic message)"
        )
    if family is not None and detected not in _FAMILIES[family]:
        raise ReplayInputError(f"{where}: the response is {detected}, but --provider is {family}")
    return _Line(number, detected, document)


def _calls(path: Path, line: _Line, names: NameMap, max_argument_bytes: int) -> list[ToolCall]:
    try:
        return FORMATS[line.provider].parse(
            line.document, names, max_argument_bytes=max_argument_bytes
        )
    except ProviderFormatError as exc:
        raise ReplayInputError(f"{path}: line {line.number}: {exc}") from exc


def _detect(document: dict[str, Any]) -> Provider | None:
    """Which provider's response ``document`` is, by the fields each one always has."""
    if "choices" in document or document.get("object") == "chat.completion":
        return "openai-chat"
    if document.get("object") == "response" or ("output" in document and "content" not in document):
        return "openai-responses"
    if document.get("type") == "message" or document.get("role") == "assistant":
        return "anthropic"
    return None


# -- running ----------------------------------------------------------------------------


async def _execute(kernel: Kernel, run: Run, turns: list[_Turn], out: TextIO) -> None:
    for turn in turns:
        results = await kernel.call_many(run, turn.calls) if turn.calls else []
        _emit(
            out,
            [
                {**_where(turn, call), **result.projection()}
                for call, result in zip(turn.calls, results, strict=True)
            ],
        )


def _judge(kernel: Kernel, run: Run, turn: _Turn) -> list[dict[str, Any]]:
    # Kernel.call_many's id rule, within the line only: a real replay runs the lines one
    # after the other, so an id of an earlier line is free again by the next one.
    seen: set[str] = set()
    rows = []
    for index, call in enumerate(turn.calls):
        call_id = call.tool_call_id
        if call_id and call_id in seen:
            rows.append(_repeated(kernel, turn, call, call_id))
            continue
        if call_id:
            seen.add(call_id)
        explained = kernel.explain(run, call.tool_name, call.arguments, version=call.version)
        verdict: Verdict = explained["outcome"]
        code: str | None = explained["errorCode"]
        rows.append(
            {
                **_where(turn, call),
                "verdict": verdict,
                "toolCallId": call_id or f"line{turn.line}-{index}",
                "status": verdict if verdict in _REFUSED else None,
                "errorCode": code,
                # Masked as the kernel masks a refusal (it echoes the proposal).
                "safeMessage": kernel.redactor.redact_text(explained["explanation"], Counter()),
                "structuredOutput": None,
                "artifacts": [],
                "retryable": CATALOG[ErrorCode(code)].retryable if code else False,
            }
        )
    return rows


def _repeated(kernel: Kernel, turn: _Turn, call: ToolCall, call_id: str) -> dict[str, Any]:
    """The row of a call refused for its repeated id, as ``Kernel.call_many`` refuses it."""
    result = ToolCallResult.from_code(call_id, ErrorCode.DUPLICATE_CALL_ID, id=safe_field(call_id))
    # The kernel masks a refusal's message, which echoes the id, before the model sees it.
    message = kernel.redactor.redact_text(result.safe_message, Counter())
    verdict: Verdict = "INVALID_ARGUMENTS"
    return {
        **_where(turn, call),
        "verdict": verdict,
        **result.with_(safe_message=message).projection(),
    }


def _emit(out: TextIO, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        print(json_text(row), file=out)


def _where(turn: _Turn, call: ToolCall) -> dict[str, Any]:
    return {"line": turn.line, "toolName": call.tool_name, "providerCallId": call.tool_call_id}

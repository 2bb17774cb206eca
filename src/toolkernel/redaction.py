"""Redaction of what is bound for the model.

Every string in a result's safe message and structured output passes through
``Redactor.redact``: values the runtime knows to be secret are masked wherever they
appear, the workspace's absolute location is rewritten to workspace-relative form,
and other absolute host paths are masked. Each redaction is counted by kind so it can
be recorded in the ledger and noted in the projection.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

__all__ = ["Redactor"]

HOST_PATH_MASK: Final = "<host-path>"
SECRET_MASK: Final = "[REDACTED]"  # noqa: S105 - the mask, not a secret

# An absolute POSIX path of two or more segments, not part of a URL or a relative path.
_HOST_PATH: Final = re.compile(r"(?<![\w.~/:%-])/(?:[\w.@+-]+/)+[\w.@+-]*")


class Redactor:
    """Masks known secrets and host paths in text and in JSON-like values."""

    def __init__(self, workspace: Path, secrets: Iterable[str] = ()) -> None:
        self.workspace = str(workspace)
        self._secrets = sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)

    def add_secret(self, value: str) -> None:
        """Mask ``value`` from now on (for secrets the runtime itself hands to tools)."""
        if len(value) >= 4 and value not in self._secrets:
            self._secrets.append(value)
            self._secrets.sort(key=len, reverse=True)

    def redact_text(self, text: str, counts: Counter[str]) -> str:
        for secret in self._secrets:
            if secret in text:
                counts["known-secret"] += text.count(secret)
                text = text.replace(secret, SECRET_MASK)
        if self.workspace in text:
            text = re.sub(re.escape(self.workspace) + r"/?", "", text)
            counts["workspace-path"] += 1
        return _HOST_PATH.sub(lambda m: _mask_path(m, counts), text)

    def redact(self, value: Any, counts: Counter[str]) -> Any:
        """A copy of a JSON-like value with every string (keys included) redacted."""
        if isinstance(value, str):
            return self.redact_text(value, counts)
        if isinstance(value, dict):
            return {
                self.redact_text(str(k), counts): self.redact(v, counts) for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.redact(v, counts) for v in value]
        return value


def _mask_path(match: re.Match[str], counts: Counter[str]) -> str:
    counts["host-path"] += 1
    return HOST_PATH_MASK

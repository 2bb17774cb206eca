"""Redaction of what is bound for the model.

Every string in a result's safe message and structured output passes through
``Redactor.redact``; process output can pass through ``StreamRedactor`` chunk by chunk.
A caller that shows only part of a text (a preview, a cut line, output over its budget)
takes that part with ``Redactor.clip``, which masks every secret reaching into it, even
one the cut goes through; ``Redactor.secret_spans`` tells where the secrets of a text are,
for a caller that must map them itself (``artifact.read``, which reads bytes).
Four things are masked, each counted by kind so the kernel can record the redaction
in the ledger and note it in the projection:

- values the runtime knows to be secret (``add_secret``), also base64 and URL-encoded,
  and escaped as JSON or a Python repr writes them;
- secrets found by pattern and entropy (``toolkernel.secrets``): provider token
  formats, private keys (also lines of a key's body read without its BEGIN line),
  JWTs, credentials in assignments, URLs and command lines;
- raw stack traces (Python, Java, Node), replaced by ``[stack trace withheld: N frames]``;
- host paths: the workspace's absolute location becomes workspace-relative, any other
  absolute path becomes ``<host-path>``; also written with escaped slashes (``\\/``).

Speed matters because tool output can be large. The secret rules form one compiled
alternation, but Python's ``re`` would try every alternative at every position of the
text, at about 1 MB/s. So every rule is written to start at a *trigger*: a keyword
(``password``, ``token``, ``://``, …) or the start of a long run of token characters.
Triggers are found with C-speed byte operations (``bytes.lower``, ``bytes.find``,
``bytes.translate``) and the alternation is tried only there, with ``re.match``.
Paths, private key blocks and stack traces use regexes that begin with a literal,
which ``re`` scans for quickly.
"""

from __future__ import annotations

import base64
import bisect
import codecs
import json
import os
import re
import string
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from toolkernel.secrets import SECRET_RULES, Rule

__all__ = [
    "HOST_PATH_MASK",
    "SECRET_MASK",
    "TRACE_MASK",
    "Redactor",
    "StreamRedactor",
    "merged_masks",
    "new_counts",
]

HOST_PATH_MASK: Final = "<host-path>"
SECRET_MASK: Final = "[REDACTED]"  # noqa: S105 - the mask, not a secret
TRACE_MASK: Final = "[stack trace withheld: {frames} frames]"

_MIN_KNOWN: Final = 4  # shorter known values would mask ordinary words
_CONTAINERS: Final = (dict, list, tuple)
_SCALARS: Final = frozenset((int, float, bool))
_CYCLE_DEPTH: Final = 64
_LEAVE: Final = object()  # on the walk's stack: a container's items are all copied
_WHOLE_TEXT_MAX: Final = 1 << 20
_BLOCK: Final = 1 << 16

# --- host paths -----------------------------------------------------------------------

# An absolute POSIX path of two or more segments. The literal "/" comes first so that
# ``re`` can skip to candidates quickly; the lookbehind then rejects a "/" that
# continues a URL (``https://h/a/b``: its first "/" cannot start a segment, the others
# follow "/" or the host), a relative path (``src/a/b``) or a home path. A path after a
# ":" (``PATH=/a/b:/c/d``, ``key:/etc/x``) is masked, and so is a ``file:///`` URI's.
# Segments cannot hold "/", so the greedy match never backtracks: possessive
# quantifiers give the same matches without sre's backtracking bookkeeping.
_HOST_PATH: Final = re.compile(
    r"/(?:(?<![\w.~/%-]/)|(?<=file:///)|(?<=\\[nrtbf]/))[\w.@+-]++/(?:[\w.@+-]++/)*+[\w.@+-]*+"
)
_HOST_SEGMENT: Final = re.compile(r"[\w.@+-]+")  # a segment _HOST_PATH masks whole
# The same start written with escaped slashes, as JSON allows and PHP's json_encode
# writes (``"\/etc\/ssl\/x"``): a run of such segments, which is masked as its
# unescaped form would be. One segment is enough here; the plain patterns decide.
_ESCAPED_PATH: Final = re.compile(
    r"\\/(?:(?<![\w.~/%-]\\/)|(?<=file:\\/\\/\\/)|(?<=\\[nrtbf]\\/))[\w.@+-]++(?:\\/[\w.@+-]*+)*+"
)
# Literal first for speed; the drive letter is checked by the lookbehind and masked too.
# A JSON escape's letter is no drive letter: ``"\r:\u001f…"`` is no path.
_WINDOWS_PATH: Final = re.compile(
    r":\\(?<=(?<![\w/])(?<!\\(?=[bfnrt]))[A-Za-z]:\\)(?:[^\\\s\"'<>|:*?]+\\)+[^\\\s\"'<>|:*?]*"
)

# --- stack traces ---------------------------------------------------------------------

_FRAME_LINE: Final = (
    r"[ \t]+(?:"
    # Java and Node: "at pkg.Cls.method(File.java:12)", "at fn (/x/y.js:1:2)", "at /x.js:1:2"
    r"at [^\n]{1,400}?(?:\([^()\n]*(?::\d+|Native Method|Unknown Source|<anonymous>|index \d+)"
    r"[^()\n]*\)|:\d+:\d+)"
    r"|\.\.\. \d+ (?:more|common frames omitted)"
    # Python: 'File "x.py", line 3, in f' and its indented source and caret lines.
    r"|File \"[^\"\n]+\", line \d+[^\n]*(?:\r?\n[ \t]+(?!File \"|at )[^\n]*)*"
    r")[ \t]*(?:\r?\n|\Z)"
)
_TRACE: Final = re.compile(
    rf"(?:Traceback \(most recent call last\):[ \t]*\r?\n)?(?:{_FRAME_LINE})+"
)
_FRAME_START: Final = re.compile(r"(?m)^[ \t]+(?:at |File \")")
# Literals that start a trace or a frame line; the trace regex is tried only there.
_TRACE_ANCHORS: Final = ("\tat ", "    at ", 'File "')
_TRACE_HEADER: Final = "Traceback (most recent call last):"

# --- secrets by pattern ---------------------------------------------------------------

_PRIVATE_KEY_ANCHORS: Final = ("-----BEGIN", "LS0tLS1CRUdJT")
# A private key's body read without its BEGIN line (some of a file's lines, a search
# hit, ``sed -n 3,8p``) is still the key: lines of nothing but base64, at the widths
# keys are written in (64 characters for PEM, 70 for OpenSSH), holding upper and lower
# case letters and digits, as random key bytes do and a hex digest or a word does not.
# A run of 64 base64 characters, found with ``bytes.translate``, is where to look.
_BASE64_CHARS: Final = string.ascii_letters + string.digits + "+/"
_BASE64_TABLE: Final = bytes(1 if chr(b) in _BASE64_CHARS else 0 for b in range(256))
_KEY_WIDTH: Final = 64
_KEY_RUN: Final = b"\x01" * _KEY_WIDTH
_KEY_LINE: Final = re.compile(r"[ \t]*([A-Za-z0-9+/]{70}|[A-Za-z0-9+/]{64})[ \t]*\r?")
_KEY_LAST_LINE: Final = re.compile(r"[ \t]*[A-Za-z0-9+/]{4,69}={0,2}[ \t]*\r?")
_PLAIN_KEY_RUN: Final = re.compile(f"[{re.escape(_BASE64_CHARS)}]{{{_KEY_WIDTH}}}")
# Every secret rule starts at a trigger: a keyword (searched in the lower-cased text,
# with the offset from the trigger to where the rule starts), or the start of a long
# run of token characters (provider tokens, JWTs, high-entropy values).
_TRIGGERS: Final = (
    (b"pass", 0),
    (b"pwd", 0),
    (b"secret", 0),
    (b"cred", 0),
    (b"token", 0),
    (b"key", 0),
    (b"auth", 0),
    (b"_pat", 1),
    (b"directoryentry", 0),
    # Needles ending in a rare byte are found faster: " -u" rather than "-u ".
    (b" -u", 1),
    (b"://", 0),
    (b"hooks.slack", 0),
    (b"mysql", 0),
    (b"mariadb", 0),
)
# Inflected words that start like a keyword but never name a credential; pytest's
# "PASSED" lines alone would otherwise make most of the candidates in test output.
_INFLECTIONS: Final = (b"passed", b"passes", b"passing", b"keyword", b"keyboard")
# Keywords found by one scan for a part they share (``secret`` and ``cred`` both hold
# ``cre``): each hit of the part is checked for each keyword around it. Every other
# trigger is its own needle. Fewer scans of the block, the same candidates.
_SHARED_NEEDLES: Final = ((b"cre", (b"secret", b"cred")),)
_NEEDLES: Final = (
    *_SHARED_NEEDLES,
    *(
        (trigger, (trigger,))
        for trigger, _ in _TRIGGERS
        if not any(trigger in group for _, group in _SHARED_NEEDLES)
    ),
)
_TRIGGER_OFFSETS: Final = dict(_TRIGGERS)
_RUN_CHARS: Final = string.ascii_letters + string.digits + "_-"
_RUN_LENGTH: Final = 20
_RUN_TABLE: Final = bytes(1 if chr(b) in _RUN_CHARS else 0 for b in range(256))
_RUN: Final = b"\x01" * _RUN_LENGTH
# A token may begin before its first long run: "dp.ct.<run>", "123456:<run>", and
# base64 with "+" and "/" ("0tZn+7QQ/<run>").
_TOKEN_PREFIX: Final = (string.ascii_letters + string.digits + "_-.:+/=").encode()
_TOKEN_PREFIX_MAX: Final = 64
_BINDER: Final = frozenset(b"=:,")
_BINDER_GAP: Final = b" \t\"'`"
# How far past its start a match may reach: a key, a few lines, a long value.
_WINDOW: Final = 1024
_CONTEXT: Final = 64

# The fast path: a short text that holds no anchor of any rule (no trigger keyword in
# any case, no run of token characters, no trace, key-block or path anchor) cannot
# match anything, so it is returned without the full scan. Most safe messages and
# small structured values are such texts. Every anchor below comes from the constants
# the scanners use, so a new trigger also closes the fast path.
_PLAIN_MAX: Final = 1024
# Redactor._plain: texts up to this long, this many at most (then it starts over).
_PLAIN_CACHED: Final = 256
_PLAIN_CACHE_SIZE: Final = 4096
_PLAIN_KEYWORDS: Final = tuple(trigger.decode() for trigger, _ in _TRIGGERS)
_PLAIN_ANCHORS: Final = (*_TRACE_ANCHORS, *_PRIVATE_KEY_ANCHORS, "/", ":\\")
_PLAIN_RUN: Final = re.compile(f"[{re.escape(_RUN_CHARS)}]{{{_RUN_LENGTH}}}")


def new_counts() -> Counter[str]:
    """An empty ``Counter`` for the ``counts`` of a redaction, made without
    ``Counter.__init__``, whose generic update is most of its cost (the kernel makes
    two for every call)."""
    return Counter.__new__(Counter)


def _is_plain(text: str) -> bool:
    """True when no redaction rule can fire anywhere in ``text`` (short texts only)."""
    if len(text) > _PLAIN_MAX:
        return False
    # str.lower maps ASCII as bytes.lower does, so every keyword the byte scan finds
    # is found here too (non-ASCII characters can only add false alarms).
    low = text.lower()
    for keyword in _PLAIN_KEYWORDS:
        if keyword in low:
            return False
    for anchor in _PLAIN_ANCHORS:
        if anchor in text:
            return False
    if len(text) >= _KEY_WIDTH and _PLAIN_KEY_RUN.search(text) is not None:
        return False
    return len(text) < _RUN_LENGTH or _PLAIN_RUN.search(text) is None


class _RuleSet:
    """The secret rules compiled as one alternation, tried at candidate positions."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self._parts: list[str] = []
        self._rules: list[tuple[Rule, list[str]]] = []
        self._index: dict[str, int] = {}
        for index, rule in enumerate(rules):
            name = f"r{index}"
            rename = re.sub(r"\(\?P<(v\d*)>", rf"(?P<{name}\1>", rule.pattern)
            groups = [f"{name}{g}" for g in re.findall(r"\(\?P<(v\d*)>", rule.pattern)]
            self._parts.append(f"(?P<{name}>{rename})")
            self._rules.append((rule, groups))
            self._index[name] = index
        self._tails: dict[int, re.Pattern[str]] = {}

    def _tail(self, first: int) -> re.Pattern[str]:
        """The alternation of rules ``first`` onwards (compiled on first use)."""
        if first not in self._tails:
            self._tails[first] = re.compile("|".join(self._parts[first:]))
        return self._tails[first]

    def match_at(self, text: str, pos: int, end: int) -> tuple[int, int, str] | None:
        """The span to mask and its kind, for the first rule that matches at ``pos``."""
        first = 0
        while first < len(self._rules):
            match = self._tail(first).match(text, pos, end)
            if match is None:
                return None
            assert match.lastgroup is not None  # every alternative is a named group
            index = self._index[match.lastgroup]
            rule, groups = self._rules[index]
            span = next((match.span(g) for g in groups if match.start(g) != -1), match.span())
            if _accept(rule, text, pos, span):
                return span[0], span[1], rule.kind
            first = index + 1  # vetoed: a later rule may still match here
        return None


def _accept(rule: Rule, text: str, pos: int, span: tuple[int, int]) -> bool:
    value = text[span[0] : span[1]]
    if value == SECRET_MASK:
        return False
    if rule.check is not None and not rule.check(value):
        return False
    if rule.context is not None:
        return rule.context(text[max(0, pos - _CONTEXT) : pos])
    return True


_PRIVATE_KEYS: Final = _RuleSet(r for r in SECRET_RULES if r.kind == "private-key")
_SECRETS: Final = _RuleSet(r for r in SECRET_RULES if r.kind != "private-key")
# Kinds that say where a secret was found rather than what it is; a value they mask
# that is also a known token format is reported under that format's kind.
_CONTEXT_KINDS: Final = frozenset(
    ("password-assignment", "secret-assignment", "high-entropy", "auth-header", "url-credentials")
)
_FORMATS: Final = _RuleSet(
    r for r in SECRET_RULES if r.kind not in _CONTEXT_KINDS and r.kind != "private-key"
)


class Redactor:
    """Masks secrets, stack traces and host paths in text and in JSON-like values.

    Args:
        workspace: the workspace root; paths under it are shown relative to it.
        secrets: values the runtime knows to be secret (API keys it injected).
    """

    def __init__(self, workspace: Path, secrets: Iterable[str] = ()) -> None:
        self.workspace = str(workspace)
        self._known: dict[str, None] = {}
        self._variants: list[str] = []
        # Short texts found to hold nothing to mask ("file.read succeeded.", small
        # values): most messages and outputs repeat, and a set lookup is a fraction of
        # a scan. A new secret starts a new set (a text may hold it).
        self._plain: set[str] = set()
        ws = re.escape(self.workspace.rstrip("/") or "/")
        # The literal comes first for a fast scan; the lookbehind then makes sure the
        # workspace is not the tail of a longer path, the lookahead that it ends there.
        self._workspace_inside = re.compile(rf"{ws}/(?<![\w.~/-]{ws}/)(?=[\w.@+-])")
        self._workspace_root = re.compile(rf"{ws}(?<![\w.~/-]{ws})/?(?![\w.@+-])")
        # The generic host-path pattern stops at a space: the workspace's own ancestors
        # with one ("/home/a/My Projects/client x") are masked by name, longest first.
        odd = [
            str(parent)
            for parent in Path(self.workspace).parents
            if parent != parent.parent and _HOST_SEGMENT.fullmatch(parent.name) is None
        ]
        self._odd_prefix = odd[-1] if odd else None
        self._odd_ancestors = (
            re.compile("|".join(rf"{re.escape(a)}(?![\w.@+-])" for a in odd)) if odd else None
        )
        # A home of one segment (/root, /app in many containers) is no path the generic
        # pattern masks (it needs two segments, or "/usr" and "/tmp" in prose would go):
        # the user's own home is masked by name (a full stop after it ends a sentence).
        homes = {os.environ.get("HOME", ""), _home()}
        single = sorted(h.rstrip("/") for h in homes if _ONE_SEGMENT.fullmatch(h))
        # The literal first, as in _HOST_PATH: re then skips to candidates quickly.
        self._homes = (
            re.compile(
                "|".join(
                    # With the path it starts, if any: what _HOST_PATH's pass left of
                    # "/home//home/x" is "<host-path>/home/x", whose head stands alone.
                    rf"{re.escape(h)}(?<![\w.~/%-]{re.escape(h)})(?:/[\w.@+-]*+)*+"
                    rf"(?![\w@+-]|\.[\w.@+-])"
                    for h in single
                )
            )
            if single
            else None
        )
        for value in secrets:
            self.add_secret(value)

    @property
    def max_secret_length(self) -> int:
        """Length of the longest known secret form (streams must carry this much)."""
        return max((len(v) for v in self._variants), default=0)

    @property
    def known_forms(self) -> tuple[str, ...]:
        """Every form of the known secrets that is masked (plain, encoded, escaped),
        longest first: for a store that masks them in what it keeps."""
        return tuple(self._variants)

    def add_secret(self, value: str) -> None:
        """Mask ``value`` from now on (for secrets the runtime itself hands to tools).

        Its URL-encoded and base64 forms are masked too, including the base64 of the
        value inside a longer encoded string (``user:token`` in a Basic header), and the
        value escaped in a JSON string or a Python repr (a quote or backslash in it).
        """
        if len(value) < _MIN_KNOWN or value in self._known:
            return
        self._known[value] = None
        forms = set(self._variants) | _encoded_forms(value)
        self._variants = sorted(forms, key=len, reverse=True)
        self._plain = set()  # after the forms: a scan that sees this set saw them

    def mask_known(self, text: str) -> str:
        """``text`` with the known secrets masked, and nothing else: for what is kept for
        audit (a tool's traceback), where a token found by its shape and a host path
        are evidence, but a secret the runtime handed out is not."""
        return self._mask_known(text, Counter()) if self._variants else text

    def redact_text(self, text: str, counts: Counter[str]) -> str:
        """``text`` with every secret, stack trace and host path masked.

        Args:
            text: any text bound for the model.
            counts: incremented per redaction, by kind (``github-token``,
                ``known-secret``, ``stack-trace``, ``host-path``, …).
        """
        plain = self._plain  # before the forms are read: see add_secret
        if len(text) <= _PLAIN_CACHED and text in plain:
            return text
        if len(text) > _WHOLE_TEXT_MAX:
            return self._redact_blocks(text, counts)
        masked = self._mask_known(text, counts)
        if _is_plain(masked) and self.workspace not in masked:
            if masked is text and len(text) <= _PLAIN_CACHED:
                if len(plain) >= _PLAIN_CACHE_SIZE:
                    plain.clear()
                plain.add(text)
            return masked
        text = masked
        text = _mask_traces(text, counts)
        text = _mask_private_keys(text, counts)
        text = _mask_secrets(text, counts)
        return self._mask_paths(text, counts)

    def _redact_blocks(self, text: str, counts: Counter[str]) -> str:
        """A large text in line-aligned blocks that stay in the CPU cache.

        On tens of megabytes this is faster than whole-text passes. The blocks are
        exactly those a ``StreamRedactor`` fed ``_BLOCK``-sized chunks would redact,
        but cut from ``text`` by index, without building and re-slicing its buffer.
        """
        hold = max(_DEFAULT_HOLD, 2 * self.max_secret_length)
        max_line = max(_MAX_LINE, hold)
        out: list[str] = []
        done = 0
        for end in range(_BLOCK, len(text) + _BLOCK, _BLOCK):
            cut = _cut_point(text, done, min(end, len(text)), hold, max_line)
            if cut > done:
                out.append(self.redact_text(text[done:cut], counts))
                done = cut
        if done < len(text):
            out.append(self.redact_text(text[done:], counts))
        return "".join(out)

    def redact(self, value: Any, counts: Counter[str]) -> Any:
        """A copy of a JSON-like value with every string (keys included) redacted.

        Dicts stay dicts, lists and tuples become lists, other values are kept as they
        are. The value is walked with an explicit stack, not by recursion, so no depth
        of nesting can exhaust Python's recursion limit.

        Raises:
            ValueError: the value contains itself (a cycle has no finite copy).
        """
        if isinstance(value, str):
            return self.redact_text(value, counts)
        if not isinstance(value, _CONTAINERS):
            return value
        text = self.redact_text
        copy: dict[str, Any] | list[Any] = {} if isinstance(value, dict) else []
        # A child container's copy is put in place at once and filled when its turn on
        # the stack comes, so the order in which the stack is worked off does not
        # matter; each container's own items are taken in order. Of two keys that
        # redact alike (two tokens), the second is numbered, so no entry is lost. Exact
        # types are tested first: isinstance on every JSON scalar would cost more than
        # the walk.
        stack: list[tuple[Any, Any, int]] = [(value, copy, 1)]
        child: dict[str, Any] | list[Any]
        # Only a cycle makes the walk endless, and an endless walk goes deeper than any
        # depth: so the containers being copied are tracked from _CYCLE_DEPTH down, and
        # the usual shallow value pays nothing for it.
        open_below: set[int] = set()
        numbered: dict[tuple[int, str], int] = {}  # (dict, key) -> the next number to try
        while stack:
            source, target, depth = stack.pop()
            if depth >= _CYCLE_DEPTH:
                if source is _LEAVE:
                    open_below.discard(target)
                    continue
                if id(source) in open_below:
                    raise ValueError("the value contains itself")
                open_below.add(id(source))
                stack.append((_LEAVE, id(source), depth))
            if isinstance(source, dict):
                for original, item in source.items():
                    key = text(original if type(original) is str else _json_key(original), counts)
                    if key in target:  # two keys that redact (or spell) alike
                        key = _distinct(key, target, numbered)
                    kind = type(item)
                    if kind is str:
                        target[key] = text(item, counts)
                    elif kind in _SCALARS or item is None:
                        target[key] = item
                    elif isinstance(item, str):
                        target[key] = text(item, counts)
                    elif isinstance(item, _CONTAINERS):
                        target[key] = child = {} if isinstance(item, dict) else []
                        stack.append((item, child, depth + 1))
                    else:
                        target[key] = item
            else:
                append = target.append
                for item in source:
                    kind = type(item)
                    if kind is str:
                        append(text(item, counts))
                    elif kind in _SCALARS or item is None:
                        append(item)
                    elif isinstance(item, str):
                        append(text(item, counts))
                    elif isinstance(item, _CONTAINERS):
                        child = {} if isinstance(item, dict) else []
                        append(child)
                        stack.append((item, child, depth + 1))
                    else:
                        append(item)
        return copy

    def secret_spans(self, text: str) -> list[tuple[int, int, str]]:
        """Where ``text`` holds secrets: ``(start, end, kind)`` spans of ``text`` itself.

        For callers that show part of a text and must mask what its edges cut through.
        The spans are those ``redact_text`` masks as known secrets, private keys and
        secrets found by pattern, found the same way: pass after pass, each on the text
        the passes before have masked (a span that takes in a mask reaches over what
        that mask hides, so spans can overlap). Sorted by start. Stack traces and paths
        are not looked for, so a secret inside a trace is reported too. A text over
        1 MiB is taken whole, where ``redact_text`` works through it in blocks.
        """
        masked = _Masked(text)
        spans: list[_Replacement] = []
        for form in self._variants:
            at = masked.text.find(form)
            if at == -1:
                continue
            found: list[_Replacement] = []
            while at != -1:  # left to right without overlap, as str.replace goes
                found.append((at, at + len(form), "known-secret"))
                at = masked.text.find(form, at + len(form))
            spans += masked.mask(found)
        for finder in (_private_key_spans, _secret_spans):
            if found := _disjoint(finder(_unescaped(masked.text))):
                spans += masked.mask(found)
        spans.sort()
        return spans

    def clip(self, text: str, start: int, end: int, counts: Counter[str]) -> str:
        """``text[start:end]``, for a caller that shows only part of a text.

        A cut through a secret, or between a keyword (``password=``) and its value,
        leaves a piece no rule recognises. So the secrets are looked for
        (``secret_spans``) in the range widened on each side by more than any secret
        reaches (back to a private key's BEGIN line up to 16 KiB before it), and each
        one that reaches into the range is masked there and counted in ``counts`` by
        kind. A host path an edge of the range cuts through is masked
        as ``<host-path>``: cut, it may no longer look like one. The part still needs
        ``redact_text``, for the stack traces and host paths inside it.

        Args:
            text: the whole text.
            start: where the part starts (clamped to the text).
            end: where the part ends, exclusive (clamped to the text).
            counts: incremented per secret or host path masked, by kind.
        """
        start, end = max(0, start), min(len(text), end)
        if end <= start:
            return ""
        reach = max(_CLIP_REACH, self.max_secret_length)
        low = max(0, start - reach)
        far = max(0, start - _KEY_REACH)
        # A private key block may run into the range from a BEGIN line further back.
        if low > far and any(
            text.find(a, far, low + len(a) - 1) != -1 for a in _PRIVATE_KEY_ANCHORS
        ):
            low = far
        window = text[low : end + reach]
        first, last = start - low, end - low
        found = [(s, e, k, SECRET_MASK) for s, e, k in self.secret_spans(window)]
        found += [
            (s, e, "host-path", HOST_PATH_MASK)
            for s, e in _path_spans(window)
            if s < first < e or s < last < e
        ]
        pieces: list[str] = []
        done = first
        for begin, stop, mask in merged_masks(found, first, last, counts):
            pieces += [window[done:begin], mask]
            done = stop
        pieces.append(window[done:last])
        return "".join(pieces)

    def _mask_known(self, text: str, counts: Counter[str]) -> str:
        for form in self._variants:
            if form in text:
                counts["known-secret"] += text.count(form)
                text = text.replace(form, SECRET_MASK)
        return text

    def _mask_paths(self, text: str, counts: Counter[str]) -> str:
        # memchr finds that a text holds no backslash; where one is, sre skips to the
        # next at that speed too ('"\\/" in text' would stop at every "/").
        if "\\" in text:
            text = _ESCAPED_PATH.sub(lambda run: self._mask_escaped(run.group(), counts), text)
        # Fixed replacement strings (no callback) keep this fast on path-heavy logs.
        workspace = self.workspace
        if workspace in text:
            before = text
            text, inside = self._workspace_inside.subn("", text)
            # The root pattern begins with the workspace itself, so it can only match
            # when an occurrence is left; only then is counting them worth a scan.
            if workspace in text and inside < before.count(workspace):
                text, root = self._workspace_root.subn(".", text)
                inside += root
            if inside:
                counts["workspace-path"] += inside
        if self._odd_prefix is not None and self._odd_prefix in text:
            assert self._odd_ancestors is not None
            text, masked = self._odd_ancestors.subn(HOST_PATH_MASK, text)
            if masked:
                counts["host-path"] += masked
        if "/" in text:
            text, masked = _HOST_PATH.subn(HOST_PATH_MASK, text)
            if self._homes is not None and "/" in text:  # what is left of a one-segment home
                text, home = self._homes.subn(HOST_PATH_MASK, text)
                masked += home
            if masked:
                counts["host-path"] += masked
        if _has_drive_anchor(text):
            spans = [(m.start() - 1, m.end(), "host-path") for m in _WINDOWS_PATH.finditer(text)]
            text = _apply(text, spans, counts, HOST_PATH_MASK)
        return text

    def _mask_escaped(self, run: str, counts: Counter[str]) -> str:
        """A path written with escaped slashes, masked as written plainly, escaped again
        (a workspace path stays valid JSON: ``src\\/app.py``)."""
        return self._mask_paths(run.replace("\\/", "/"), counts).replace("/", "\\/")


def merged_masks(
    spans: Iterable[tuple[int, int, str | None, str]],
    first: int,
    last: int,
    counts: Counter[str],
) -> list[tuple[int, int, str]]:
    """The masks to lay over ``[first, last)`` of a text: each ``(start, end, kind,
    mask)`` span that reaches into it, clamped to it, in order; overlapping or adjacent
    ones become one (a secret's mask wins over a path's). Each span used is counted in
    ``counts`` by its kind (a kind of None is not counted)."""
    masked: list[tuple[int, int, str]] = []
    for begin, stop, kind, mask in sorted(spans, key=lambda span: span[:2]):
        if stop <= first or begin >= last:
            continue
        if kind is not None:
            counts[kind] += 1
        begin, stop = max(begin, first), min(stop, last)
        if masked and begin <= masked[-1][1]:
            before, until, shown = masked[-1]
            strongest = SECRET_MASK if SECRET_MASK in (shown, mask) else mask
            masked[-1] = (before, max(until, stop), strongest)
        else:
            masked.append((begin, stop, mask))
    return masked


_ONE_SEGMENT: Final = re.compile(r"/[\w.@+-]+/?")
_CLIP_REACH: Final = 2 * _WINDOW
"""Characters searched on each side of a clipped range: more than a rule's match and
the context it looks back on reach."""
_KEY_REACH: Final = 16 * 1024
"""How far before a clipped range a private key's BEGIN line is looked for: its block
runs some 12 KiB to its END line."""


def _path_spans(text: str) -> list[tuple[int, int]]:
    """Where ``text`` holds host paths, plain, with escaped slashes, or Windows'."""
    spans = [m.span() for m in _HOST_PATH.finditer(text)]
    if "\\" in text:
        spans += [m.span() for m in _ESCAPED_PATH.finditer(text)]
        # The Windows pattern starts at the colon; the span takes in the drive letter.
        spans += [(m.start() - 1, m.end()) for m in _WINDOWS_PATH.finditer(text)]
    return spans


def _home() -> str:
    try:
        return str(Path.home())
    except RuntimeError:  # no HOME and no passwd entry
        return ""


def _has_drive_anchor(text: str) -> bool:
    """``":\\" in text``, found faster: backslashes are rare and memchr finds them."""
    at = text.find("\\", 1)  # a backslash at 0 has no drive colon before it
    for _ in range(16):
        if at == -1:
            return False
        if text[at - 1] == ":":
            return True
        at = text.find("\\", at + 1)
    return at != -1 and text.find(":\\", at - 1) != -1


def _encoded_forms(value: str) -> set[str]:
    """``value`` as it may appear in output: plain, URL-encoded, base64 (any offset), and
    inside a string literal as JSON (``json.dumps``, jq; PHP also escapes "/") or a
    Python repr (a printed dict, an assertion message) writes it."""
    forms = {value} | _url_encoded_forms(value)
    as_json = json.dumps(value)[1:-1]
    forms |= {
        as_json,
        as_json.replace("/", "\\/"),
        json.dumps(value, ensure_ascii=False)[1:-1],
        repr(value)[1:-1],
    }
    raw = value.encode()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode()
        # Keep only the characters fixed by the value's own bits, so the form is found
        # whatever bytes precede or follow it in a longer encoded string.
        first = -(-8 * offset // 6)
        last = 8 * (offset + len(raw)) // 6
        core = encoded[first:last]
        forms.add(core)
        forms.add(core.replace("+", "-").replace("/", "_"))
    return {f for f in forms if len(f) >= _MIN_KNOWN}


# What URL encoders leave unescaped besides letters, digits and "_.-~": nothing
# (quote(safe="")), "/" (Python's quote() by default), "!*'()" (JavaScript's
# encodeURIComponent); quote_plus and form encoding also write spaces as "+".
_URL_SAFE_SETS: Final = ("", "/", "!*'()")
_PERCENT_HEX: Final = re.compile(r"%[0-9A-F]{2}")


def _url_encoded_forms(value: str) -> set[str]:
    """``value`` as common URL encoders write it, with upper- and lowercase hex."""
    forms = set()
    for safe in _URL_SAFE_SETS:
        forms.add(urllib.parse.quote(value, safe=safe))
        forms.add(urllib.parse.quote_plus(value, safe=safe))
    return forms | {_PERCENT_HEX.sub(lambda m: m[0].lower(), form) for form in forms}


def _mask_traces(text: str, counts: Counter[str]) -> str:
    # One scan per anchor finds the lines to try; the tab anchor is looked for only
    # when the text has a tab at all (memchr speed), which most output has not.
    starts = _line_starts_of(text, _TRACE_ANCHORS if "\t" in text else _TRACE_ANCHORS[1:])
    if not starts:
        return text
    out: list[str] = []
    done = 0
    for start in starts:
        if start < done:
            continue
        match = _TRACE.match(text, start)
        if match is None:
            continue
        # Take the header line into the block when it sits just above the first frame.
        header = start - len(_TRACE_HEADER) - 1
        if text.startswith(_TRACE_HEADER, header) and header >= done:
            start = header
        frames = len(_FRAME_START.findall(match.group()))
        if frames == 0:
            continue
        newline = "\n" if match.group().endswith("\n") else ""
        out += [text[done:start], TRACE_MASK.format(frames=frames), newline]
        counts["stack-trace"] += 1
        done = match.end()
    return "".join(out) + text[done:] if out else text


def _line_starts_of(text: str, anchors: Iterable[str]) -> list[int]:
    """Sorted starts of the lines on which any anchor occurs."""
    starts: set[int] = set()
    for anchor in anchors:
        at = text.find(anchor)
        while at != -1:
            line_start = text.rfind("\n", 0, at) + 1
            starts.add(line_start)
            line_end = text.find("\n", at)
            at = -1 if line_end == -1 else text.find(anchor, line_end)
    return sorted(starts)


def _mask_private_keys(text: str, counts: Counter[str]) -> str:
    return _apply(text, _private_key_spans(text), counts)


def _private_key_spans(text: str) -> list[_Replacement]:
    found: list[_Replacement] = []
    for anchor in _PRIVATE_KEY_ANCHORS:
        at = text.find(anchor)
        while at != -1:
            hit = _PRIVATE_KEYS.match_at(text, at, len(text))
            if hit is not None:
                found.append(hit)
            at = text.find(anchor, at + 1 if hit is None else hit[1])
    found += _key_body_spans(text)
    found.sort()
    # A key found from its anchor and as body lines (a base64-encoded PEM starts with
    # the encoded BEGIN line) is one span: where they overlap, both reach are masked.
    merged: list[_Replacement] = []
    for start, end, kind in found:
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]), kind)
        else:
            merged.append((start, end, kind))
    return merged


def _key_body_spans(text: str) -> list[_Replacement]:
    """Runs of consecutive key-body lines (with the shorter line that ends a key), each
    a span; a whole key block found from its anchor covers those inside it."""
    runs = text.encode("latin-1", "replace").translate(_BASE64_TABLE)
    found: list[_Replacement] = []
    block: list[int] = []  # start and end of the current run of key lines
    at = runs.find(_KEY_RUN)
    while at != -1:
        start = text.rfind("\n", 0, at) + 1
        end = text.find("\n", at)
        end = len(text) if end == -1 else end
        line = _KEY_LINE.fullmatch(text, start, end)
        if line is not None and _random_looking(line.group(1)):
            if block and block[1] + 1 == start:
                block[1] = end
            else:
                if block:
                    found.append(_key_block(text, *block))
                block = [start, end]
        at = runs.find(_KEY_RUN, end)
    if block:
        found.append(_key_block(text, *block))
    return found


def _key_block(text: str, start: int, end: int) -> _Replacement:
    """The span of key lines ``start:end``, with the short last line of the key if one
    follows: base64 that is padded, looks random, or comes right before the END line
    (not a word such as "done")."""
    if end < len(text):
        after = text.find("\n", end + 1)
        after = len(text) if after == -1 else after
        last = _KEY_LAST_LINE.fullmatch(text, end + 1, after)
        if last is not None and (
            last.group().rstrip().endswith("=")
            or _random_looking(last.group())
            or text.startswith("-----END", after + 1)
        ):
            end = after
    return (start, end, "private-key")


def _random_looking(line: str) -> bool:
    return line.lower() != line and line.upper() != line and any(c.isdigit() for c in line)


def _mask_secrets(text: str, counts: Counter[str]) -> str:
    return _apply(text, _secret_spans(_unescaped(text)), counts)


# A secret in JSON text follows an escape (``"line\\nAKIA…"``): the escape's letter would
# read as part of the word before it, and the rules' start boundaries would not see one.
# The rules scan a copy of the same length with each escape blanked (its backslash
# kept); the spans found there are masked in the text itself.
_JSON_ESCAPE: Final = re.compile(r'\\[nrtbf"/\\]')
_JSON_UNICODE_ESCAPE: Final = re.compile(r"\\u[0-9A-Fa-f]{4}")


def _unescaped(text: str) -> str:
    if "\\" not in text:
        return text
    # Fixed replacements (a backslash, then blanks): no Python call per escape.
    text = _JSON_ESCAPE.sub(r"\\ ", text)
    return _JSON_UNICODE_ESCAPE.sub(r"\\     ", text) if "\\u" in text else text


def _secret_spans(text: str) -> list[_Replacement]:
    found: list[_Replacement] = []
    done = 0
    for pos in _candidates(text):
        if pos < done:
            continue
        hit = _SECRETS.match_at(text, pos, pos + _WINDOW)
        if hit is not None:
            start, end, kind = hit
            if kind in _CONTEXT_KINDS:
                exact = _FORMATS.match_at(text, start, end)
                if exact is not None and exact[:2] == (start, end):
                    kind = exact[2]
            found.append((start, end, kind))
            done = end
    return found


def _candidates(text: str) -> list[int]:
    """Sorted positions where a secret rule may start, found at C speed."""
    # One byte per character, so byte offsets are character offsets.
    raw = text.encode("latin-1", "replace")
    low = raw.lower()
    found: list[int] = []
    add = found.append
    for needle, triggers in _NEEDLES:
        at = low.find(needle)
        if at == -1:
            continue
        if triggers[0] == needle:
            offset = _TRIGGER_OFFSETS[needle]
            while at != -1:
                if not low.startswith(_INFLECTIONS, at):
                    add(at + offset)
                at = low.find(needle, at + 1)
            continue
        while at != -1:
            for trigger in triggers:
                begin = at - trigger.index(needle)
                if (
                    begin >= 0
                    and low.startswith(trigger, begin)
                    and not low.startswith(_INFLECTIONS, begin)
                ):
                    add(begin + _TRIGGER_OFFSETS[trigger])
            at = low.find(needle, at + 1)
    runs = raw.translate(_RUN_TABLE)
    at = runs.find(_RUN)
    while at != -1:
        add(at)
        # bytes.rstrip walks back over a character set at C speed.
        before = raw[max(0, at - _TOKEN_PREFIX_MAX) : at]
        start = at - (len(before) - len(before.rstrip(_TOKEN_PREFIX)))
        for begin in {at, start}:
            if begin != at:
                add(begin)
            gap = raw[max(0, begin - 4) : begin]
            binder = begin - 1 - (len(gap) - len(gap.rstrip(_BINDER_GAP)))
            if binder >= 0 and raw[binder] in _BINDER:
                add(binder)
        run_end = runs.find(b"\x00", at)
        at = -1 if run_end == -1 else runs.find(_RUN, run_end)
    found.sort()
    return found


_Replacement = tuple[int, int, str]


def _disjoint(found: list[_Replacement]) -> list[_Replacement]:
    """The spans of sorted ``found`` that ``_apply`` masks (it skips overlapping ones)."""
    kept: list[_Replacement] = []
    done = 0
    for span in found:
        if span[0] >= done:
            kept.append(span)
            done = span[1]
    return kept


class _Masked:
    """A text masked pass by pass as ``redact_text`` masks it, with the way back.

    ``text`` is the original with every stretch masked so far replaced by the mask;
    ``mask`` takes spans of ``text`` and returns them as spans of the original.
    """

    def __init__(self, original: str) -> None:
        self.original = self.text = original
        self._stretches: list[tuple[int, int]] = []  # of the original: sorted, disjoint
        self._starts: list[int] = []  # where each stretch's mask starts in ``text``

    def mask(self, found: list[_Replacement]) -> list[_Replacement]:
        """Mask sorted, disjoint spans of ``text``; return them as spans of the original."""
        spans = [
            (self._origin(s, start=True), self._origin(e, start=False), k) for s, e, k in found
        ]
        stretches: list[tuple[int, int]] = []
        # Masks that a new span overlaps become one; masks that only touch stay two.
        for start, end in sorted([*self._stretches, *((s, e) for s, e, _ in spans)]):
            if stretches and start < stretches[-1][1]:
                stretches[-1] = (stretches[-1][0], max(stretches[-1][1], end))
            else:
                stretches.append((start, end))
        out: list[str] = []
        self._starts = []
        done = length = 0
        for start, end in stretches:
            out += [self.original[done:start], SECRET_MASK]
            length += start - done
            self._starts.append(length)
            length += len(SECRET_MASK)
            done = end
        out.append(self.original[done:])
        self.text, self._stretches = "".join(out), stretches
        return spans

    def _origin(self, at: int, *, start: bool) -> int:
        """Where position ``at`` of ``text`` is in the original; inside a mask, the
        start or the end of what it masks."""
        before = bisect.bisect_right if start else bisect.bisect_left
        index = before(self._starts, at) - 1
        if index < 0:
            return at
        mask_end = self._starts[index] + len(SECRET_MASK)
        masked_start, masked_end = self._stretches[index]
        if at < mask_end or (not start and at == mask_end):
            return masked_start if start else masked_end
        return at - mask_end + masked_end


def _apply(
    text: str, found: list[_Replacement], counts: Counter[str], mask: str = SECRET_MASK
) -> str:
    if not found:
        return text
    out: list[str] = []
    done = 0
    for start, end, kind in found:
        if start < done:
            continue
        out += [text[done:start], mask]
        counts[kind] += 1
        done = end
    out.append(text[done:])
    return "".join(out)


# --- streaming ------------------------------------------------------------------------

_DEFAULT_HOLD: Final = 4096
_MAX_LINE: Final = 64 * 1024


class StreamRedactor:
    """Redacts output that arrives in chunks, as a process writes it.

    A secret split across two chunks is still masked: the end of what has arrived is
    held back (``hold`` characters, at least the longest known secret, and up to the
    last line break) until more arrives or the stream is closed. Memory stays bounded
    by the chunk size plus ``max_line``.

    Args:
        redactor: the redactor whose rules and known secrets apply.
        hold: characters always held back, at least.
        max_line: the longest line kept whole; a longer line is cut at a blank.
    """

    def __init__(
        self, redactor: Redactor, *, hold: int = _DEFAULT_HOLD, max_line: int = _MAX_LINE
    ) -> None:
        self.redactor = redactor
        self.counts: Counter[str] = Counter()
        self._hold = hold
        self._max_line = max(max_line, hold)
        self._buffer = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, chunk: bytes | str) -> str:
        """Take the next chunk; return the redacted text that is now final."""
        self._buffer += self._decoder.decode(chunk) if isinstance(chunk, bytes) else chunk
        cut = self._cut()
        if cut == 0:
            return ""
        ready, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return self.redactor.redact_text(ready, self.counts)

    def close(self) -> str:
        """End of stream: return the redacted rest."""
        rest = self._buffer + self._decoder.decode(b"", final=True)
        self._buffer = ""
        return self.redactor.redact_text(rest, self.counts) if rest else ""

    def redact_chunks(self, chunks: Iterable[bytes | str]) -> Iterator[str]:
        """Redact a whole stream of chunks, yielding text as it becomes final."""
        for chunk in chunks:
            if text := self.feed(chunk):
                yield text
        if text := self.close():
            yield text

    def _cut(self) -> int:
        """Where the final part of the buffer ends: a line break before the held tail."""
        hold = max(self._hold, 2 * self.redactor.max_secret_length)
        return _cut_point(self._buffer, 0, len(self._buffer), hold, self._max_line)


def _cut_point(text: str, start: int, end: int, hold: int, max_line: int) -> int:
    """Where the final part of ``text[start:end]`` ends (an index; ``start`` for none).

    A line break before the last ``hold`` characters; in a line longer than
    ``max_line``, a blank. An unfinished private key block stays with its BEGIN line.
    """
    limit = end - hold
    if limit <= start:
        return start
    newline = text.rfind("\n", start, limit)
    if newline != -1:
        cut = newline + 1
    else:
        if end - start <= max_line:
            return start
        # A huge line without breaks: cut at a blank, which no token spans.
        cut = max(text.rfind(" ", start, limit), text.rfind("\t", start, limit)) + 1
        if cut == 0:
            cut = limit
    # Keep an unfinished private key block together with its BEGIN line.
    begin = text.rfind("-----BEGIN", start, cut)
    if begin != -1 and text.find("-----END", begin, cut) == -1 and end - begin <= max_line:
        cut = text.rfind("\n", start, begin) + 1 or start
    return cut


def _distinct(key: str, taken: Mapping[str, Any], numbered: dict[tuple[int, str], int]) -> str:
    """``key`` numbered (``[REDACTED] (2)``) so that it is not among ``taken``; where the
    numbering of ``key`` in ``taken`` goes on is kept in ``numbered``."""
    number = numbered.get((id(taken), key), 2)
    while f"{key} ({number})" in taken:
        number += 1
    numbered[(id(taken), key)] = number + 1
    return f"{key} ({number})"


def _json_key(key: Any) -> str:
    """A non-string key as JSON writes it (``True`` → ``"true"``, ``None`` → ``"null"``)."""
    if key is None or isinstance(key, bool | float):
        return json.dumps(key)
    return str(key)

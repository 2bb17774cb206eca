"""Secret-detection rules: provider token formats, credentials in context, entropy.

The rules are our own regular expressions, written from the public documentation of
each token format (prefixes, alphabets, lengths) and the usual shapes of credentials in
configuration, shell commands, URLs and source code. ``Redactor`` compiles them, with
the path and stack-trace rules, into one alternation so text is scanned once.

Each ``Rule`` names the *kind* it reports and, through groups named ``v`` (``v1``,
``v2``, …), which part of its match is the secret: the context around it (the
``password=`` or ``Bearer`` that made the value suspicious) stays readable. A rule with
no value group masks its whole match. ``check``, where set, gets the secret candidate
and may veto it (entropy and character-mix tests a regex cannot express).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "SECRET_RULES",
    "Rule",
    "keyed",
    "looks_random",
    "plausible_secret",
    "random_in_context",
    "shannon_entropy",
    "token_shaped",
]


@dataclass(frozen=True, slots=True)
class Rule:
    """One detector: a regex fragment, the kind it reports and optional vetoes.

    ``check`` gets the secret candidate; ``context`` gets the text just before the
    match (the rest of its line, up to 64 characters).
    """

    kind: str
    pattern: str
    check: Callable[[str], bool] | None = None
    context: Callable[[str], bool] | None = None


def shannon_entropy(value: str) -> float:
    """Bits of Shannon entropy per character of ``value`` (0.0 for the empty string)."""
    if not value:
        return 0.0
    total = len(value)
    return -sum(n / total * math.log2(n / total) for n in Counter(value).values())


def token_shaped(value: str) -> bool:
    """True for values that look generated: letters and digits mixed, not a word.

    Weak keywords (``key``, ``token``, ``auth``) also name plenty of ordinary
    identifiers, so their values must look like a credential before we mask them.
    """
    stripped = value.strip("\"'`")
    if len(stripped) < 8 or stripped.isalpha() or stripped.startswith("$"):
        return False
    if not plausible_secret(stripped):
        return False
    has_digit = any(c.isdigit() for c in stripped)
    has_alpha = any(c.isalpha() for c in stripped)
    if has_digit and has_alpha:
        return True
    # Long mixed-case runs without digits still look random (base64 of bytes).
    return len(stripped) >= 20 and shannon_entropy(stripped) >= 4.0


def plausible_secret(value: str) -> bool:
    """False for values of a password-like key that are plainly not the secret itself.

    A URL without user info, or a dotted attribute chain (``settings.DB_PASSWORD``),
    names where the secret lives; masking it would only hide useful text.
    """
    stripped = value.strip("\"'` \t")
    if not stripped or stripped.lower() in _NON_VALUES:
        return False
    if "://" in stripped and "@" not in stripped:
        return False
    # The neighbours of a string literal (``"pw: " + get_pw() + ","``), a label
    # ("Password:") or a path are not the secret.
    if stripped[0] in "+./,;)" or stripped[-1] in "+.":
        return False
    if stripped[-1] == ":" and _LABEL.search(stripped):
        return False
    return _ATTRIBUTE_CHAIN.fullmatch(stripped) is None


def keyed(before: str) -> bool:
    """True when the text before a binder ends in a key that may name a secret."""
    key = _KEY_BEFORE.search(before)
    return key is not None and _HASH_KEY.search(key.group()) is None


def random_in_context(value: str) -> bool:
    """True for a long generated-looking value assigned to any key (hex included).

    UUIDs are let through: they are identifiers far more often than credentials, and
    the credential kinds that use them (Heroku, Postmark) come with a keyword.
    """
    if len(value) < 32 or _UUID.fullmatch(value):
        return False
    if _HEX.fullmatch(value):
        return any(c.isalpha() for c in value) and shannon_entropy(value) >= 3.0
    # Otherwise base64-like: upper, lower and digits all present, as in random bytes,
    # unlike identifiers (``ws_plugin_s3_access_key``) and paths.
    counts = (
        sum(map(str.isupper, value)),
        sum(map(str.islower, value)),
        sum(map(str.isdigit, value)),
    )
    return min(counts) >= 2 and shannon_entropy(value) >= 4.0


def looks_random(value: str) -> bool:
    """True for long free-standing tokens that are almost surely generated secrets.

    Pure hex is refused on purpose: commit ids and content hashes fill an agent's
    tool output and are not secrets. So are identifiers, paths and words: a candidate
    needs upper case, lower case and digits, and high entropy.
    """
    core = value.rstrip("=")
    if len(core) < 32:
        return False
    uppers = sum(map(str.isupper, core))
    lowers = sum(map(str.islower, core))
    digits = sum(map(str.isdigit, core))
    if min(uppers, lowers, digits) < 2:
        return False
    return shannon_entropy(core) >= 4.2


_ATTRIBUTE_CHAIN: Final = re.compile(r"[A-Za-z_$]+(?:\.[A-Za-z_$]+)+")
_KEY_BEFORE: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,60}[\"'`\]]?[ \t]*\Z")
_HASH_KEY: Final = re.compile(
    r"(?i)hash|sha|digest|checksum|sum|etag|commit|integrity|md5|fingerprint|revision|version"
)
_NETRC_LOGIN: Final = re.compile(r"\blogin[ \t]+\S+\s+\Z")
_LABEL: Final = re.compile(r"(?i)pass|pwd|secret|token|key")
_HEX: Final = re.compile(r"[0-9a-fA-F]+")
_NON_VALUES: Final = frozenset(
    ("null", "none", "nil", "undefined", "true", "false", "''", '""', "***", "changeme")
)
_UUID: Final = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")

# A value that must not be masked again (keeps redaction idempotent) or is only a
# reference to a secret held elsewhere.
_NOT_A_VALUE: Final = r"(?!\[REDACTED\]|<host-path>|\$\{|\{\{|<%|%\()"

# Strong keywords: whatever is assigned to them is a credential.
_STRONG: Final = r"(?i:pass(?:word|wd|phrase)?|pwd|secret|credentials?)"
# Weak keywords: the value must also look generated (``token_shaped``).
_WEAK_WORDS: Final = (
    "pat|token|api[_.-]?key|apikey|key|auth|sid|license|signature|access|login|webhook"
)
# A weak keyword must be a word of the identifier (``API_KEY``, ``apiKey``), not part
# of a longer word (``keyboard``, ``monkey``, ``tokens``).
_WEAK: Final = (
    rf"(?:(?<![A-Za-z])(?i:{_WEAK_WORDS})|(?<=[a-z0-9])(?:Token|Api[_.-]?Key|Key|Auth|Sid"
    r"|License|Signature|Access|Login|Webhook|Pat))(?![a-z])"
)
# The rest of an identifier around a keyword: ``AWS_SECRET_ACCESS_KEY``, ``db.password``.
_IDENT_TAIL: Final = r"[A-Za-z0-9_.-]{0,40}+"
# Binders between a key and its value, in config, code, env files, YAML and JSON.
# "is" binds a value, but not a word of prose after it ("Property 'password' is not
# accepted", "the secret is required"): such a word is never the secret.
_PROSE_AFTER_IS: Final = (
    r"(?![ \t]+(?i:not|required|optional|missing|invalid|incorrect|wrong|empty|unset"
    r"|expired|an?|the|too|also|now|still|being|used|stored|set)\b)"
)
_BIND: Final = (
    rf"""(?:["'`]?\]?[ \t]*(?:=>|:=|==|!=|=|:|\bis\b{_PROSE_AFTER_IS})[ \t]*"""
    # ``define('DB_PASSWORD', 'x')``, ``setdefault("API_KEY", "x")``: key, comma, value.
    r"""|["'][ \t]*,[ \t]*(?=["'])["']?)"""
)
# A value: quoted (any characters but the quote and newline), or bare up to a
# delimiter. Bare values followed by ``(``/``[``/``.name`` are code, not literals (a
# mask a known secret left right after the value is no ``[`` of code).
_QUOTED: Final = (
    r"""\\?"(?P<v1>[^"\n]{1,200}?)\\?"|'(?P<v2>[^'\n]{1,200}?)'|`(?P<v3>[^`\n]{1,200}?)`"""
)
_BARE: Final = r"""(?P<v4>[^\s"'`,;&<>(){}\[\]]{1,200}+)(?![(]|\[(?!REDACTED\]))"""
_VALUE: Final = rf"{_NOT_A_VALUE}(?:{_QUOTED}|{_BARE})"

_B64: Final = r"[A-Za-z0-9+/]"
_B64URL: Final = r"[A-Za-z0-9_-]"
_END: Final = r"(?![A-Za-z0-9_-])"
_START: Final = r"(?<![A-Za-z0-9_-])"

# Ordered: provider formats first (exact kinds), then context rules, then entropy.
SECRET_RULES: Final[tuple[Rule, ...]] = (
    Rule(
        "private-key",
        r"-----BEGIN[A-Z0-9 ]{0,30}PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[\s\S]{0,12000}?-----END[A-Z0-9 ]{0,30}PRIVATE KEY(?: BLOCK)?-----"
        # No END line (cut output, or a key split into quoted string pieces): mask the
        # header and every following line of base64 and string-literal punctuation.
        r"|(?:[A-Za-z0-9+/=\s\"'\\,;+:.-]|\\[rn])*+)",
    ),
    # base64 of "-----BEGIN" followed by the rest of an encoded PEM block.
    Rule("private-key", rf"LS0tLS1CRUdJT{_B64}{{20,}}+=*"),
    Rule(
        "aws-access-key",
        r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}(?![A-Z0-9])",
    ),
    Rule(
        "aws-secret-key",
        r"(?i:secret)_?(?i:access)?_?(?i:key)[\"']?\s*(?:=>|:=|=|:)\s*[\"']?"
        r"(?P<v1>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",
    ),
    Rule("github-token", rf"{_START}gh[pousr]_[A-Za-z0-9]{{36,255}}{_END}"),
    Rule("github-token", rf"{_START}github_pat_[A-Za-z0-9_]{{50,255}}{_END}"),
    Rule(
        "gitlab-token",
        rf"{_START}(?:glpat|gldt|glrt|glptt|glsoat|glcbt|gloas|glft)-[A-Za-z0-9_-]{{20,64}}{_END}",
    ),
    Rule("gitlab-token", rf"{_START}GR1348941[A-Za-z0-9_-]{{20,}}{_END}"),
    Rule("slack-token", r"xox[abposer]-[A-Za-z0-9-]{10,250}"),
    Rule("slack-token", r"xapp-\d-[A-Z0-9]+-\d+-[a-z0-9]+|xapp-[A-Za-z0-9/+-]{20,}"),
    Rule(
        "slack-webhook", r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_+-]{20,}"
    ),
    Rule("webhook-url", r"(?<=office\.com/webhook/)[A-Za-z0-9/@_-]{20,}"),
    Rule("stripe-key", rf"{_START}(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{{16,247}}{_END}"),
    Rule("google-api-key", rf"{_START}AIza[A-Za-z0-9_-]{{35}}"),
    Rule("google-oauth", rf"{_START}(?:GOCSPX-[A-Za-z0-9_-]{{20,}}|ya29\.[A-Za-z0-9_-]{{20,}})"),
    Rule("anthropic-key", rf"{_START}sk-ant-[a-z]{{3,10}}\d{{0,3}}-[A-Za-z0-9_-]{{20,}}"),
    Rule("openai-key", rf"{_START}sk-(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_-]{{20,}}{_END}"),
    Rule(
        "jwt",
        rf"{_START}eyJ{_B64URL}{{8,}}\.eyJ{_B64URL}{{4,}}\.{_B64URL}*|"
        rf"{_START}eyJ{_B64URL}{{8,}}\.{_B64URL}{{16,}}\.{_B64URL}{{16,}}",
    ),
    # Vendor tokens with a documented, distinctive prefix.
    Rule(
        "api-token",
        rf"{_START}(?:"
        r"aio_[A-Za-z0-9]{28}|AGE-SECRET-KEY-1[A-Z0-9]{58}|AKCp[A-Za-z0-9]{69}"
        r"|ATATT[A-Za-z0-9_=-]{40,}|ATBB[A-Za-z0-9]{28,}|dapi[a-f0-9]{32}(?:-\d)?"
        r"|odt_[A-Za-z0-9]{32,}|do[opr]_v1_[a-f0-9]{64}|dckr_pat_[A-Za-z0-9_-]{20,}"
        r"|dp\.(?:ct|pt|st|sa|scim|audit)\.[A-Za-z0-9.]{40,}|sl\.[A-Za-z0-9_-]{60,}"
        r"|dt0[a-z][0-9]{2}\.[A-Z0-9]{24}\.[A-Z0-9]{64}|EAA[A-Za-z0-9]{80,}"
        r"|fc-[a-f0-9]{32}|gsk_[A-Za-z0-9]{48,}|gl(?:c|sa)_[A-Za-z0-9_=+/-]{20,}"
        r"|hv[sbr]\.[A-Za-z0-9_-]{24,}|[sbr]\.(?=[A-Za-z]{0,29}\d)[A-Za-z0-9]{24,30}"
        r"|hf_[A-Za-z]{34,}|jina_[A-Za-z0-9]{60,}|sk\.eyJ[A-Za-z0-9._-]{20,}"
        r"|tk\.eyJ[A-Za-z0-9._-]{20,}|NRAK-[A-Z0-9]{27}|NRA[AIL]-[A-Za-z0-9]{20,}"
        r"|NRI[IQ]-[A-Za-z0-9_-]{32}|NRRA-[a-f0-9]{42}|[a-f0-9]{36}NRAL"
        r"|px-(?:api|dep)-[a-f0-9-]{36}|npm_[A-Za-z0-9]{36}|oy2[a-z0-9]{43}"
        r"|PMAK-[a-f0-9]{24}-[a-f0-9]{34}|pypi-AgE[A-Za-z0-9_-]{50,}"
        r"|rubygems_[a-f0-9]{48}|SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}"
        r"|shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}|sgp_(?:local_)?[a-f0-9_]{40,}"
        r"|(?:sandbox-)?sq0(?:atp|csp|atb)-[A-Za-z0-9_-]{22,}|hawk\.[A-Za-z0-9_-]{20}\.[A-Za-z0-9_-]{20}"
        r"|tvly-[A-Za-z0-9]{32}|live_\d{6,}_[A-Za-z0-9]{30}|key-[a-f0-9]{32}"
        r"|[a-f0-9]{32}-us\d{1,2}|SK[a-f0-9]{32}|glc_[A-Za-z0-9+/=_-]{32,}"
        r"|ghr_[A-Za-z0-9]{76}|ciot[A-Za-z0-9]{32}|cio[A-Za-z0-9]{32}"
        r"|00D[A-Za-z0-9]{12,15}![A-Za-z0-9._]{80,}"
        rf"){_END}",
    ),
    Rule("telegram-token", r"(?<!\d)\d{8,10}:AA[A-Za-z0-9_-]{32,33}(?![A-Za-z0-9_-])"),
    Rule(
        "azure-key",
        r"(?<![A-Za-z0-9])[A-Za-z0-9]{52}JQQJ9[0-9A-Za-z]{31}(?![A-Za-z0-9])"
        r"|(?<![A-Za-z0-9])[A-Za-z0-9]{76}AZDO[A-Za-z0-9]{4}(?![A-Za-z0-9])",
    ),
    # Credentials inside URLs: scheme://user:password@host.
    Rule(
        "url-credentials", r"(?<=[A-Za-z0-9])://[^\s:/@\"'`<>]{1,100}:(?P<v1>[^\s/\"'`<>]{1,200})@"
    ),
    Rule(
        "auth-header",
        r"(?i:authorization)[\"']?\s*[:=]\s*[\"']?"
        r"(?:(?i:bearer|basic|token|ssws|bot|digest|apikey)[ \t]+)?"
        r"(?P<v1>[A-Za-z0-9._~+/=:!-]{8,})",
    ),
    Rule("auth-header", r"\b(?i:bearer|basic)\b:?[ \t]+(?P<v1>[A-Za-z0-9._~+/-]{8,}=*)"),
    # Command-line credentials: ``-u user -p pass``, ``-u user:pass``, ``--password x``.
    Rule(
        "password-assignment",
        r"(?<!\S)-u[ \t]+\S{1,100}?(?::(?P<v1>[^\s\"']{1,200})|[ \t]+-p[ \t]*(?P<v2>\S{1,200}))",
    ),
    Rule(
        "password-assignment",
        rf"(?<=-){_STRONG}{_IDENT_TAIL}[ \t]+(?!-){_VALUE}",
    ),
    # MySQL's and MariaDB's clients take the password glued to -p anywhere on their
    # command line (``mysql -h db -pS3cret``; a lone -p prompts); sshpass takes it after -p.
    Rule(
        "password-assignment",
        r"(?:mysql|mariadb)[\w-]*[^\n|;&]{0,200}?(?<!\S)-p"
        r"(?:'(?P<v1>[^'\n]{1,200})'|\"(?P<v2>[^\"\n]{1,200})\"|(?P<v3>[^\s\"']{1,200}))",
    ),
    Rule("password-assignment", r"(?<=ssh)pass[ \t]+-p[ \t]*(?P<v1>[^\s\"']{1,200})"),
    Rule(
        "secret-assignment",
        rf"(?<=-){_WEAK}{_IDENT_TAIL}[ \t]+(?!-){_VALUE}",
        token_shaped,
    ),
    # XML configuration: <add key="DbPassword" value="..."/> and <password>...</password>.
    Rule(
        "password-assignment",
        rf"key=\"[^\"\n]{{0,60}}{_STRONG}[^\"\n]{{0,20}}\"\s+value=\"(?P<v1>[^\"\n]{{1,300}})\"",
    ),
    Rule("password-assignment", rf"{_STRONG}{_IDENT_TAIL}>(?P<v1>[^<\n]{{1,200}})</"),
    # .NET-style constructors that take (user, password).
    Rule(
        "password-assignment",
        r"(?i:credential|directoryentry|login|authenticate)\w*\(\s*(?:\"[^\"\n]*\",\s*){1,2}"
        r"\"(?P<v1>[^\"\n]{1,200})\"",
    ),
    # netrc: machine … login … password ….
    Rule(
        "password-assignment",
        r"(?<=\s)password[ \t]+(?P<v1>[^\s\"'=]{1,200})(?=\s|$)",
        context=lambda before: _NETRC_LOGIN.search(before) is not None,
    ),
    # Prose: "the password for user x is 'y'".
    Rule(
        "password-assignment",
        r"(?i:password|passphrase|secret)\b[^\n]{0,40}?\bis[ \t]+[\"'](?P<v1>[^\"'\n]{1,100})[\"']",
    ),
    # key = value assignments in config, env files, code, YAML and JSON; also a
    # keyword then a quoted value with only blanks between (Gradle, HCL).
    Rule(
        "password-assignment",
        rf"{_STRONG}{_IDENT_TAIL}(?:{_BIND}|[ \t]+(?=[\"'`])){_VALUE}",
        plausible_secret,
    ),
    Rule(
        "secret-assignment",
        rf"{_WEAK}{_IDENT_TAIL}(?:{_BIND}|[ \t]+(?=[\"'`])){_VALUE}",
        token_shaped,
    ),
    # A label line ("Use the following password:") and the secret alone on a later line.
    Rule(
        "password-assignment",
        rf"(?:{_STRONG}|{_WEAK})[^\n:]{{0,80}}+:[ \t]*\r?\n(?:[ \t]*\r?\n)?[ \t]*"
        r"(?P<v1>[A-Za-z0-9+/=_.-]{16,200})[ \t]*(?:\r?\n|$)",
        token_shaped,
    ),
    # Device and API tokens carried in a URL path: https://host/api/v1/<token>/...
    Rule(
        "url-token",
        r"(?<=/api/v\d/)[A-Za-z0-9]{20,64}(?=[/?#\s\"']|$)",
        token_shaped,
    ),
    # Generic: any key assigned a long random-looking value. The match starts at the
    # binder; ``context`` vets the key before it (hash and version keys are exempt).
    Rule(
        "high-entropy",
        r"(?:=|:(?!//)|,)[ \t]*[\"'`]?"
        r"(?P<v1>[A-Za-z0-9+/=_.-]{32,300}+)(?![A-Za-z0-9+/=_.-])",
        random_in_context,
        context=keyed,
    ),
    # Generic: a long random-looking token standing on its own, with its base64 padding
    # if it ends there; an "=" that binds something after it (TOKEN=0) is not padding.
    Rule(
        "high-entropy",
        rf"{_START}[A-Za-z0-9+/_-]{{32,}}+(?:={{1,2}}(?![A-Za-z0-9+/=_-])|(?![A-Za-z0-9+/_-]))",
        looks_random,
    ),
)

"""What the linter reports: severities, findings and the closed catalogue of rules.

Rule ids starting with ``D`` are definition hygiene (seed section 19); ids starting
with ``P`` are tool-poisoning signals (seed section 18); ``F001`` is a file that could
not be loaded at all. ``docs/lint-rules.md`` describes each rule with examples; the
short descriptions here feed SARIF output.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from toolkernel.errors import ToolkernelError

__all__ = ["FILE_TOOL", "RULES", "SERVER_TOOL", "Finding", "LintInputError", "Rule", "Severity"]


# The ``tool`` of an ``F001`` finding: a whole file, or an item in it, that is not a tool.
FILE_TOOL: Final = "<file>"
# The ``tool`` of a finding in a server's own text beside its tools (its instructions,
# prompts and resources in a snapshot or an initialize result).
SERVER_TOOL: Final = "<server>"


class Severity(StrEnum):
    """How much a finding matters. Any ``ERROR`` makes ``toolkernel lint`` exit 1."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem in one tool definition.

    Attributes:
        tool: The tool's name as given (``"<unnamed>"`` when it has none).
        rule: The rule id, e.g. ``"P101"`` or ``"D003"``.
        severity: Error or warning.
        pointer: JSON pointer into the definition as given, e.g.
            ``"/inputSchema/properties/path/description"``.
        message: What was found; quotes at most a short excerpt of the text.
    """

    tool: str
    rule: str
    severity: Severity
    pointer: str
    message: str


@dataclass(frozen=True, slots=True)
class Rule:
    """A rule's id, its short name and a one-line description for reports."""

    id: str
    name: str
    summary: str


class LintInputError(ToolkernelError):
    """A file or value given to the linter is not a tool definition document."""


def _catalogue(*rules: Rule) -> dict[str, Rule]:
    return {rule.id: rule for rule in rules}


RULES: Final[dict[str, Rule]] = _catalogue(
    Rule(
        "F001",
        "loadable-file",
        "The file can be read and holds JSON or TOML tool definitions.",
    ),
    Rule("D001", "namespaced-name", "Tool names are namespaced (repo.search)."),
    Rule(
        "D002",
        "closed-objects",
        "Every object in the input schema sets additionalProperties: false.",
    ),
    Rule("D003", "bounded-strings", "Every string in the input schema is length-bounded."),
    Rule("D004", "bounded-arrays", "Every array in the input schema sets maxItems."),
    Rule("D005", "mutation-precondition", "Mutating tools take a precondition (e.g. baseHash)."),
    Rule(
        "D006",
        "network-permission",
        "Network or external tools declare the network permission.",
    ),
    Rule("D007", "output-contract", "The tool declares an output contract or output schema."),
    Rule("D008", "timeout", "The tool declares a timeout (timeoutMs)."),
    Rule("D009", "idempotency", "The tool states explicitly whether it is idempotent."),
    Rule("D010", "well-formed", "The definition has a name and an object input schema."),
    Rule("D011", "description", "The tool has a non-empty description."),
    Rule(
        "D012",
        "valid-schema",
        "The input and output schemas compile as JSON Schema, as the runtime requires.",
    ),
    Rule("D013", "unique-name", "No two tools of one document share a name."),
    Rule(
        "P101",
        "model-directed-instruction",
        "Text gives the model instructions: override earlier ones, hide actions from "
        "the user, or impersonate the user.",
    ),
    Rule(
        "P102",
        "credential-access",
        "Text asks for credentials, keys or other apps' configuration files.",
    ),
    Rule(
        "P103",
        "exfiltration",
        "Text asks to send data elsewhere or to smuggle contents into an argument.",
    ),
    Rule("P104", "tool-shadowing", "Text changes how other tools are used."),
    Rule(
        "P105",
        "invisible-characters",
        "Text holds invisible characters: Unicode tags, zero-width characters, fillers, "
        "stray variation selectors or bidirectional controls.",
    ),
    Rule(
        "P106",
        "hidden-markup",
        "Text holds HTML/XML comments or instruction tags such as <IMPORTANT>.",
    ),
    Rule("P107", "padding", "Text holds long runs of whitespace that push content out of view."),
    Rule("P108", "encoded-blob", "Text holds a long base64 or hex blob."),
    Rule("P109", "fake-role-marker", "Text holds chat-template role or system markers."),
    Rule("P110", "hidden-parameter", "A parameter is meant to be hidden from the user."),
    Rule(
        "P111",
        "agent-context-harvesting",
        "A parameter or text asks for the model's identity, prompt, history or tool list.",
    ),
    Rule(
        "P112",
        "tool-preference-manipulation",
        "Text promotes the tool over others or orders the model to call tools first.",
    ),
    Rule(
        "P113",
        "control-characters",
        "Text holds C0/C1 control characters (such as ANSI escape sequences) other than "
        "tab, line feed and carriage return.",
    ),
    Rule(
        "P114",
        "oversized-text",
        "A string is too long for the linter to read in full; the rest is unchecked.",
    ),
)

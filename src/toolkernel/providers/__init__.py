"""Speaking the providers' formats: tools out, tool calls in, results back.

One module per provider (``openai``, ``anthropic``), plus the reversible name map
(``names``) and OpenAI strict-mode schemas (``schemas``). Every parser returns the
kernel's ``ToolCall`` list for ``Kernel.call_many``; every result renderer carries only
``ToolCallResult.projection()``.
"""

from toolkernel.providers.anthropic import (
    parse_anthropic,
    render_anthropic_results,
    render_anthropic_tools,
)
from toolkernel.providers.names import (
    NameMap,
    ProviderFormatError,
    ProviderNameError,
    provider_name,
)
from toolkernel.providers.openai import (
    parse_openai_chat,
    parse_openai_responses,
    render_openai_chat_results,
    render_openai_chat_tools,
    render_openai_responses_results,
    render_openai_responses_tools,
)
from toolkernel.providers.schemas import (
    StrictSchemaError,
    openai_strict_schema,
    strip_strict_nulls,
)

__all__ = [
    "NameMap",
    "ProviderFormatError",
    "ProviderNameError",
    "StrictSchemaError",
    "openai_strict_schema",
    "parse_anthropic",
    "parse_openai_chat",
    "parse_openai_responses",
    "provider_name",
    "render_anthropic_results",
    "render_anthropic_tools",
    "render_openai_chat_results",
    "render_openai_chat_tools",
    "render_openai_responses_results",
    "render_openai_responses_tools",
    "strip_strict_nulls",
]

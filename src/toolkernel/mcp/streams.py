"""A read stream that stands in front of an SDK transport's read stream.

The SDK hands a line it cannot parse to the session as an exception, which logs or
drops it. The bridge puts a filter in front that counts a server's garbage output
(``bridge._ParsedOnly``); this is the stream protocol such a filter implements
(``receive``). The gateway reads its clients' lines itself (``gateway._StdioTransport``).
"""

from __future__ import annotations

import abc
from typing import Any, Self

import anyio

__all__ = ["FilteredReadStream"]


class FilteredReadStream(abc.ABC):
    """Everything of the SDK's ``ReadStream`` protocol but ``receive``.

    Args:
        inner: the transport's read stream; closing this stream closes it.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @abc.abstractmethod
    async def receive(self) -> Any:
        """The next item to pass on; raises ``anyio.EndOfStream`` at the end."""

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

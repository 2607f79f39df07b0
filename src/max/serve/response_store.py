"""The bounded in-memory store of ``/v1/responses`` results, for ``previous_response_id``.

Each stored response keeps the conversation it ended (the chat messages of its input, without its
``instructions``, then its own output as an assistant message) and its public body (``GET
/v1/responses/{id}``).  The store holds at most ``max_entries`` responses and drops the least
recently used one beyond that (a read or a continuation counts as a use); ``max_entries=0`` stores
nothing.  It lives in the server process: a restart forgets every response.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

DEFAULT_RESPONSES_STORE_SIZE = 1024
"""Responses kept for ``previous_response_id`` (``max serve --responses-store-size``)."""


@dataclass
class StoredResponse:
    messages: list[dict[str, Any]]  # the conversation, this response's output included
    body: dict[str, Any]  # the response object as the client received it


class ResponseStore:
    """An LRU map ``response id -> StoredResponse`` of at most ``max_entries`` entries (thread-safe)."""

    def __init__(self, max_entries: int = DEFAULT_RESPONSES_STORE_SIZE) -> None:
        if max_entries < 0:
            raise ValueError(f"ResponseStore: max_entries must be >= 0, got {max_entries}")
        self.max_entries = int(max_entries)
        self._items: "OrderedDict[str, StoredResponse]" = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, rid: str, entry: StoredResponse) -> None:
        with self._lock:
            if self.max_entries == 0:
                return
            self._items[rid] = entry
            self._items.move_to_end(rid)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def get(self, rid: str) -> Optional[StoredResponse]:
        with self._lock:
            entry = self._items.get(rid)
            if entry is not None:
                self._items.move_to_end(rid)
            return entry

    def delete(self, rid: str) -> bool:
        with self._lock:
            return self._items.pop(rid, None) is not None

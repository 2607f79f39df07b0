"""The bounded in-memory store of ``/v1/responses`` results, for ``previous_response_id``.

Each stored response keeps the conversation it ended (the chat messages of its input, without its
``instructions``, then its own output as an assistant message) and its public body (``GET
/v1/responses/{id}``).  The store holds at most ``max_entries`` responses and drops the least
recently used one beyond that (a read or a continuation counts as a use); ``max_entries=0`` stores
nothing.  Their total size (the JSON text of the conversations and bodies: images sent as data URLs
count in full) is bounded too, by ``max_bytes``; one response bigger than that is not stored.  It
lives in the server process: a restart forgets every response.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

DEFAULT_RESPONSES_STORE_SIZE = 1024
"""Responses kept for ``previous_response_id`` (``max serve --responses-store-size``)."""

DEFAULT_RESPONSES_STORE_BYTES = 256 << 20
"""Bound on the stored responses' total size."""


@dataclass
class StoredResponse:
    messages: list[dict[str, Any]]  # the conversation, this response's output included
    body: dict[str, Any]  # the response object as the client received it

    @property
    def nbytes(self) -> int:
        return len(json.dumps(self.messages)) + len(json.dumps(self.body))


class ResponseStore:
    """An LRU map ``response id -> StoredResponse`` of at most ``max_entries`` entries and ``max_bytes``
    bytes (thread-safe)."""

    def __init__(self, max_entries: int = DEFAULT_RESPONSES_STORE_SIZE,
                 max_bytes: int = DEFAULT_RESPONSES_STORE_BYTES) -> None:
        if max_entries < 0 or max_bytes < 0:
            raise ValueError(f"ResponseStore: max_entries and max_bytes must be >= 0, got {max_entries}, "
                             f"{max_bytes}")
        self.max_entries = int(max_entries)
        self.max_bytes = int(max_bytes)
        self.nbytes = 0
        self._items: "OrderedDict[str, tuple[StoredResponse, int]]" = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, rid: str, entry: StoredResponse) -> None:
        size = entry.nbytes
        with self._lock:
            self._drop(rid)
            if self.max_entries == 0 or size > self.max_bytes:
                return
            self._items[rid] = (entry, size)
            self.nbytes += size
            while len(self._items) > self.max_entries or self.nbytes > self.max_bytes:
                _, (_, n) = self._items.popitem(last=False)
                self.nbytes -= n

    def get(self, rid: str) -> Optional[StoredResponse]:
        with self._lock:
            item = self._items.get(rid)
            if item is None:
                return None
            self._items.move_to_end(rid)
            return item[0]

    def delete(self, rid: str) -> bool:
        with self._lock:
            return self._drop(rid)

    def _drop(self, rid: str) -> bool:
        item = self._items.pop(rid, None)
        if item is not None:
            self.nbytes -= item[1]
        return item is not None

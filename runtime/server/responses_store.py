"""Responses kept for `previous_response_id` and `GET /v1/responses/{id}`, in memory, bounded.

A follow-up request names an earlier response instead of resending the conversation, so
the server keeps, per response, the conversation it continued (as chat messages, the
assistant's reply and tool calls included) and the response object it returned. Only
for the server's lifetime, and only the `capacity` most recently used: an old id is a
404, never unbounded memory. `store: false` keeps a response out.
"""

from __future__ import annotations

import collections
import threading

import attrs

from .errors import APIError

DEFAULT_CAPACITY = 512


@attrs.frozen
class Stored:
    conversation: list  # chat messages up to and including this response's reply
    response: dict  # the response object as sent


class ResponseStore:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        self.capacity = capacity
        self._items: collections.OrderedDict[str, Stored] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, rid: str, conversation: list, response: dict) -> None:
        with self._lock:
            self._items[rid] = Stored(conversation, response)
            self._items.move_to_end(rid)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, rid: str, param: str | None = None) -> Stored:
        with self._lock:
            item = self._items.get(rid)
            if item is not None:
                self._items.move_to_end(rid)
        if item is None:
            shown = rid if len(rid) <= 100 else rid[:100] + "…"
            raise APIError(404, f"no response with id '{shown}' is stored on this server (responses are kept "
                                f"in memory for the server's lifetime, the {self.capacity} most recent)",
                           param=param, code="response_not_found")
        return item

    def delete(self, rid: str) -> bool:
        with self._lock:
            return self._items.pop(rid, None) is not None

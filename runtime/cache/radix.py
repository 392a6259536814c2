"""The radix tree over token ids that indexes the prefix pool: plain Python + numpy, no mx.

Each node is an edge label (a run of token ids) with, per token, its slot in the KV pool
and — for models with sliding-window layers — its slot in the window pool (-1 where that
token's sliding KV is not kept) with a count of the boundaries that keep it. A node may
also mark a *boundary* at its end: a position where a hit can resume for layers whose
state is not per-token (`covered`: the window before it is kept; `snapshot`: recurrent
state after it is kept). The eviction and boundary rules live in runtime/prefix_cache.py;
this file only knows the shape of the tree.

`ref` counts the live requests that hold a node *or any descendant* (locking walks to the
root, as in SGLang), so a leaf with ref 0 is never needed by anyone and may be evicted.
"""

from __future__ import annotations

import itertools

import numpy as np

_clock = itertools.count(1)


def tick() -> int:
    """A monotonic access stamp for LRU order."""
    return next(_clock)


class Node:
    __slots__ = ("key", "slots", "sw", "sw_ref", "children", "parent", "ref", "last_access",
                 "covered", "snapshot", "end")

    def __init__(self, key, slots, parent=None, end=0, sw=None):
        self.key = key  # int32 [n] token ids
        self.slots = slots  # int32 [n] KV pool slots
        self.sw = sw  # int32 [n] window pool slots (-1: not kept), or None without sliding layers
        self.sw_ref = None if sw is None else np.zeros(len(key), np.int32)
        self.children: dict[int, Node] = {}
        self.parent = parent
        self.ref = 0
        self.last_access = tick()
        self.covered = False  # the window before `end` is kept (sliding layers)
        self.snapshot = None  # recurrent state after `end` (opaque to the tree)
        self.end = end  # absolute position after this node's last token

    @property
    def start(self) -> int:
        return self.end - len(self.key)

    def __repr__(self) -> str:
        return f"Node([{self.start}, {self.end}), ref={self.ref}, children={len(self.children)})"


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    eq = a[:n] == b[:n]
    return n if eq.all() else int(np.argmin(eq))


class RadixTree:
    def __init__(self, windowed: bool = False):
        self.windowed = windowed
        empty = np.zeros(0, np.int32)
        self.root = Node(empty, empty, sw=empty.copy() if windowed else None)
        self.root.ref = 1  # never evicted
        self.tokens = 0  # tokens held by all nodes
        self.size = 0  # nodes, root excluded (kept as a counter: stats are read from other threads)

    def match(self, tokens: np.ndarray) -> tuple[list[Node], int]:
        """The nodes a walk along `tokens` visits and how many tokens matched.

        The last node may be matched only partly (then it ends after the matched length).
        """
        node, pos, path = self.root, 0, []
        while pos < len(tokens):
            child = node.children.get(int(tokens[pos]))
            if child is None:
                break
            k = common_prefix(child.key, tokens[pos:])
            path.append(child)
            pos += k
            if k < len(child.key):
                break
            node = child
        return path, pos

    def split(self, node: Node, k: int) -> Node:
        """Cut `node` after its first k tokens; returns the new parent holding them.

        `node` keeps the deeper part (its end, children, boundary marks and locks), so
        references to it stay valid; the new parent inherits its lock count.
        """
        assert 0 < k < len(node.key)
        parent = Node(node.key[:k], node.slots[:k], node.parent, node.start + k,
                      None if node.sw is None else node.sw[:k])
        if node.sw is not None:
            parent.sw_ref = node.sw_ref[:k]
            node.sw, node.sw_ref = node.sw[k:], node.sw_ref[k:]
        parent.ref, parent.last_access = node.ref, node.last_access
        node.parent.children[int(node.key[0])] = parent
        node.key, node.slots = node.key[k:], node.slots[k:]
        node.parent = parent
        parent.children[int(node.key[0])] = node
        self.size += 1
        return parent

    def node_ending_at(self, tokens: np.ndarray, pos: int) -> Node:
        """The node that ends exactly at `pos` on the path of `tokens` (splitting one if needed).

        `tokens[:pos]` must already be in the tree; pos 0 is the root.
        """
        node, at = self.root, 0
        while at < pos:
            node = node.children[int(tokens[at])]
            if node.end > pos:
                return self.split(node, pos - node.start)
            at = node.end
        return node

    def add_leaf(self, parent: Node, key: np.ndarray, slots: np.ndarray) -> Node:
        sw = np.full(len(key), -1, np.int32) if self.windowed else None
        leaf = Node(key, slots, parent, parent.end + len(key), sw)
        parent.children[int(key[0])] = leaf
        self.tokens += len(key)
        self.size += 1
        return leaf

    def remove_leaf(self, node: Node) -> None:
        assert not node.children and node is not self.root
        del node.parent.children[int(node.key[0])]
        self.tokens -= len(node.key)
        self.size -= 1

    def lock(self, node: Node) -> None:
        while node is not None:
            node.ref += 1
            node.last_access = tick()
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not None:
            node.ref -= 1
            assert node.ref >= 0, "radix node unlocked more often than locked"
            node = node.parent

    def nodes(self):
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def ancestors_over(self, node: Node, start: int, end: int):
        """(node, lo, hi) slices covering absolute positions [start, end) on the way up from `node`.

        `node.end` must be >= end (positions above the node's end are not on this path).
        """
        while node is not None and node.end > start:
            lo, hi = max(start, node.start), min(end, node.end)
            if lo < hi:
                yield node, lo - node.start, hi - node.start
            node = node.parent

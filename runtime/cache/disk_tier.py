"""The prefix cache's disk tier: KV blocks that outlive the memory pool and the process.

The radix tree (runtime/prefix_cache.py) and the pool (runtime/cache/pool.py) stay the only
place a hit is restored from; this tier moves fixed blocks of `block_tokens` positions
between the pool and a folder (runtime/cache/disk_files.py):

- **Out** (`spill`): when a request finishes, the full blocks of its sequence (prompt +
  output) that the folder lacks are gathered from the pool and written by a background
  thread; when the tree evicts a leaf, its blocks are written the same way before the slots
  are reused. The positions past the last full block go to the chain's tail file
  (runtime/cache/disk_tails.py), so a restarted server resumes where the sequence ended.
- **In** (`promote`, called by `PrefixCache.admit` before it matches): when the folder holds
  blocks of the prompt beyond what the tree matched, they are read, checked, inserted into
  the tree and written into the pool, so the ordinary match then hits on them; then the tail
  at the end of the last of them, as far as it matches the prompt. Whether reading them beats
  computing those tokens again is measured (runtime/cache/disk_choice.py): a hit not read is a
  miss for that part, its files left as they are.

Block names chain a hash of the model identity (config, weight files, graph and cache
policies, dtype, lowering, device) through every token id, so a block can only be found by
the same model with the same prefix. Restored blocks are bit-identical to what the pool
held, so greedy output after a disk hit equals a cold run.

Hybrid models (linear-attention / SSM layers, PrefixKind.SNAPSHOT) spill too: with a disk
tier, each prompt also keeps a recurrent-state snapshot at its last block end, and when its
blocks are written, the snapshot at the last block end of the sequence is written beside them
(`<hash of that block>-state`: tensors `s<layer>.<k>`, the state arrays), checked the same way.
A read-back hit resumes at the last block whose state file checks out. The window tails of
sliding layers are not written: such models run with the memory tier only (a log line, and
`cache_stats()["disk_off"]` says why).
"""

from __future__ import annotations

import hashlib
import json
import logging
from contextlib import contextmanager
from pathlib import Path

import mlx.core as mx
import numpy as np

from graphc.compiler.adapters import adapter_files

from .disk_choice import DiskReadChoice
from .disk_files import READ_AHEAD, BlockStore, chain_hash, encode_block
from .disk_tails import read_tail, tail_name, write_tail
from .prefix_state import PrefixKind, PrefixState

log = logging.getLogger("graphc.kvdisk")

DEFAULT_BLOCK_TOKENS = 256
STATE = "-state"  # a recurrent-state file's name: the name of the block it ends, then this
_EDGE_BYTES = 1 << 20  # of each weight file hashed at its start and end: identity without reading 16 GB


def disk_unsupported_reason(policies) -> str | None:
    for i, p in enumerate(policies):
        if p.prefix_kind is PrefixKind.TAIL:
            return (f"layer {i} ({p.layer.kind}, {p.name}) keeps sliding-window tails, which the disk tier "
                    "does not write yet; this model uses the in-memory prefix cache only")
    return None


def model_identity(config: dict, model_path: str | None, compiled, adapter_path: str | None = None) -> str:
    """What KV depends on: the config, the weights (names, sizes, first and last MiB of each
    file, a LoRA adapter's files too), the graph and its cache policies, dtypes, the lowering
    and the device."""
    if model_path is None:
        raise ValueError("kv_cache_dir needs a model folder (Engine.load(dir, ...)): the disk tier keys its "
                         "files by the weights they were computed with")
    h = hashlib.blake2b(digest_size=20)
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    p = Path(model_path)
    files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.suffix in (".safetensors", ".gguf", ".npz"))
    files += adapter_files(adapter_path)  # an adapter changes every layer's K and V
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(_EDGE_BYTES))
            if size > _EDGE_BYTES:
                fh.seek(max(_EDGE_BYTES, size - _EDGE_BYTES))
                h.update(fh.read())
    b = compiled.binding
    h.update(repr((compiled.spec.name, b.lowering, mx.default_device().type.name,
                   [(p.layer.kind, str(p.layer.dtype), p.describe()) for p in b.policies])).encode())
    return h.hexdigest()


class DiskTier:
    def __init__(self, prefix, io, store: BlockStore, model_id: str, block_tokens: int,
                 choice: DiskReadChoice | None = None):
        if block_tokens < 1:
            raise ValueError(f"kv_cache_block_tokens must be >= 1, got {block_tokens}")
        self.prefix = prefix
        self.io = io
        self.pool = io.pool
        self.layers = io.token_layers
        self.snapshot_layers = io.snapshot_layers  # recurrent layers: their state at block ends
        self.store = store
        self.model_id = model_id
        self.block = block_tokens
        self.known: set[str] = set()  # blocks this process wrote or read: never written again
        self.known_tails: dict[str, tuple] = {}  # tail name -> what this process last wrote or read there
        # read a hit's blocks or compute them again (runtime/cache/disk_choice.py); None: always read
        self.choice = choice if choice is not None else DiskReadChoice("always")
        # a pool slot's bytes over the layers kept on disk: a tail file's size says about how many tokens it holds
        self.token_bytes = max(1, sum(io.policies[i].bytes_per_token() for i in self.layers))
        self.counters = {"disk_loaded_blocks": 0, "disk_spilled_blocks": 0, "disk_loaded_states": 0,
                         "disk_spilled_states": 0, "disk_loaded_tails": 0, "disk_spilled_tails": 0}

    def hashes(self, tokens: np.ndarray, n_blocks: int) -> list[str]:
        out, h, B = [], self.model_id, self.block
        for j in range(n_blocks):
            h = chain_hash(h, tokens[j * B:(j + 1) * B])
            out.append(h)
        return out

    # -- in -------------------------------------------------------------------------------
    def promote(self, tokens: np.ndarray) -> int:
        """Load the prompt's blocks past the tree's match from disk into the tree and pool, then the
        tail past the last of them (runtime/cache/disk_tails.py), if reading them is the faster way
        back (runtime/cache/disk_choice.py). Returns the tokens gained (0: nothing usable on disk,
        or computing them was chosen)."""
        B = self.block
        n_blocks = len(tokens) // B
        _, m0 = self.prefix.tree.match(tokens)
        j0 = m0 // B
        hs = self.hashes(tokens, n_blocks)
        sizes = self.store.sizes(hs[j0:n_blocks])  # the files there, stat only: what a read would cost
        j_end = j0 + len(sizes)
        tail_bytes = self.store.size(tail_name(hs[j_end - 1] if j_end else self.model_id)) or 0
        tail_tokens = min(B - 1, tail_bytes // self.token_bytes) if tail_bytes else 0
        gain = j_end * B + tail_tokens - m0
        if gain <= 0:
            return 0
        if not self.choice.decide(gain, sum(sizes) + tail_bytes, m0):
            self.known.update(hs[j0:j_end])  # on disk already: a later spill gathers none of them
            return 0
        clock = self.choice.clock
        t0, done, stopped = clock(), 0, False
        loaded = []
        reads = self.store.read_many(hs[j0:j_end])
        try:
            for k, (j, got) in enumerate(zip(range(j0, j_end), reads)):
                if got is None or not self._valid(hs[j], j, tokens, *got):
                    break
                loaded.append(got[2])
                self.known.add(hs[j])
                self.counters["disk_loaded_blocks"] += 1
                done += sizes[k]
                # a hybrid hit resumes at the state at its last block end only: once begun, read it whole
                if (not self.snapshot_layers and j + 1 < j_end and not self.choice.keep_reading(
                        done, clock() - t0, sum(sizes[k + 1:]) + tail_bytes, (j_end - j - 1) * B + tail_tokens,
                        sum(sizes[k + 1:k + 1 + READ_AHEAD]), (j + 1) * B)):
                    stopped = True
                    self.known.update(hs[j + 1:j_end])
                    break
        finally:
            reads.close()
        j1 = j0 + len(loaded)
        tail = None if stopped else read_tail(self, tokens, j1 * B, hs[j1 - 1] if j1 else self.model_id, m0)
        if tail is not None:
            done += tail_bytes
        self.choice.observe_read(done, clock() - t0)
        self.choice.save()
        if not loaded and tail is None:
            return 0
        base, end = j0 * B, j1 * B + (tail[0] if tail else 0)
        planes_of = loaded + ([tail[1]] if tail else [])
        plan = self.prefix.insert_tokens(tokens[:end])
        for i in self.layers:
            k = sum(1 for name in planes_of[0] if name.startswith(f"l{i}."))
            planes = [mx.concatenate([blk[f"l{i}.{p}"] for blk in planes_of], axis=1) for p in range(k)]
            for slots, s, e in plan.pool:
                self.pool.write(i, slots, tuple(a[:, s - base:e - base] for a in planes))
        self.pool.flush()
        if tail is not None and tail[2] is not None:
            self.prefix.insert_snapshot(tokens[:end], tail[2])  # the furthest state: no block end needed
        elif self.snapshot_layers and loaded:
            self._promote_state(tokens, hs, j0, j1)
        return max((e for _, _, e in plan.pool), default=m0) - m0

    def _promote_state(self, tokens: np.ndarray, hs: list, j0: int, j1: int) -> None:
        """The recurrent state at the last block end in (j0, j1] whose state file checks out, marked as
        a snapshot in the tree (a hit on a hybrid model must end at one)."""
        B = self.block
        j1 = min(j1, (len(tokens) - 1) // B)  # a hit ends before the prompt's last token: a state at its end is no use
        for j in range(j1, j0, -1):
            name = hs[j - 1] + STATE
            got = self.store.read(name)
            if got is None:
                continue
            meta, toks, arrays = got
            states = self._states(meta, toks, arrays, name, j, tokens)
            if states is None:
                continue
            self.prefix.insert_snapshot(tokens[:j * B], states)
            self.known.add(name)
            self.counters["disk_loaded_states"] += 1
            return

    def _states(self, meta: dict, toks: np.ndarray, arrays: dict, name: str, j: int, tokens: np.ndarray):
        B, why = self.block, None
        per_layer = [sorted((n for n in arrays if n.startswith(f"s{i}.")), key=lambda n: int(n.split(".")[1]))
                     for i in self.snapshot_layers]
        if meta.get("model") != self.model_id:
            why = f"written by another model ({str(meta.get('model'))[:12]}...)"
        elif meta.get("block") != name or meta.get("start") != str(j * B) or meta.get("kind") != "state":
            why = "its metadata does not match its name"
        elif not np.array_equal(toks, tokens[(j - 1) * B:j * B]):
            why = "its token ids differ from the prompt's"
        elif any(not names for names in per_layer):
            why = "a recurrent layer's state is missing"
        if why:
            self.store.reject(self.store.path(name), why)
            return None
        return [PrefixState(PrefixKind.SNAPSHOT, j * B, j * B, tuple(arrays[n] for n in names)) for names in per_layer]

    def _valid(self, block: str, j: int, tokens: np.ndarray, meta: dict, toks: np.ndarray, arrays: dict) -> bool:
        B, path = self.block, self.store.path(block)
        why = None
        if meta.get("model") != self.model_id:
            why = f"written by another model ({str(meta.get('model'))[:12]}..., this one is {self.model_id[:12]}...)"
        elif meta.get("block") != block or meta.get("start") != str(j * B) or len(toks) != B:
            why = "its metadata does not match its name"
        elif not np.array_equal(toks, tokens[j * B:(j + 1) * B]):
            why = "its token ids differ from the prompt's"
        else:
            why = self.planes_misfit(arrays, B)
        if why:
            self.store.reject(path, why)
            return False
        return True

    def planes_misfit(self, arrays: dict, n: int) -> str | None:
        """Why a file's KV planes can not go into the pool as `n` positions (None: they can)."""
        for i in self.layers:
            names = [k for k in arrays if k.startswith(f"l{i}.")]
            mine = self.pool.planes.get(i)
            if not names or any(arrays[k].ndim < 2 or arrays[k].shape[1] != n for k in names):
                return f"layer {i}'s planes are missing or not {n} positions long"
            if mine is not None and (len(mine) != len(names) or any(
                    arrays[f"l{i}.{p}"].dtype != a.dtype or arrays[f"l{i}.{p}"].shape[2:] != a.shape[2:]
                    or arrays[f"l{i}.{p}"].shape[0] != a.shape[1] for p, a in enumerate(mine))):
                return f"layer {i}'s planes do not fit the pool (shape / dtype)"
        return None

    # -- out ------------------------------------------------------------------------------
    def spill(self, seq: np.ndarray, slots: np.ndarray, start: int = 0) -> None:
        """Queue the full blocks of `seq` (its KV in pool `slots`, one per position) that end after
        `start` and that the folder lacks."""
        B = self.block
        n_blocks = min(len(seq), len(slots)) // B
        if n_blocks == 0 or n_blocks * B <= start:
            return
        hs = self.hashes(seq, n_blocks)
        todo = [j for j in range(start // B, n_blocks) if hs[j] not in self.known]
        if not todo:
            return
        gathered = {j: {f"l{i}.{p}": a for i in self.layers
                        for p, a in enumerate(self.pool.gather(i, slots[j * B:(j + 1) * B]))} for j in todo}
        mx.eval([a for d in gathered.values() for a in d.values()])
        for j in todo:
            # numpy bytes here, on the engine thread; the writer thread only hashes and writes
            raw = {name: (a.dtype, a.shape, np.array(a.view(mx.uint8)).tobytes()) for name, a in gathered[j].items()}
            meta = {"model": self.model_id, "block": hs[j], "start": j * B, "tokens_n": B}
            toks = np.array(seq[j * B:(j + 1) * B], np.int32)
            self.store.put(hs[j], lambda m=meta, t=toks, r=raw: encode_block(m, t, r))
            self.known.add(hs[j])
            self.counters["disk_spilled_blocks"] += 1

    def spill_sequences(self, seqs: list) -> None:
        """Finished requests' sequences, already inserted into the tree and written to the pool."""
        for seq in seqs:
            tokens = np.asarray(seq, np.int32)
            path, m = self.prefix.tree.match(tokens)
            if m == 0:
                continue
            slots = np.concatenate([n.slots for n in path])[:m]
            if m >= self.block:
                self.spill(tokens[:m], slots)
                if self.snapshot_layers:
                    self._spill_state(tokens[:m], path)
            write_tail(self, tokens[:m], slots, path)
        self.choice.save()  # the estimates, now and then: a restarted server starts from them

    def _spill_state(self, tokens: np.ndarray, path: list) -> None:
        """The snapshots at the sequence's block ends that the folder lacks, beside their blocks."""
        B = self.block
        ends = [n for n in path if n.end % B == 0 and n.snapshot is not None and n.end <= len(tokens)]
        hs = self.hashes(tokens, len(tokens) // B) if ends else []
        for node in ends:
            self._write_state(tokens, node, hs[node.end // B - 1] + STATE)

    def _write_state(self, tokens: np.ndarray, node, name: str) -> None:
        B = self.block
        if name in self.known:
            return
        arrays = {f"s{i}.{k}": a for i, st in zip(self.snapshot_layers, node.snapshot) for k, a in enumerate(st.arrays)}
        if any(a is None for a in arrays.values()):
            return  # a layer whose state was never set (no position folded in): nothing to keep
        mx.eval(list(arrays.values()))
        raw = {n: (a.dtype, a.shape, np.array(a.view(mx.uint8)).tobytes()) for n, a in arrays.items()}
        meta = {"model": self.model_id, "block": name, "start": node.end, "tokens_n": B, "kind": "state"}
        toks = np.array(tokens[node.end - B:node.end], np.int32)
        self.store.put(name, lambda m=meta, t=toks, r=raw: encode_block(m, t, r))
        self.known.add(name)
        self.counters["disk_spilled_states"] += 1

    def spill_leaf(self, leaf) -> None:
        """A leaf about to be evicted: its blocks (with its ancestors' positions before them)."""
        nodes, n = [], leaf
        while n is not self.prefix.tree.root:
            nodes.append(n)
            n = n.parent
        nodes.reverse()
        self.spill(np.concatenate([x.key for x in nodes]), np.concatenate([x.slots for x in nodes]), leaf.start)

    def flush(self, timeout: float = 60.0) -> None:
        self.store.flush(timeout)
        self.choice.save(force=True)

    @contextmanager
    def scratch(self, root: str):
        """While inside, spills and reads go to a tier of the same identity in folder `root`
        instead of this one (the warm-up, runtime/warmup.py, exercises the disk paths without
        writing its prompts among the client's: a tail file is replaced by the next sequence that
        ends on its chain, so a warm-up prompt would push out a conversation's). On the way out
        the tree forgets what it holds (spilling it to `root`), then this tier is attached again."""
        # its reads measure a scratch folder (page cache): they go to no estimate; it reads unless told never
        choice = DiskReadChoice("never" if self.choice.mode == "never" else "always")
        other = DiskTier(self.prefix, self.io, BlockStore(root, self.model_id), self.model_id, self.block, choice)
        self.prefix.flush()  # what clients left in memory reaches this tier's folder first
        self.flush()
        attach(self.prefix, self.io, other)
        try:
            yield other
        finally:
            self.prefix.flush()
            other.store.close()
            attach(self.prefix, self.io, self)

    def stats(self) -> dict:
        return {"disk_enabled": True, "disk_block_tokens": self.block, **self.counters, **self.store.stats(),
                **self.choice.stats()}

    def describe(self) -> dict:
        """The tier's settings and estimates (Engine.describe()["disk_tier"])."""
        return {"dir": str(self.store.dir), "block_tokens": self.block, "cap_bytes": self.store.cap,
                **self.choice.describe()}


def attach(prefix, io, tier: DiskTier) -> None:
    """The prefix cache and its PrefixIO spill and promote through `tier` (attach_disk_tier, once;
    DiskTier.scratch, for the warm-up's duration)."""
    prefix.disk = io.disk = tier


def attach_disk_tier(prefix, io, compiled, config: dict, model_path: str | None, root: str,
                     disk_gb: float | None = None, block_tokens: int = DEFAULT_BLOCK_TOKENS,
                     read: str = "auto", prefill_rate=None, adapter_path: str | None = None) -> DiskTier | None:
    """Give `prefix` (a PrefixCache) a disk tier in folder `root`, or log why it cannot have one.
    `read`: whether a hit reads its blocks or computes them (runtime/cache/disk_choice.py);
    `prefill_rate`: the engine's prefill meter (runtime/prefill_rate.py) that choice weighs against."""
    if prefix is None:
        log.warning("kv disk tier off: this graph has no prefix cache (prefix_cache=False or a policy that "
                    "takes no part), so there is nothing to spill")
        return None
    why = disk_unsupported_reason(compiled.binding.policies)
    if why:
        log.warning("kv disk tier off: %s", why)
        prefix.disk_off = why
        return None
    if disk_gb is not None and disk_gb <= 0:
        raise ValueError(f"kv_cache_disk_gb must be > 0, got {disk_gb}")
    model_id = model_identity(config, model_path, compiled, adapter_path)
    store = BlockStore(root, model_id, None if disk_gb is None else int(disk_gb * (1 << 30)))
    tier = DiskTier(prefix, io, store, model_id, block_tokens, DiskReadChoice(read, prefill_rate, store.dir))
    attach(prefix, io, tier)
    log.info("kv disk tier: %s (model %s, blocks of %d tokens%s, read %s)", store.dir, model_id[:12], block_tokens,
             "" if disk_gb is None else f", cap {disk_gb:g} GB", read)
    return tier

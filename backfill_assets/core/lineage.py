"""Lineage between MVs: which MV reads which, the order barriers run in, cycles refused.

Why a graph of its own: an MV whose upstream is another MV's table must run its barrier after
that MV's, so one upstream commit flows through a whole chain in one pass, and a chain that
closes on itself can never be consistent (each MV would be a function of its own output). Both
are decided here, on table keys alone, before anything is read or written; the callers
(resources/catalog.py, the wiring) pass each MV's tables already resolved to URIs.

Edges point from a reader to the MV whose `downstream_mv` it reads ("a reads b"). Reading an
MV's own state tables (`backfill_progress`, `replicated_state`) is refused, and so is an MV
whose folder would hold, or lie inside, a table some MV reads: its writes would land in that
table's folder.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from backfill_assets.core.errors import BackfillError, InvalidMVDefinition, MVLineageCycle

_KEY_PART = re.compile(r"[^A-Za-z0-9_]")  # what Dagster refuses in an asset-key part


def table_key(uri: str) -> str:
    """The one spelling of a table's location that lineage compares: ``file://`` dropped, a
    local path normalised (``a/./b/`` is ``a/b``), ``s3a://`` is ``s3://``, the scheme lower
    case and repeated or trailing slashes gone. Relative names must be resolved first."""
    if "://" in uri:
        scheme, rest = uri.split("://", 1)
        scheme = scheme.lower()
        if scheme != "file":
            scheme = "s3" if scheme == "s3a" else scheme
            return f"{scheme}://" + "/".join(p for p in rest.split("/") if p)
        uri = rest if rest.startswith("/") else "/" + rest
    return posixpath.normpath(uri) if uri else uri


def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


@dataclass(frozen=True)
class MVNode:
    """One MV as lineage sees it: the tables it reads and writes, as URIs (any spelling)."""

    name: str
    reads: tuple[str, ...]  # its upstream table(s)
    output: str  # its downstream_mv: what another MV may read
    state: tuple[str, ...] = ()  # its own progress and replica tables: nobody reads these

    @property
    def folder(self) -> str:
        """The folder that holds the MV's tables (the parent of its output)."""
        return posixpath.dirname(table_key(self.output))


@dataclass(frozen=True)
class Lineage:
    """The healthy MVs in barrier order, who reads whom, and the MVs refused (by name)."""

    order: tuple[str, ...]  # every healthy MV after the MVs it reads, wave by wave
    upstream_tables: Mapping[str, tuple[str, ...]]  # MV -> the table keys it reads
    reads: Mapping[str, tuple[str, ...]]  # MV -> the healthy MVs whose output it reads
    readers: Mapping[str, tuple[str, ...]]  # MV -> the healthy MVs reading its output
    external: Mapping[str, tuple[str, ...]]  # table key no healthy MV writes -> its readers
    refused: Mapping[str, BackfillError] = field(default_factory=dict)  # MV -> why
    # MV -> the broken MVs whose output it reads (as a plain table, at its last version)
    reads_broken: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def waves(self) -> tuple[tuple[str, ...], ...]:
        """The healthy MVs in waves: each MV is in the wave after the last MV it reads, so the
        MVs of one wave may run their barriers at the same time."""
        depth: dict[str, int] = {}
        for name in self.order:
            depth[name] = 1 + max((depth[u] for u in self.reads[name]), default=-1)
        out: list[list[str]] = [[] for _ in range(1 + max(depth.values(), default=-1))]
        for name in self.order:
            out[depth[name]].append(name)
        return tuple(tuple(w) for w in out)

    def downstream(self, names: Iterable[str]) -> tuple[str, ...]:
        """``names`` and every healthy MV that reads them, directly or through others, in
        barrier order (unknown or refused names are left out)."""
        seen: set[str] = set()
        todo = [n for n in names if n in self.reads]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(self.readers[name])
        return tuple(n for n in self.order if n in seen)

    def to_run(self, moved_tables: Iterable[str]) -> tuple[str, ...]:
        """The MVs a commit to ``moved_tables`` (URIs, any spelling) reaches, in barrier
        order: each MV reading a moved table and every MV downstream of it, so a chain
        follows an upstream commit in one pass."""
        keys = {table_key(t) for t in moved_tables}
        return self.downstream(n for n in self.order if keys & set(self.upstream_tables[n]))

    def ready(self, moved_tables: Iterable[str], in_flight: Iterable[str]) -> tuple[str, ...]:
        """Of ``to_run(moved_tables)``, the MVs whose barrier may start now: not already in
        flight (one barrier per MV at a time), and no MV they read, directly or through
        others, about to run or in flight. A reader waits for its upstream MV's barrier, so
        it sees that barrier's commit rather than run twice for one upstream commit."""
        due, running = self.to_run(moved_tables), set(in_flight)
        busy = (set(due) | running) & set(self.readers)
        blocked = set(self.downstream(r for n in busy for r in self.readers[n]))
        return tuple(n for n in due if n not in blocked and n not in running)


def build_lineage(nodes: Iterable[MVNode], broken: Mapping[str, str] | None = None) -> Lineage:
    """The lineage of ``nodes`` (unique names). ``broken`` maps the output URI of each MV that
    could not be loaded to its name, so its readers are told. MVs that read a state table,
    whose folder overlaps a table an MV reads, or that sit on a cycle are refused; the rest
    are ordered."""
    by_name = {n.name: n for n in nodes}
    outputs = {table_key(n.output): n.name for n in by_name.values()}
    refused = _table_refusals(by_name, outputs)
    edges = {n: sorted({outputs[k] for k in _keys(node.reads) if k in outputs} - set(refused))
             for n, node in by_name.items() if n not in refused}
    for cycle in cycles(edges):
        for name in cycle:
            refused[name] = _cycle_error(name, cycle, edges)
    healthy = {n: [u for u in ups if u not in refused] for n, ups in edges.items()
               if n not in refused}
    order = topological_order(healthy)
    readers: dict[str, list[str]] = {n: [] for n in order}
    for name in order:
        for up in healthy[name]:
            readers[up].append(name)
    external: dict[str, list[str]] = {}
    for name in order:
        for key in _keys(by_name[name].reads):
            if outputs.get(key) not in healthy:
                external.setdefault(key, []).append(name)
    broken_keys = {table_key(k): v for k, v in (broken or {}).items()}
    bad = {n: tuple(sorted({broken_keys.get(k) or outputs[k] for k in _keys(by_name[n].reads)
                            if k in broken_keys or outputs.get(k) in refused}))
           for n in order}
    return Lineage(
        order=order,
        upstream_tables={n: _keys(by_name[n].reads) for n in order},
        reads={n: tuple(healthy[n]) for n in order},
        readers={n: tuple(readers[n]) for n in order},
        external={k: tuple(v) for k, v in sorted(external.items())},
        refused=dict(sorted(refused.items())),
        reads_broken={n: b for n, b in bad.items() if b},
    )


def _keys(uris: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(table_key(u) for u in uris))


def _table_refusals(by_name: Mapping[str, MVNode],
                    outputs: Mapping[str, str]) -> dict[str, BackfillError]:
    """MVs reading another MV's state tables, and MVs whose folder overlaps a table that
    some MV reads (other than an MV's output, which lives in its own folder)."""
    state = {table_key(t): n.name for n in by_name.values() for t in n.state}
    out: dict[str, BackfillError] = {}
    for node in by_name.values():
        for key in _keys(node.reads):
            if key in state:
                owner = state[key]
                out[node.name] = InvalidMVDefinition(
                    f"MV {node.name!r} reads {key}, a state table of MV {owner!r}: an MV may "
                    f"read another MV's output only; set its upstream to "
                    f"{table_key(by_name[owner].output)}"
                )
    read_by = {k: n.name for n in by_name.values() for k in _keys(n.reads)
               if k not in outputs and k not in state}
    for node in by_name.values():
        folder = node.folder
        for key, reader in sorted(read_by.items()):
            if node.name not in out and (_inside(key, folder) or _inside(folder, key)):
                out[node.name] = InvalidMVDefinition(
                    f"MV {node.name!r} would keep its tables in {folder}, which overlaps the "
                    f"table {key} that MV {reader!r} reads: rename the MV (its folder is its "
                    "name) or move that table"
                )
    return out


def cycles(edges: Mapping[str, Iterable[str]]) -> list[tuple[str, ...]]:
    """Every set of nodes that reach each other (a strongly connected component with more
    than one node, or one node with an edge to itself), each sorted, the list sorted.
    Tarjan's algorithm without recursion, so a long chain cannot exhaust the stack."""
    succ = {n: [m for m in sorted(set(ms)) if m in edges] for n, ms in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []
    for root in sorted(succ):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(succ[node]):
                work.append((node, i + 1))
                nxt = succ[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1 or node in succ[node]:
                    found.append(tuple(sorted(component)))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(found)


def topological_order(edges: Mapping[str, Iterable[str]]) -> tuple[str, ...]:
    """Every node after the nodes it points to (its upstreams), wave by wave: first every
    node with no upstream, then every node whose upstreams are all placed, and so on, each
    wave by name (so the order does not depend on the input's, and the MVs that may run at
    once are neighbours). Raises MVLineageCycle on a cycle; edges to nodes not in ``edges``
    are ignored."""
    ups = {n: set(ms) & set(edges) for n, ms in edges.items()}
    downs: dict[str, list[str]] = {n: [] for n in ups}
    for n, ms in ups.items():
        for m in ms:
            downs[m].append(n)
    waiting = {n: len(ms) for n, ms in ups.items()}
    wave = sorted(n for n, k in waiting.items() if k == 0)
    order: list[str] = []
    while wave:
        order += wave
        following = []
        for name in wave:
            for d in downs[name]:
                waiting[d] -= 1
                if waiting[d] == 0:
                    following.append(d)
        wave = sorted(following)
    if len(order) < len(ups):
        cycle = cycles(edges)[0]
        raise _cycle_error(cycle[0], cycle, edges)
    return tuple(order)


def cycle_path(start: str, members: Iterable[str],
               edges: Mapping[str, Iterable[str]]) -> tuple[str, ...]:
    """A shortest walk from ``start`` back to itself inside ``members``: the cycle as a
    user reads it (``a -> b -> a``: a reads b, b reads a)."""
    inside = set(members)
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for m in sorted(set(edges.get(node, ()))):
                if m == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return (start, *reversed(path[:-1]), start)
                if m in inside and m not in came:
                    came[m] = node
                    nxt.append(m)
        frontier = nxt
    return (start,)


def _cycle_error(name: str, cycle: tuple[str, ...],
                 edges: Mapping[str, Iterable[str]]) -> MVLineageCycle:
    path = cycle_path(cycle[0], cycle, edges)
    others = sorted(set(cycle) - set(path))
    return MVLineageCycle(
        f"MV {name!r} is on a lineage cycle {' -> '.join(path)} (each reads the next one's "
        "output, so none of them can be a function of an upstream)"
        + (f"; also on it: {', '.join(others)}" if others else "")
        + ": point one of them at an upstream table outside the cycle"
    )


def external_asset_paths(tables: Iterable[str], root: str) -> dict[str, tuple[str, ...]]:
    """The asset key path of each upstream table no MV writes, shared by every MV reading it:
    ``("tables", ...)`` and the table's path under the warehouse ``root`` (``upstream`` is
    ``("tables", "upstream")``), or its scheme and full path outside it, each part reduced
    to what Dagster allows in a key (letters, digits, ``_``). Two tables whose reduced paths
    meet both get a short hash of their key, so each table keeps its own asset."""
    root_key = table_key(root)
    out: dict[str, tuple[str, ...]] = {}
    for key in sorted({table_key(t) for t in tables}):
        if _inside(key, root_key) and key != root_key:
            parts = key[len(root_key.rstrip("/")) + 1:].split("/")
        else:
            scheme, _, rest = key.rpartition("://")
            parts = [scheme or "file", *(p for p in rest.split("/") if p)]
        out[key] = ("tables", *(_KEY_PART.sub("_", p) or "_" for p in parts))
    seen: dict[tuple[str, ...], int] = {}
    for path in out.values():
        seen[path] = seen.get(path, 0) + 1
    return {k: (p[:-1] + (f"{p[-1]}_{_short_hash(k)}",) if seen[p] > 1 else p)
            for k, p in out.items()}


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]

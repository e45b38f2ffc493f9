"""A playbook's steps and arcs as a layered graph, for the UI to draw.

The layout is computed here, not in the browser, so every client draws the same picture
and the page needs no layout library: arcs that close a cycle (an arc back to a step
already on the path from the entry) are set aside, every other step goes one layer right
of its furthest predecessor (the longest path from the entry), and the steps of a layer
are ordered by the average position of their neighbours (a few sweeps down and up, the
barycenter heuristic), which keeps most arcs from crossing.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import TypedDict

from flowtide.playbook.model import Playbook, Step

__all__ = ["Graph", "GraphEdge", "GraphNode", "playbook_graph"]


class NodeLoop(TypedDict):
    mode: str
    iterator: str


class GraphNode(TypedDict):
    """A step, and where it is drawn: its `layer` (left to right) and `position` in it."""

    name: str
    #: The tool's kind; `pipeline` for several tasks, `noop` for none.
    kind: str
    loop: NodeLoop | None
    line: int | None
    desc: str | None
    layer: int
    position: int
    entry: bool


#: An arc between two steps (`from` is a Python keyword, hence the functional form).
GraphEdge = TypedDict(
    "GraphEdge",
    {
        "from": str,
        "to": str,
        "when": str | None,
        "mode": str,
        "line": int | None,
        #: The arc closes a cycle (drawn back, left out of the layering).
        "back": bool,
    },
)


class Graph(TypedDict):
    nodes: list[GraphNode]
    edges: list[GraphEdge]
    #: How many steps each layer holds.
    layers: list[int]


#: Sweeps of the ordering heuristic (each one down and one up).
SWEEPS = 4
#: How much of an arc's condition the graph carries (the playbook has the rest).
WHEN_CHARS = 200


def _kind(step: Step) -> str:
    if not step.tasks:
        return "noop"
    if step.pipeline or len(step.tasks) > 1:
        return "pipeline"
    return step.tasks[0].kind


def _when(value: Any) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= WHEN_CHARS else text[: WHEN_CHARS - 1] + "…"


def _back_edges(names: list[str], out: dict[str, list[str]], entry: str) -> set[tuple[str, str]]:
    """The arcs into a step on the current depth-first path from the entry (then from
    each step not reached yet, in file order): removing them leaves no cycle."""
    back: set[tuple[str, str]] = set()
    state: dict[str, int] = {}  # 1: on the path, 2: done
    for root in [entry, *names]:
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(out[root]))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
            elif state.get(child) == 1:
                back.add((node, child))
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(out[child])))
    return back


def _layers(names: list[str], forward: list[tuple[str, str]]) -> dict[str, int]:
    """Longest-path layering of the acyclic arcs (Kahn's order)."""
    preds: dict[str, list[str]] = {n: [] for n in names}
    succs: dict[str, list[str]] = {n: [] for n in names}
    for a, b in forward:
        preds[b].append(a)
        succs[a].append(b)
    indegree = {n: len(preds[n]) for n in names}
    ready = [n for n in names if indegree[n] == 0]
    layer = dict.fromkeys(names, 0)
    while ready:
        node = ready.pop(0)
        for child in succs[node]:
            layer[child] = max(layer[child], layer[node] + 1)
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    return layer


def _order(
    names: list[str], layer: dict[str, int], forward: list[tuple[str, str]]
) -> dict[str, int]:
    """Each step's position in its layer (barycenter sweeps, file order first)."""
    depth = max(layer.values(), default=0) + 1
    rows: list[list[str]] = [[] for _ in range(depth)]
    for n in names:
        rows[layer[n]].append(n)
    preds: dict[str, list[str]] = {n: [] for n in names}
    succs: dict[str, list[str]] = {n: [] for n in names}
    for a, b in forward:
        preds[b].append(a)
        succs[a].append(b)
    pos = {n: i for row in rows for i, n in enumerate(row)}

    def sweep(indexes: range, neighbours: dict[str, list[str]]) -> None:
        for i in indexes:
            row = rows[i]

            def key(n: str) -> float:
                near = neighbours[n]
                return sum(pos[m] for m in near) / len(near) if near else pos[n]

            row.sort(key=key)  # stable: ties keep their order
            pos.update((n, j) for j, n in enumerate(row))

    for _ in range(SWEEPS):
        sweep(range(1, depth), preds)
        sweep(range(depth - 2, -1, -1), succs)
    return pos


def playbook_graph(playbook: Playbook) -> Graph:
    """`nodes` (each step: `name`, `kind`, `loop`, `line`, `desc`, `layer`, `position`)
    and `edges` (each arc: `from`, `to`, `when`, `mode`, `line`, `back` when it closes
    a cycle), plus `layers`: how many steps each layer holds."""
    names = list(playbook.steps)
    out: dict[str, list[str]] = {n: [] for n in names}
    edges: list[GraphEdge] = []
    for name, step in playbook.steps.items():
        for arc in step.next.arcs:
            if arc.step not in out:
                continue
            out[name].append(arc.step)
            edges.append(
                {
                    "from": name,
                    "to": arc.step,
                    "when": _when(arc.when),
                    "mode": step.next.mode,
                    "line": arc.line,
                    "back": False,
                }
            )
    back = _back_edges(names, out, playbook.entry) if names else set()
    forward = [(e["from"], e["to"]) for e in edges if (e["from"], e["to"]) not in back]
    # One arc per pair in the layering (two arcs between the same steps, with other
    # conditions, are drawn as two but weigh as one).
    forward = list(dict.fromkeys(forward))
    layer = _layers(names, forward)
    position = _order(names, layer, forward)
    for e in edges:
        e["back"] = (e["from"], e["to"]) in back
    nodes: list[GraphNode] = []
    for name, step in playbook.steps.items():
        loop: NodeLoop | None = None
        if step.loop is not None:
            loop = {"mode": step.loop.mode, "iterator": step.loop.iterator}
        nodes.append(
            {
                "name": name,
                "kind": _kind(step),
                "loop": loop,
                "line": step.line,
                "desc": step.desc,
                "layer": layer[name],
                "position": position[name],
                "entry": name == playbook.entry,
            }
        )
    counts = [0] * (max(layer.values(), default=-1) + 1)
    for n in names:
        counts[layer[n]] += 1
    return {"nodes": nodes, "edges": edges, "layers": counts}

"""State diagrams as inline SVG, drawn from the machines in ``states.py``.

Each state is a link with its count and the age of its oldest item. Shape and text carry the
meaning, colour only repeats it: failed states are octagons marked ✖, final states have a double
border, held states a dashed box marked ❚❚, the current state a thick frame labelled "current",
and operator moves are dashed arrows. Every piece of text goes through format_html.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from queues.core.states import AccessState, BatchState, JobState, Kind, Machine

NODE_W = 132
NODE_H = 62
GAP_X = 30
GAP_Y = 54
PAD = 22

# Where each state sits on its machine's diagram: (column, row) on a grid. Drawing only; the
# rules are in states.py.
_J, _B, _A = JobState, BatchState, AccessState
LAYOUTS: dict[str, dict[str, tuple[int, int]]] = {
    "job": {
        _J.PENDING: (0, 1),
        _J.HELD: (0, 0),
        _J.ESTIMATING: (1, 1),
        _J.PROVISIONING: (2, 1),
        _J.DOWNLOADING: (3, 1),
        _J.PROCESSING: (4, 1),
        _J.STORING: (5, 1),
        _J.RECORDING: (6, 1),
        _J.NOTIFY: (7, 1),
        _J.COMPLETED: (8, 1),
        _J.FAILED: (4, 2),
        _J.DELETED: (8, 2),
    },
    "batch": {
        _B.PENDING: (0, 1),
        _B.HELD: (0, 0),
        _B.PROCESSING: (1, 1),
        _B.REPORTING: (2, 1),
        _B.COMPLETED: (3, 1),
        _B.FAILED: (3, 2),
        _B.UPDATE_REPORTING: (2, 2),
        _B.DELETED: (4, 2),
    },
    "access": {
        _A.PENDING: (0, 1),
        _A.PROCESSING: (1, 1),
        _A.COMPLETED: (2, 1),
        _A.FAILED: (2, 2),
        _A.DELETED: (3, 2),
    },
}


def _layout(machine: Machine) -> dict[str, tuple[int, int]]:
    return LAYOUTS[machine.name]


GLYPHS = {"failed": "✖", "held": "❚❚", "completed": "✔", "deleted": "∅"}


def human_age(seconds: float | None) -> str:
    """A short age: 45s, 12m, 5h 3m, 2d 4h."""
    if seconds is None:
        return ""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h" if hours else f"{days}d"


def _plural(noun: str) -> str:
    return f"{noun}es" if noun.endswith(("s", "ch")) else f"{noun}s"


def shape_of(machine: Machine, state: str) -> str:
    """The shape family of a state: failed, held, completed, deleted (final) or step."""
    if state == JobState.FAILED:  # the three machines share these wire names
        return "failed"
    if state == JobState.HELD:
        return "held"
    if state == JobState.DELETED:
        return "deleted"
    if state in machine.terminal:
        return "completed"
    return "step"


def _center(machine: Machine, state: str) -> tuple[float, float]:
    col, row = _layout(machine)[state]
    row -= min(r for _c, r in _layout(machine).values())  # no empty band above the top row
    return (
        PAD + col * (NODE_W + GAP_X) + NODE_W / 2,
        PAD + 14 + row * (NODE_H + GAP_Y) + NODE_H / 2,
    )


def _clip(cx: float, cy: float, dx: float, dy: float, margin: float) -> tuple[float, float]:
    """The point where a ray from a node's centre leaves its box (plus ``margin``)."""
    hw, hh = NODE_W / 2 + margin, NODE_H / 2 + margin
    t = min(hw / abs(dx) if dx else math.inf, hh / abs(dy) if dy else math.inf)
    return cx + dx * t, cy + dy * t


def _edge(machine: Machine, source: str, target: str, bend: float) -> str:
    """An SVG path from source to target, bent sideways by ``bend`` (pixels)."""
    (x1, y1), (x2, y2) = _center(machine, source), _center(machine, target)
    length = math.hypot(x2 - x1, y2 - y1) or 1
    nx, ny = -(y2 - y1) / length, (x2 - x1) / length  # unit normal
    mx, my = (x1 + x2) / 2 + nx * bend, (y1 + y2) / 2 + ny * bend
    sx, sy = _clip(x1, y1, mx - x1, my - y1, 2)
    ex, ey = _clip(x2, y2, mx - x2, my - y2, 6)
    return f"M{sx:.1f},{sy:.1f} Q{mx:.1f},{my:.1f} {ex:.1f},{ey:.1f}"


def _edges(machine: Machine) -> list[tuple[str, str, str, str]]:
    """(source, target, css kind, title) per drawn arrow.

    A move both a consumer and an operator can make is drawn once, solid; arrows only an
    operator can take are dashed.
    """
    pairs: dict[tuple[str, str], list] = {}
    for move in machine.moves:
        pairs.setdefault((move.source, move.target), []).append(move)
    drawn = []
    for (source, target), moves in pairs.items():
        consumer = [m for m in moves if m.kind is not Kind.ADMIN]
        admin = [m.action for m in moves if m.kind is Kind.ADMIN]
        kind = consumer[0].kind.value if consumer else "admin"
        title = f"{source} → {target}"
        if admin:
            title += f" (operator: {', '.join(sorted(set(admin)))})"
        drawn.append((source, target, kind, title))
    return drawn


def _node(
    machine: Machine,
    state: str,
    *,
    count: int | None,
    oldest: float | None,
    current: bool,
    step_number: str | None,
    href: str | None,
    noun: str,
    id_prefix: str,
    notes: Sequence[str] = (),
) -> SafeString:
    cx, cy = _center(machine, state)
    x, y = cx - NODE_W / 2, cy - NODE_H / 2
    shape = shape_of(machine, state)
    parts: list[str] = []
    if shape == "failed":
        c = 14
        pts = [
            (x + c, y),
            (x + NODE_W - c, y),
            (x + NODE_W, y + c),
            (x + NODE_W, y + NODE_H - c),
            (x + NODE_W - c, y + NODE_H),
            (x + c, y + NODE_H),
            (x, y + NODE_H - c),
            (x, y + c),
        ]
        parts.append(
            format_html(
                '<polygon class="box" points="{}"/>',
                " ".join(f"{px:.1f},{py:.1f}" for px, py in pts),
            )
        )
    elif shape == "held":
        parts.append(
            format_html(
                '<rect class="box" x="{}" y="{}" width="{}" height="{}" stroke-dasharray="7 4"/>',
                x,
                y,
                NODE_W,
                NODE_H,
            )
        )
    else:
        parts.append(
            format_html(
                '<rect class="box" x="{}" y="{}" width="{}" height="{}" rx="9"/>',
                x,
                y,
                NODE_W,
                NODE_H,
            )
        )
        if shape in ("completed", "deleted"):
            parts.append(
                format_html(
                    '<rect class="inner" x="{}" y="{}" width="{}" height="{}" rx="6"/>',
                    x + 4,
                    y + 4,
                    NODE_W - 8,
                    NODE_H - 8,
                )
            )
    if current:
        parts.append(
            format_html(
                '<rect class="current-frame" x="{}" y="{}" width="{}" height="{}" rx="12"/>'
                '<text class="current-label" x="{}" y="{}" text-anchor="middle">▼ current</text>',
                x - 5,
                y - 5,
                NODE_W + 10,
                NODE_H + 10,
                cx,
                y - 9,
            )
        )
    glyph = GLYPHS.get(shape, "")
    label = f"{glyph} {state}" if glyph else state
    parts.append(
        format_html(
            '<text class="name" x="{}" y="{}" text-anchor="middle">{}</text>', cx, y + 20, label
        )
    )
    if count is not None:
        parts.append(
            format_html(
                '<text class="count" x="{}" y="{}" text-anchor="middle" id="{}">{} {}</text>',
                cx,
                y + 38,
                f"count-{id_prefix}-{state}",
                count,
                noun if count == 1 else _plural(noun),
            )
        )
    if oldest is not None and count:
        parts.append(
            format_html(
                '<text class="age" x="{}" y="{}" text-anchor="middle" id="{}">oldest {}</text>',
                cx,
                y + 53,
                f"age-{id_prefix}-{state}",
                human_age(oldest),
            )
        )
    for i, note in enumerate(notes):
        # What keeps jobs waiting here (a hold, a cap: queues/console/waits.py), under the box;
        # moved right as far as its estimated width needs to stay inside the drawing.
        nx = max(cx, 4 + 3.4 * len(note))
        parts.append(
            format_html(
                '<text class="wait" x="{}" y="{}" text-anchor="middle" id="{}">{}</text>',
                f"{nx:.1f}",
                y + NODE_H + 13 + 12 * i,
                f"wait-{id_prefix}-{state}-{i}",
                note,
            )
        )
    if step_number is not None:
        # A state visited more than once (a failed step resumed) carries every visit's number.
        rx = max(10, 4 + 3.6 * len(step_number))
        parts.append(
            format_html(
                '<ellipse class="step" cx="{}" cy="{}" rx="{}" ry="10"/>'
                '<text class="step-number" x="{}" y="{}" text-anchor="middle">{}</text>',
                x + 4,
                y + 4,
                f"{rx:.1f}",
                x + 4,
                y + 8,
                step_number,
            )
        )
    tooltip = state
    if count is not None:
        tooltip += f": {count} {noun if count == 1 else _plural(noun)}"
    if oldest is not None and count:
        tooltip += f", oldest {human_age(oldest)}"
    for note in notes:
        tooltip += f"; {note}"
    body = mark_safe("".join(parts))  # noqa: S308 - every part came from format_html
    classes = f"node shape-{shape}" + (" current" if current else "")
    if href:
        return format_html(
            '<a href="{}" class="{}" id="{}"><title>{}</title>{}</a>',
            href,
            classes,
            f"node-{id_prefix}-{state}",
            tooltip,
            body,
        )
    return format_html(
        '<g class="{}" id="{}"><title>{}</title>{}</g>',
        classes,
        f"node-{id_prefix}-{state}",
        tooltip,
        body,
    )


def render(
    machine: Machine,
    *,
    counts: Mapping[str, int] | None = None,
    oldest: Mapping[str, float | None] | None = None,
    current: str | None = None,
    path: Sequence[str] = (),
    href: Callable[[str], str | None] | None = None,
    title: str = "",
    noun: str = "item",
    id_prefix: str | None = None,
    admin_from: str | None = None,
    notes: Mapping[str, Sequence[str]] | None = None,
) -> SafeString:
    """The machine as an <svg>; ``path`` (a list of states) is drawn as numbered steps.

    With ``admin_from`` the operator-only (dashed) moves are drawn only out of that state, the
    ones an operator can take from there (a job's page), so they do not cross each other.
    ``notes`` are lines written under a state's box (what keeps its items waiting)."""
    id_prefix = id_prefix or machine.name
    grid = _layout(machine).values()
    cols = max(c for c, _r in grid) + 1
    rows = max(r for _c, r in grid) - min(r for _c, r in grid) + 1
    width = PAD * 2 + cols * NODE_W + (cols - 1) * GAP_X
    height = PAD * 2 + 14 + rows * NODE_H + (rows - 1) * GAP_Y
    edge_parts: list[str] = []
    drawn = _edges(machine)
    pairs = {(s, t) for s, t, _k, _t in drawn}
    for source, target, kind, edge_title in drawn:
        if admin_from is not None and kind == "admin" and source != admin_from:
            continue
        (c1, r1), (c2, r2) = _layout(machine)[source], _layout(machine)[target]
        neighbours = abs(c1 - c2) + abs(r1 - r2) == 1
        # Arrows both ways between two states bend apart; long ones bend around the nodes.
        bend = 0.0 if neighbours and (target, source) not in pairs else 16.0
        if not neighbours and r1 == r2:
            bend = 38.0
        dash = ' stroke-dasharray="6 5"' if kind == "admin" else ""
        edge_parts.append(
            format_html(
                '<path class="edge edge-{}" d="{}"{} marker-end="url(#arrow-{})">'
                "<title>{}</title></path>",
                kind,
                _edge(machine, source, target, bend),
                mark_safe(dash),  # noqa: S308 - a constant
                id_prefix,
                edge_title,
            )
        )
    for a, b in itertools.pairwise(path):
        if a in _layout(machine) and b in _layout(machine):
            edge_parts.append(
                format_html(
                    '<path class="edge edge-path" d="{}" marker-end="url(#arrow-{})"/>',
                    _edge(machine, a, b, 0.0 if (b, a) not in pairs else 16.0),
                    id_prefix,
                )
            )
    visits: dict[str, list[str]] = {}
    for i, state in enumerate(path):
        visits.setdefault(state, []).append(str(i + 1))
    positions = {state: ",".join(numbers) for state, numbers in visits.items()}
    drawn_states = [state for state in machine.states if state in _layout(machine)]
    links = {state: href(state) if href else None for state in drawn_states}
    node_parts = [
        _node(
            machine,
            state,
            count=None if counts is None else counts.get(state, 0),
            oldest=(oldest or {}).get(state),
            current=state == current,
            step_number=positions.get(state),
            href=links[state],
            noun=noun,
            id_prefix=id_prefix,
            notes=(notes or {}).get(state, ()),
        )
        for state in drawn_states
    ]
    # A picture with links in it is a group, not an image: an image's content is hidden from
    # screen readers, so its links would take the keyboard's focus yet have no name there.
    linked = any(links.values())
    return format_html(
        '<svg class="diagram" viewBox="0 0 {} {}" width="{}" height="{}" role="{}" '
        'aria-labelledby="{}" '
        'xmlns="http://www.w3.org/2000/svg">'
        '<title id="{}">{}</title>'
        '<defs><marker id="arrow-{}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" '
        'markerHeight="9" markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" class="arrowhead"/></marker></defs>'
        '<g class="edges">{}</g><g class="nodes">{}</g></svg>',
        width,
        height,
        width,
        height,
        "group" if linked else "img",
        f"diagram-title-{id_prefix}",
        f"diagram-title-{id_prefix}",
        title or f"{machine.name} states",
        id_prefix,
        mark_safe("".join(edge_parts)),  # noqa: S308 - every part came from format_html
        mark_safe("".join(node_parts)),  # noqa: S308 - every part came from format_html
    )

"""The dashboard's widgets: one panel per GPU, drawn from a :class:`~krex_lab.dashboard.model.NodeState`.

A :class:`Dashboard` owns the state (events go through :func:`~krex_lab.dashboard.model.reduce`
under a lock) and its feed thread (:mod:`krex_lab.dashboard.feed`). The feed thread also draws:
at most once every ``refresh`` seconds, and only when something changed (or a region is held,
whose elapsed time moves), every widget is updated inside ``hold_sync`` so that one draw sends
one message per widget. Widgets may be updated from that thread while the kernel runs other
cells: ipykernel sends comm messages from any thread.

Everything a panel shows is plain HTML/SVG (the bars are ``FloatProgress``), so
:func:`panel_html` and :func:`timeline_svg` are also usable without widgets.
"""

from __future__ import annotations

import contextlib
import html
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import ipywidgets as widgets

from .feed import Feed
from .model import MAX_REGIONS, Event, GpuState, NodeState, RegionRecord, reduce

STYLE = """<style>
.krex-dash {font-family: var(--jp-ui-font-family, sans-serif); font-size: 12px}
.krex-dash .widget-html-content {line-height: 1.4 !important}
.krex-dash .widget-html, .krex-dash .widget-hbox {height: auto !important; margin-top: 1px; margin-bottom: 1px}
.krex-gpu {border: 1px solid #bbb; border-radius: 6px; padding: 6px; margin: 4px; width: 480px}
.krex-stale {opacity: 0.45}
.krex-badge {border-radius: 3px; padding: 0 4px; font-size: 11px; color: white}
.krex-sim {background: #b36b00} .krex-real {background: #2e7d32} .krex-bad {background: #c62828}
.krex-ok {background: #2e7d32}
.krex-tbl {border-collapse: collapse; font-size: 11px} .krex-tbl td, .krex-tbl th {padding: 0 6px 0 0;
 text-align: left}
.krex-muted {color: #777}
</style>"""

WAIT_COLOR, HOLD_COLOR, BAD_COLOR, FREE_COLOR = "#f0a030", "#3b78c2", "#c62828", "#9e9e9e"


# -- formatting ---------------------------------------------------------------------------
def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.0f} MiB"


def fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def backend_badge(state: NodeState, gpu: GpuState) -> str:
    if gpu.simulated or state.simulated:
        return '<span class="krex-badge krex-sim">SIMULATED (fake backend)</span>'
    return f'<span class="krex-badge krex-real">{esc(state.backend or "?")}</span>'


# -- pure HTML pieces ----------------------------------------------------------------------
def title_html(state: NodeState, gpu: GpuState) -> str:
    gate = '<span class="krex-badge krex-bad">gate closed</span>' if gpu.gate_closed else ""
    return f"<b>GPU {gpu.index}</b>: {esc(gpu.name)} {backend_badge(state, gpu)} {gate}"


def readings_html(gpu: GpuState) -> tuple[str, str, str]:
    util = "n/a" if gpu.utilization is None else f"{gpu.utilization:.0f}%"
    mem = f"{fmt_bytes(gpu.memory_used)} / {fmt_bytes(gpu.memory_total)}" if gpu.memory_total else "n/a"
    clock = "SM clock " + ("n/a" if gpu.sm_clock_mhz is None else f"{gpu.sm_clock_mhz} MHz")
    return util, mem, clock


def holder_html(gpu: GpuState, now: float) -> str:
    h = gpu.holder
    if h is None:
        return '<b>region:</b> <span class="krex-muted">none held</span>'
    elapsed = max(0.0, now - h.since)
    frac = min(1.0, elapsed / h.max_hold_s) if h.max_hold_s else 0.0
    color = BAD_COLOR if frac > 0.9 or h.degraded else HOLD_COLOR
    flags = "".join(
        [
            ' <span class="krex-badge krex-bad">DEGRADED</span>' if h.degraded else "",
            f' <span class="krex-badge krex-bad">{h.intruders} intruder(s)</span>' if h.intruders else "",
            f" {esc(h.state)}" if h.state != "held" else "",
        ]
    )
    bar = (
        f'<div style="display:inline-block;width:120px;height:8px;background:#ddd;vertical-align:middle">'
        f'<div style="width:{frac * 100:.0f}%;height:8px;background:{color}"></div></div>'
    )
    # Another user's region on a private arbiter carries no session name or pid: say whose it is
    # and no more (never "pid 0").
    what = f" &middot; {esc(h.name)} ({esc(h.role or 'session')}, pid {h.pid})" if h.pid else ""
    return (
        f"<b>region {esc(h.region)}</b> held by <b>{esc(h.user)}</b>{what} "
        f"{bar} {fmt_s(elapsed)} / {fmt_s(h.max_hold_s)} max_hold{flags}"
    )


def queue_html(gpu: GpuState, now: float) -> str:
    if not gpu.queue:
        return '<b>waiting:</b> <span class="krex-muted">nobody</span>'
    items = "".join(
        f"<li>{esc(w.user)}{f' &middot; {esc(w.name)} (pid {w.pid}, {esc(w.region)})' if w.pid else ''} "
        f"waiting {fmt_s(max(0.0, now - w.since))}</li>"
        for w in gpu.queue
    )
    return f'<b>waiting ({len(gpu.queue)}):</b><ol style="margin:0;padding-left:20px">{items}</ol>'


def sessions_html(gpu: GpuState) -> str:
    others = ", ".join(f"{esc(u)} ({n})" for u, n in gpu.others)
    tail = f' <span class="krex-muted">other users: {others}</span>' if others else ""
    if not gpu.sessions:
        return f'<b>sessions:</b> <span class="krex-muted">none</span>{tail}'
    frozen = set(gpu.holder.frozen) if gpu.holder else set()
    waiting = {w.session for w in gpu.queue}
    rows = []
    for s in gpu.sessions:
        what = (
            "holding"
            if gpu.holder and gpu.holder.session == s.id
            else "frozen"
            if s.pid in frozen
            else "waiting"
            if s.id in waiting
            else ""
        )
        rows.append(
            f'<tr class="krex-session"><td>{esc(s.user)}</td><td>{esc(s.name)}</td><td>{esc(s.role)}</td>'
            f"<td>{s.pid}</td><td>{fmt_bytes(s.memory)}</td><td>{what}</td></tr>"
        )
    head = "<tr><th>user</th><th>name</th><th>role</th><th>pid</th><th>memory</th><th></th></tr>"
    return f'<b>sessions ({len(gpu.sessions)}):</b>{tail}<table class="krex-tbl">{head}{"".join(rows)}</table>'


def timeline_svg(regions: Sequence[RegionRecord], width: int = 440, height: int = 96) -> str:
    """Recent regions, oldest left: a column each, wait (amber) under hold (blue), drained/frozen counts
    below, degraded or expired ones outlined red with a mark; hover shows the details."""
    if not regions:
        return '<div class="krex-muted">no finished regions yet</div>'
    left, top, rows = 38, 10, 22  # rows: space for the two count lines
    plot_h = height - top - rows
    slot = (width - left) / MAX_REGIONS
    longest = max((r.wait_s + (r.hold_s or 0.0)) for r in regions) or 1e-3
    parts = [
        f'<svg class="krex-timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="8">',
        f'<text x="0" y="{top + 6}">{esc(fmt_s(longest))}</text>',
        f'<line x1="{left - 2}" y1="{top + plot_h}" x2="{width}" y2="{top + plot_h}" stroke="#999"/>',
        f'<text x="0" y="{top + plot_h + 9}">drained</text><text x="0" y="{top + plot_h + 19}">frozen</text>',
    ]
    for i, r in enumerate(regions[-MAX_REGIONS:]):
        x = left + i * slot
        w = max(2.0, slot - 3)
        wait_h = plot_h * r.wait_s / longest
        hold_h = plot_h * (r.hold_s or 0.0) / longest
        bad = r.degraded or r.expired
        tip = (
            f"{r.region} {r.user}/{r.name}: queued {fmt_s(r.wait_s)}, held {fmt_s(r.hold_s)}, "
            f"drained {r.drained}, frozen {r.frozen}"
            + (", DEGRADED" if r.degraded else "")
            + (", LEASE EXPIRED" if r.expired else "")
            + (f" ({r.released_by})" if r.released_by else "")
        )
        stroke = f' stroke="{BAD_COLOR}" stroke-width="1.5"' if bad else ""
        cls = "krex-region degraded" if bad else "krex-region"
        parts.append(f'<g class="{cls}" data-region="{esc(r.region)}"><title>{esc(tip)}</title>')
        base = top + plot_h
        parts.append(
            f'<rect class="wait" x="{x:.1f}" y="{base - wait_h:.1f}" width="{w:.1f}" '
            f'height="{wait_h:.1f}" fill="{WAIT_COLOR}"/>'
        )
        color = HOLD_COLOR if r.hold_s is not None else FREE_COLOR
        parts.append(
            f'<rect class="hold" x="{x:.1f}" y="{base - wait_h - hold_h:.1f}" width="{w:.1f}" '
            f'height="{max(hold_h, 1.0):.1f}" fill="{color}"{stroke}/>'
        )
        if bad:
            parts.append(
                f'<text class="mark" x="{x + w / 2:.1f}" y="{top - 2}" text-anchor="middle" '
                f'fill="{BAD_COLOR}" font-weight="bold">!</text>'
            )
        cx = x + w / 2
        parts.append(
            f'<text x="{cx:.1f}" y="{base + 9}" text-anchor="middle">{r.drained}</text>'
            f'<text x="{cx:.1f}" y="{base + 19}" text-anchor="middle">{r.frozen}</text></g>'
        )
    parts.append("</svg>")
    last = regions[-1]
    legend = (
        f'<div class="krex-muted"><span style="color:{WAIT_COLOR}">&#9646;</span> queued '
        f'<span style="color:{HOLD_COLOR}">&#9646;</span> hold <span style="color:{BAD_COLOR}">!</span> '
        f"degraded/expired &middot; last: {esc(last.region)} {esc(last.user)}/{esc(last.name)} queued "
        f"{fmt_s(last.wait_s)}, held {fmt_s(last.hold_s)}"
        + (' <b style="color:#c62828">DEGRADED</b>' if last.degraded else "")
        + "</div>"
    )
    return "".join(parts) + legend


def header_html(state: NodeState, now: float) -> str:
    if state.connected:
        who = f"arbiter pid {state.arbiter_pid}" + (f" at {esc(state.endpoint)}" if state.endpoint else "")
        backend = (
            "<b>SIMULATED GPUs</b> (fake backend): regions are real, the GPUs are not"
            if state.simulated
            else f"backend {esc(state.backend)}"
        )
        lock = "drain by driver lock" if state.lock_capable else "cooperative drain (no driver lock)"
        return (
            f'{STYLE}<span class="krex-badge krex-ok">live</span> KREX dashboard &middot; {who} &middot; '
            f"{backend} &middot; {lock}"
        )
    if state.lost_since is not None:
        ago = fmt_s(max(0.0, now - state.lost_since))
        return (
            f'{STYLE}<span class="krex-badge krex-bad">ARBITER LOST</span> for {ago}: {esc(state.message)} '
            "&middot; reconnecting&hellip; (what follows is the last state seen)"
        )
    return f'{STYLE}<span class="krex-muted">{esc(state.message)}&hellip;</span>'


def panel_html(state: NodeState, gpu: GpuState, now: float) -> str:
    """One GPU's panel as standalone HTML (what the widgets show, with the bars drawn as boxes)."""
    util, mem, clock = readings_html(gpu)
    pct = 0.0 if gpu.utilization is None else gpu.utilization
    mem_pct = 100.0 * gpu.memory_used / gpu.memory_total if gpu.memory_total else 0.0

    def bar(label: str, p: float, text: str) -> str:
        return (
            f'<div>{label} <div style="display:inline-block;width:200px;height:10px;background:#ddd">'
            f'<div style="width:{p:.0f}%;height:10px;background:{HOLD_COLOR}"></div></div> {esc(text)}</div>'
        )

    return (
        f'<div class="krex-gpu">{title_html(state, gpu)}{bar("util", pct, util)}{bar("memory", mem_pct, mem)}'
        f"<div>{esc(clock)}</div><div>{holder_html(gpu, now)}</div><div>{queue_html(gpu, now)}</div>"
        f"<div>{sessions_html(gpu)}</div><div>{timeline_svg(gpu.regions)}</div></div>"
    )


def page_html(state: NodeState, now: float | None = None, gpus: Iterable[int] | None = None) -> str:
    now = time.time() if now is None else now
    wanted = None if gpus is None else set(gpus)
    body = "".join(panel_html(state, g, now) for g in state.gpus if wanted is None or g.index in wanted)
    return (
        f'<div class="krex-dash"><div>{header_html(state, now)}</div>'
        f'<div style="display:flex;flex-wrap:wrap">{body}</div></div>'
    )


# -- widgets ------------------------------------------------------------------------------
class GpuPanel(widgets.VBox):
    """The widgets of one GPU."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.title = widgets.HTML()
        bar = widgets.Layout(width="300px")
        self.util_bar = widgets.FloatProgress(value=0.0, min=0.0, max=100.0, description="util", layout=bar)
        self.util_text = widgets.HTML()
        self.memory_bar = widgets.FloatProgress(value=0.0, min=0.0, max=1.0, description="memory", layout=bar)
        self.memory_text = widgets.HTML()
        self.clock = widgets.HTML()
        self.holder = widgets.HTML()
        self.queue = widgets.HTML()
        self.sessions = widgets.HTML()
        self.timeline = widgets.HTML()
        row = widgets.Layout(align_items="center")
        super().__init__(
            [
                self.title,
                widgets.HBox([self.util_bar, self.util_text], layout=row),
                widgets.HBox([self.memory_bar, self.memory_text], layout=row),
                self.clock,
                self.holder,
                self.queue,
                self.sessions,
                self.timeline,
            ]
        )
        self.add_class("krex-gpu")

    def parts(self) -> list[widgets.DOMWidget]:
        return [
            self,
            self.title,
            self.util_bar,
            self.util_text,
            self.memory_bar,
            self.memory_text,
            self.clock,
            self.holder,
            self.queue,
            self.sessions,
            self.timeline,
        ]

    def update(self, state: NodeState, gpu: GpuState, now: float) -> None:
        util, mem, clock = readings_html(gpu)
        self.title.value = title_html(state, gpu)
        self.util_bar.value = 0.0 if gpu.utilization is None else float(gpu.utilization)
        self.util_text.value = util
        self.memory_bar.max = float(gpu.memory_total or 1)
        self.memory_bar.value = float(min(gpu.memory_used, gpu.memory_total or 1))
        self.memory_text.value = mem
        self.clock.value = clock
        self.holder.value = holder_html(gpu, now)
        self.queue.value = queue_html(gpu, now)
        self.sessions.value = sessions_html(gpu)
        self.timeline.value = timeline_svg(gpu.regions)
        stale = "krex-stale" in self._dom_classes
        if state.connected and stale:
            self.remove_class("krex-stale")
        elif not state.connected and not stale:
            self.add_class("krex-stale")


class Dashboard(widgets.VBox):
    """A live view of the node's GPUs (see :func:`krex_lab.dashboard`)."""

    def __init__(
        self,
        gpus: Iterable[int] | int | None = None,
        refresh: float = 1.0,
        endpoint: str | None = None,
        connect: bool = True,
        silence: float = 3.0,
        retry: float = 1.0,
        first_wait: float = 2.0,
    ) -> None:
        self.gpus = None if gpus is None else ([gpus] if isinstance(gpus, int) else list(gpus))
        self.refresh = float(refresh)
        self.header = widgets.HTML(STYLE + "connecting to the arbiter&hellip;")
        self.panel_box = widgets.Box(layout=widgets.Layout(display="flex", flex_flow="row wrap"))
        self.panels: dict[int, GpuPanel] = {}
        #: how many times the widgets were redrawn (each draw is one batch per widget)
        self.renders = 0
        super().__init__([self.header, self.panel_box])
        self.add_class("krex-dash")
        self._state = NodeState()
        self._lock = threading.Lock()
        self._draw_lock = threading.Lock()
        self._dirty = True
        self._last_render = 0.0
        #: set by the first snapshot or loss: what a cell shows (and a notebook saves) when it displays
        #: the dashboard is then the node, not "connecting"
        self._heard = threading.Event()
        self.feed: Feed | None = None
        if connect:
            self.feed = Feed(
                self.apply, self.tick, endpoint, tick=min(0.1, self.refresh), retry=retry, silence=silence
            ).start()
            if self._heard.wait(first_wait):
                self.render()

    # -- state ----------------------------------------------------------------------------
    @property
    def state(self) -> NodeState:
        with self._lock:
            return self._state

    def apply(self, event: Event) -> None:
        """Feed one event to the reducer (thread-safe); the next draw shows it."""
        with self._lock:
            self._state = reduce(self._state, event)
            self._dirty = True
        if event.topic in ("snapshot", "lost"):
            self._heard.set()

    def tick(self) -> None:
        """Draw if ``refresh`` seconds passed since the last draw and something changed (the feed calls this)."""
        if time.monotonic() - self._last_render < self.refresh:
            return
        state = self.state
        moving = (not state.connected) or any(g.holder or g.queue for g in state.gpus)
        if self._dirty or moving:
            self.render()

    # -- drawing --------------------------------------------------------------------------
    def render(self, now: float | None = None) -> None:
        """Redraw every widget now, in one batch per widget."""
        now = time.time() if now is None else now
        with self._draw_lock:
            with self._lock:
                state = self._state
                self._dirty = False
            self._last_render = time.monotonic()
            shown = [g for g in state.gpus if self.gpus is None or g.index in self.gpus]
            if [g.index for g in shown] != list(self.panels):
                self.panels = {g.index: self.panels.get(g.index) or GpuPanel(g.index) for g in shown}
                self.panel_box.children = tuple(self.panels.values())
            with contextlib.ExitStack() as batch:
                for w in [self.header, *(p for panel in self.panels.values() for p in panel.parts())]:
                    batch.enter_context(w.hold_sync())
                self.header.value = header_html(state, now)
                for g in shown:
                    self.panels[g.index].update(state, g, now)
            self.renders += 1

    def to_html(self, now: float | None = None) -> str:
        """The current state as one standalone HTML page (for a static export or a screenshot)."""
        return page_html(self.state, now, self.gpus)

    def summary(self, now: float | None = None) -> str:
        """A few lines of text: what the panels show."""
        now = time.time() if now is None else now
        state = self.state
        # Not connected yet is not lost: only a connection that was lost (or never made) says LOST.
        if state.connected:
            link = "live"
        elif state.lost_since is None:
            link = f"{state.message}..."
        else:
            link = f"LOST: {state.message}"
        lines = [link + f" - backend {state.backend}{' (simulated)' if state.simulated else ''}"]
        for g in state.gpus:
            if self.gpus is not None and g.index not in self.gpus:
                continue
            h = g.holder
            held = f"{h.region} held by {h.name} ({now - h.since:.1f} s)" if h else "free"
            lines.append(
                f"GPU {g.index}: {held}; waiting {[w.name for w in g.queue]}; "
                f"sessions {[s.name for s in g.sessions]}; {len(g.regions)} recent regions"
                f" ({sum(r.degraded for r in g.regions)} degraded)"
            )
        return "\n".join(lines)

    def close(self) -> None:
        """Stop the feed (its SUB socket closes) and close the widgets."""
        if self.feed is not None:
            self.feed.stop()
        _close_children(self)
        super().close()

    def __repr__(self) -> str:  # what text frontends show instead of the widget
        return "KREX dashboard: " + self.summary()


def _close_children(widget: widgets.Widget) -> None:
    for child in getattr(widget, "children", ()):
        _close_children(child)
        child.close()

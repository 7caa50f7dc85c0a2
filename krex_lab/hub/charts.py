"""Server-side SVG charts of the admin page (matplotlib, Agg; no JavaScript).

``utilisation_svg``: GPU utilisation (%) over time, one line per GPU, from the samples the
service keeps (:class:`krex_lab.hub.admin_page.Telemetry`). ``gantt_svg``: one strip per GPU, a bar per
region from its grant to its release, coloured and labelled by user.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

#: (wall time, gpu index, utilisation % or None, memory used bytes)
Sample = tuple[float, int, float | None, int]
#: (gpu, user, start, end, region id)
Bar = tuple[int, str, float, float, str]


def _figure(height: float) -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    return Figure(figsize=(9.0, height), dpi=96)


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg") :]  # inline: drop the XML prolog and doctype


def _times(values: Iterable[float]) -> list[datetime]:
    return [datetime.fromtimestamp(v) for v in values]


def utilisation_svg(samples: Sequence[Sample], gpus: Sequence[int]) -> str:
    fig = _figure(2.6)
    ax = fig.add_subplot()
    drawn = False
    for g in gpus:
        points = [(t, u) for t, gpu, u, _ in samples if gpu == g and u is not None]
        if points:
            ax.plot(_times(t for t, _ in points), [u for _, u in points], label=f"GPU {g}", linewidth=1.2)
            drawn = True
    ax.set_ylim(0, 100)
    ax.set_ylabel("utilisation %")
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(loc="upper left", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no utilisation samples yet", ha="center", va="center", transform=ax.transAxes)
    fig.autofmt_xdate()
    return _svg(fig)


def gantt_svg(bars: Sequence[Bar], gpus: Sequence[int], now: float | None = None, window: float = 3600.0) -> str:
    now = time.time() if now is None else now
    start = now - window
    fig = _figure(0.5 + 0.45 * max(1, len(gpus)))
    ax = fig.add_subplot()
    users = sorted({b[1] for b in bars})
    colours = {u: f"C{i % 10}" for i, u in enumerate(users)}
    import matplotlib.dates as mdates

    for g, user, t0, t1, _ in bars:
        t0, t1 = max(t0, start), min(max(t1, t0), now)
        if t1 <= start or t0 >= now or g not in gpus:
            continue
        left = mdates.date2num(datetime.fromtimestamp(t0))
        width = max(mdates.date2num(datetime.fromtimestamp(t1)) - left, 1.0 / 86400)
        row = list(gpus).index(g)
        ax.broken_barh([(left, width)], (row - 0.4, 0.8), facecolors=colours[user])
    ax.set_yticks(range(len(gpus)), [f"GPU {g}" for g in gpus])
    ax.set_ylim(-0.6, len(gpus) - 0.4)
    ax.set_xlim(datetime.fromtimestamp(start), datetime.fromtimestamp(now))
    ax.xaxis_date()
    ax.grid(axis="x", alpha=0.3)
    if users:
        from matplotlib.patches import Patch

        ax.legend(
            handles=[Patch(color=colours[u], label=u) for u in users],
            loc="upper left",
            bbox_to_anchor=(1.0, 1.0),
            fontsize="small",
        )
    fig.autofmt_xdate()
    return _svg(fig)

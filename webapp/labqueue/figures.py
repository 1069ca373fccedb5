"""The lab queue page's figure, a Plotly dict built by a pure function (see `webapp.dashboards.figures`)."""

from __future__ import annotations

from collections.abc import Sequence

from webapp.dashboards.figures import BASE_LAYOUT, Figure, colour, text
from webapp.labqueue.selectors import WINDOWS, TeamShare

WINDOW_NAMES = {"day": "last day", "week": "last week"}


def shares_figure(shares: Sequence[TeamShare]) -> Figure:
    """Grouped bars per team: its share of the host's device time over the last day and the last week, next
    to the share its fair-share weight entitles it to (in percent)."""
    names = [text(s.name) for s in shares]
    data = [
        {"type": "bar", "name": f"device time, {WINDOW_NAMES[window]}", "x": names,
         "y": [round(100 * s.share[window], 2) for s in shares], "marker": {"color": colour(i)},
         "customdata": [round(s.seconds[window] / 3600, 3) for s in shares],
         "hovertemplate": "%{x}: %{y:.1f}% (%{customdata:.2f} device hours)<extra></extra>",
         "meta": {"role": window}}
        for i, (window, _) in enumerate(WINDOWS)
    ]
    data.append({"type": "bar", "name": "weight's share", "x": names,
                 "y": [round(100 * s.weight_share, 2) for s in shares], "marker": {"color": "#7f7f7f"},
                 "customdata": [s.weight for s in shares],
                 "hovertemplate": "%{x}: weight %{customdata:g}, %{y:.1f}% of the teams' weights<extra></extra>",
                 "meta": {"role": "weight"}})
    layout = {**BASE_LAYOUT, "title": {"text": "Share of device time by team"}, "barmode": "group",
              "yaxis": {"title": {"text": "% of device time"}, "rangemode": "tozero"},
              "xaxis": {"title": {"text": "team"}}}
    return {"data": data, "layout": layout}

"""The lab queue page, for every signed-in user: what the host's devices run and why the other trials wait.

A user without a current team sees every trial as another team's. Redis down: the page says the scheduler
cannot be reached and still shows the shares of device time, which come from the database.
"""

from __future__ import annotations

import time

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from webapp import queue_client
from webapp.accounts.middleware import request_team
from webapp.labqueue import figures, selectors

SCHEDULER_DOWN = ("The scheduler cannot be reached (Redis is down): the devices and the waiting trials cannot be "
                  "shown until it is back.")


@login_required
def lab_queue(request: HttpRequest) -> HttpResponse:
    now = time.time()
    team = request_team(request)
    try:
        queue, down = selectors.lab_queue(team=team, now=now), ""
    except queue_client.SchedulerUnavailable:
        queue, down = None, SCHEDULER_DOWN
    shares = selectors.team_shares(now=now)
    return render(request, "labqueue/queue.html", {
        "queue": queue, "scheduler_down": down, "shares": shares, "team": team,
        "shares_figure": figures.shares_figure(shares) if shares else None,
    })

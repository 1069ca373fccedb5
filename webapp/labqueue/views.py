"""The lab queue page, for every signed-in user: what the host's devices run and why the other trials wait.

A lab of several hosts has one page per host (``?host=``, this web app's own by default), each with its own
devices, queue and shares. A user without a current team sees every trial as another team's. Redis down: the
page says the scheduler cannot be reached and still shows the shares of device time, which come from the
database.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
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
    host = settings.HYDRA.worker.host_id
    try:
        hosts = queue_client.hosts_known()
        host = request.GET.get("host") or host
        if host not in hosts:  # only a host of this lab: anything else is refused, not looked up
            raise Http404("No such host in this lab.")
        queue, down = selectors.lab_queue(team=team, host_id=host, now=now, page=request.GET.get("page")), ""
    except queue_client.SchedulerUnavailable:
        hosts, queue, down = [host], None, SCHEDULER_DOWN
    shares = selectors.team_shares(host=host, now=now)
    return render(request, "labqueue/queue.html", {
        "queue": queue, "scheduler_down": down, "shares": shares, "team": team, "host": host, "hosts": hosts,
        "shares_figure": figures.shares_figure(shares) if shares else None,
    })

"""What ``make run``'s supervisor did to the services it runs (exits, restarts), as the health pages show it.

``scripts/devstack.py`` appends one JSON object a line to ``service-events.jsonl`` in the data folder; the web
server reads the file's tail. A file rather than Redis or the database: the events that matter most are Redis's
own exits, which Redis cannot record, and the writer is a script that runs no Django; the data folder is the
one place both processes already share. The file stays small: past `MAX_LINES` the writer keeps the last
`KEEP_LINES`, written to a new file renamed over the old one, so a reader sees one or the other whole; each event
is one ``write`` in append mode, after a line cut short it starts a new line, and a reader skips a line it
cannot parse. Events since the last ``started`` (one `make run`) describe the services now running; older ones
are history.

This module imports only the standard library: the script imports it without Django.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from pathlib import Path

FILE_NAME = "service-events.jsonl"
MAX_LINES = 400
KEEP_LINES = 200
READ_BYTES = 256 * 1024  # more than MAX_LINES lines of these events


def events_path(data_dir: Path) -> Path:
    return data_dir / FILE_NAME


def event_append(data_dir: Path, event: dict[str, object], *, now: datetime | None = None) -> None:
    """Add `event` (``{"event": "exited", "service": ..., ...}``) with its time; keep the file bounded."""
    path = events_path(data_dir)
    line = json.dumps({"at": (now or datetime.now(UTC)).isoformat(), **event}, separators=(",", ":")) + "\n"
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        if end and os.pread(fd, 1, end - 1) != b"\n":  # a line cut short (a full disk): start a new one
            line = "\n" + line
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    lines = path.read_bytes().splitlines(keepends=True)
    if len(lines) > MAX_LINES:
        spare = path.with_name(FILE_NAME + ".new")
        spare.write_bytes(b"".join(lines[-KEEP_LINES:]))
        os.replace(spare, path)


@dataclass(frozen=True)
class ServiceEvent:
    at: datetime
    event: str  # started | stopped | exited | restarted
    service: str = ""
    code: int | None = None
    restart: int = 0
    delay_s: float = 0.0
    failures_in_row: int = 0
    failing: bool = False
    services: tuple[str, ...] = ()

    @classmethod
    def parse(cls, line: bytes) -> ServiceEvent | None:
        try:
            raw = json.loads(line)
            return cls(
                at=datetime.fromisoformat(raw["at"]), event=str(raw["event"]), service=str(raw.get("service", "")),
                code=None if raw.get("code") is None else int(raw["code"]), restart=int(raw.get("restart", 0)),
                delay_s=float(raw.get("delay_s", 0.0)), failures_in_row=int(raw.get("failures_in_row", 0)),
                failing=bool(raw.get("failing", False)), services=tuple(map(str, raw.get("services", ()))),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def describe(self, tz: tzinfo = UTC, *, restarted: bool = False) -> str:
        """One line for people, e.g. ``redis-server exited with -9 (SIGKILL) at 11:02:07, restarted (1st
        restart)``; `restarted` says that a later event started it again."""
        at = self.at.astimezone(tz).strftime("%H:%M:%S")
        if self.event == "started":
            return f"make run started at {at}: {', '.join(self.services)}"
        if self.event == "stopped":
            return f"make run stopped at {at}"
        if self.event == "restarted":
            return f"{self.service} started again at {at} ({ordinal(self.restart)} restart)"
        text = f"{self.service} exited with {exit_code(self.code)} at {at}"
        if restarted:
            return f"{text}, restarted ({ordinal(self.restart)} restart)"
        if self.failing:
            return (f"{text}: FAILING, {self.failures_in_row} exits in a row within a minute of starting; next try "
                    f"in {self.delay_s:.0f} s (see make run's output)")
        return f"{text}; restarting in {self.delay_s:.0f} s ({ordinal(self.restart)} restart)"


def exit_code(code: int | None) -> str:
    """``-9 (SIGKILL)`` for a signal (Popen's negative return code), else the number."""
    if code is not None and code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return str(code)


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def events_read(data_dir: Path, *, limit: int = 50) -> list[ServiceEvent]:
    """The last `limit` events, oldest first; none when make run never wrote any here."""
    try:
        with events_path(data_dir).open("rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(0, file.tell() - READ_BYTES))
            lines = file.read().splitlines()
    except OSError:
        return []
    events = [event for event in map(ServiceEvent.parse, lines) if event is not None]
    return events[-limit:]


def current_run(events: list[ServiceEvent]) -> list[ServiceEvent]:
    """The events since make run last started; none when it has stopped since."""
    starts = [i for i, event in enumerate(events) if event.event == "started"]
    if not starts:
        return []
    run = events[starts[-1]:]
    return [] if any(event.event == "stopped" for event in run) else run


def service_lines(events: list[ServiceEvent], tz: tzinfo = UTC) -> list[str]:
    """Each exit of the current run with what came of it, newest first."""
    run = current_run(events)
    lines = []
    for i, event in enumerate(run):
        if event.event == "exited":
            restarted = any(e.event == "restarted" and e.service == event.service for e in run[i + 1:])
            lines.append(event.describe(tz, restarted=restarted))
    return lines[::-1]


def waiting(events: list[ServiceEvent]) -> list[ServiceEvent]:
    """The exits of the current run not followed by a restart yet: services down now, failing ones first."""
    last: dict[str, ServiceEvent] = {}
    for event in current_run(events):
        if event.service:
            last[event.service] = event
    down = [event for event in last.values() if event.event == "exited"]
    return sorted(down, key=lambda event: not event.failing)


def summary(events: list[ServiceEvent], tz: tzinfo = UTC) -> str | None:
    """One line for anyone: a service down now, else the latest exit of this run and how many there were."""
    down = waiting(events)
    if down:
        return down[0].describe(tz)
    lines = service_lines(events, tz)
    if not lines:
        return None
    return lines[0] if len(lines) == 1 else f"{lines[0]}; {len(lines)} exits since make run started"

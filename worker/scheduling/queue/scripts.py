"""The queue's Lua scripts, read from the ``lua/`` files beside this module, and how they are run.

A script file starts with ``-- args: <names>``, its arguments in order, and may name fragments it needs
besides the prelude on a second line, ``-- include: <fragment> ...``. What Redis runs is the prelude
(``lua/prelude.lua``), those fragments, a line naming the arguments as locals (``local id, token = ARGV[3],
ARGV[4]``), then the file; ``${NAME}`` in any of them stands for one of `CONSTANTS`. ARGV[1] is the host's
key prefix and ARGV[2] the queue's clock in ms ('' for Redis's own), both read by the prelude. Callers pass the
arguments by name, so their order is written once, in the script's file.

Scripts run by EVALSHA through redis-py's `Script` (`Redis.register_script`), which loads a script the server
does not hold (after a restart or SCRIPT FLUSH) and runs it again. Several scripts, and the commands a caller
queues before them (telemetry), go in one pipeline: one round trip.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis

from worker.scheduling.fair_share import USAGE_HALF_LIFE_S
from worker.scheduling.keys import EVENTS_MAXLEN
from worker.scheduling.policy import TIE_TOLERANCE

DEFAULT_LEASE_MS = 10_000  # a host's lease length until `ShardQueue.configure(lease_s=)` sets one
PLANNING_SCAN = 256  # trials waiting to be planned that one claim considers for admission, oldest first

# What ${NAME} stands for in the Lua files.
CONSTANTS: Mapping[str, str] = {
    "DEFAULT_LEASE_MS": str(DEFAULT_LEASE_MS),
    "HALF_LIFE_MS": str(int(USAGE_HALF_LIFE_S * 1000)),
    "EVENTS_MAXLEN": str(EVENTS_MAXLEN),
    "PLANNING_SCAN": str(PLANNING_SCAN),
    "TIE_TOLERANCE": repr(TIE_TOLERANCE),
}

# Every script the queue runs, by the name of its file.
NAMES = ("submit", "control", "shares", "survey", "claim_plan", "plan_done", "claim", "unclaim", "renew",
         "complete", "replan", "fail")

# Where a script asks for a clock reading: the time the queue's clock gives, in seconds since the epoch.
Clock = Callable[[], float]
# Commands a caller queues on the pipeline that carries its scripts (telemetry).
Also = Callable[[redis.client.Pipeline], None]

_PLACEHOLDER = re.compile(r"\$\{([A-Z_]+)\}")
_ARGS = re.compile(r"-- args:(.*)")
_INCLUDE = re.compile(r"-- include:(.*)")


@dataclass(frozen=True)
class LuaScript:
    """A script as Redis runs it: `source`, taking the key prefix, the clock, then `args` by position."""

    args: tuple[str, ...]
    source: str


def lua_file(name: str) -> str:
    """The text of ``lua/<name>.lua``, its ${NAME} constants written in; ValueError naming an unknown one."""
    text = resources.files(__package__).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")

    def constant(match: re.Match[str]) -> str:
        if match[1] not in CONSTANTS:
            raise ValueError(f"lua/{name}.lua uses ${{{match[1]}}}; the constants are {', '.join(CONSTANTS)}.")
        return CONSTANTS[match[1]]

    return _PLACEHOLDER.sub(constant, text)


@functools.cache
def load(name: str) -> LuaScript:
    """Script `name` (one of `NAMES`) as Redis runs it; ValueError when its file lacks the ``-- args:`` line."""
    body = lua_file(name)
    lines = body.splitlines()
    header = _ARGS.fullmatch(lines[0]) if lines else None
    if header is None:
        raise ValueError(f"lua/{name}.lua must start with '-- args: <names>'; it starts {lines[:1]!r}.")
    args = tuple(header[1].split())
    included = _INCLUDE.fullmatch(lines[1]) if len(lines) > 1 else None
    fragments = "".join(lua_file(fragment) for fragment in (included[1].split() if included else ()))
    argv = ", ".join(f"ARGV[{index}]" for index in range(3, len(args) + 3))
    names = f"local {', '.join(args)} = {argv}\n" if args else ""
    return LuaScript(args, f"{lua_file('prelude')}{fragments}{names}{body}")


class Scripts:
    """The queue's scripts on `client`, for the host whose keys start with `prefix`.

    `clock` gives the time scripts take as now (seconds since the epoch); None: Redis's own clock, which every
    host sharing the Redis agrees on.
    """

    def __init__(self, client: redis.Redis, prefix: str, clock: Clock | None = None) -> None:
        self.client = client
        self.prefix = prefix
        self.clock = clock
        self._scripts = {name: client.register_script(load(name).source) for name in NAMES}

    def now_s(self) -> float:
        """The queue's time now, in seconds since the epoch: the clock's, else Redis's."""
        if self.clock is not None:
            return self.clock()
        seconds, micros = self.client.time()
        return seconds + micros / 1e6

    def run(self, name: str, **args: object) -> Any:
        """Run script `name` with `args` by name; its reply."""
        return self._scripts[name](args=self._argv(name, args))

    def run_all(self, calls: Sequence[tuple[str, Mapping[str, object]]], also: Also | None = None) -> list[Any]:
        """Run scripts (name, arguments by name) one after another, after the commands `also` queues, in one
        round trip; their replies. A script the server did not hold runs again, alone, once loaded; any other
        error reply is raised (the first of them) once the whole pipeline has run."""
        argvs = [(name, self._argv(name, args)) for name, args in calls]
        pipe = self.client.pipeline(transaction=False)
        if also is not None:
            also(pipe)
        for name, argv in argvs:
            # Not through the Script object: in a pipeline it asks the server first whether the script is
            # loaded, a second round trip. A script the server lacks is run again below, by its Script.
            pipe.evalsha(self._scripts[name].sha, 0, *argv)
        replies = pipe.execute(raise_on_error=False)
        queued = len(replies) - len(argvs)
        for reply in replies[:queued]:
            if isinstance(reply, Exception):
                raise reply
        results = []
        for (name, argv), reply in zip(argvs, replies[queued:], strict=True):
            if isinstance(reply, redis.exceptions.NoScriptError):
                reply = self._scripts[name](args=argv)
            elif isinstance(reply, Exception):
                raise reply
            results.append(reply)
        return results

    def _argv(self, name: str, args: Mapping[str, object]) -> list[object]:
        """The ARGV of script `name`: the key prefix, the clock, then `args` in the order the script names them."""
        names = load(name).args
        if args.keys() != set(names):
            raise TypeError(f"script {name!r} takes {', '.join(names)}; got {', '.join(args)}.")
        now = "" if self.clock is None else str(int(self.clock() * 1000))
        return [self.prefix, now, *(args[arg] for arg in names)]

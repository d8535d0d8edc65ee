"""Whether other processes leave this one a second core, for the prange splits (threads.par_threads,
core/ops/par_gate.py): their CPU time over the last interval, read from /proc/stat."""
from __future__ import annotations

import os
from time import perf_counter, process_time  # module names: tests replace them

# prange only while the other processes leave a core idle: their busy time over the last interval (at
# least LOAD_RECHECK_S; /proc/stat's busy ticks less this process's own CPU time) under
# cores - 2 + (1 - IDLE_MARGIN), so on 2 cores other processes may hold at most a quarter of a core.
# A region's worker that finds no core waits a scheduler slice (ms) against a saving of tens of
# microseconds, so even a small chance of that loses: at load 1.6-1.8 on the 2-core VM, splits forced on
# (hand-offs pinned at 4 us), MobileNetV2-96 at batch 1 took 22 ms against 1.46 serial, its three split
# depthwise layers 5-8 ms each against 41-62 us; at load 2.6, with the hand-off re-measured at 6 us,
# 1.74 ms against 1.43. The gate read the 1-minute load average before, which counts this process's own
# threads: a two-thread run that kept both cores busy (its spinning libgomp worker included) read load
# ~2 and shut its own splits off. Where /proc/stat is missing: the load average less one (the caller).
# Niced processes do not count while this one is not niced and the scheduler has no autogroups: it
# gives this process the core they hold. With autogroups (the 2-core VM), nice works only within a
# session: other sessions' niced processes took half the cores from un-niced benchmarks.
IDLE_MARGIN = 0.75
LOAD_RECHECK_S = 1.0
FIRST_WINDOW_S = 0.05
# [whether a core was idle at the last read, when (perf_counter; -1: never), the free cores then (absent
# or None: all)]
_load = [True, -1.0]
_stat = [None]  # (busy ticks of all cores, this process's CPU seconds, perf_counter) at the last read
_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def _busy_ticks():
    """The machine's busy time in clock ticks since boot (/proc/stat: all but idle and iowait, and but
    niced processes' user time while this process is not niced itself: they yield the core to it);
    None where there is no /proc/stat."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 5 or fields[0] != b"cpu":
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4] - (ticks[1] if _nice_yields() else 0)


def _nice_yields() -> bool:
    """Whether niced processes yield the core to this one: it is not niced itself and the scheduler
    weighs processes by their own nice (no autogroups: with them, as on the 2-core VM, a process's
    nice counts only within its session, and a niced process of another session competes fully)."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            return False
    except (AttributeError, OSError):
        return False
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled", "rb") as f:
            return f.read().strip() == b"0"
    except OSError:
        return True  # no autogroups on this system


def others_busy() -> float:
    """Cores' worth of CPU that other processes used since the last read (this process's threads
    excluded), or, at the first read, the 1-minute load average less the caller's own thread (read
    again FIRST_WINDOW_S later, over that interval)."""
    now, mine, busy = perf_counter(), process_time(), _busy_ticks()
    prev, _stat[0] = _stat[0], (busy, mine, now)
    if busy is None or prev is None or prev[0] is None or now - prev[2] <= 0:
        try:
            return max(0.0, os.getloadavg()[0] - 1.0)
        except OSError:  # no load average on this platform: assume idle cores (prange as measured)
            return 0.0
    return max(0.0, ((busy - prev[0]) * _TICK_S - (mine - prev[1])) / (now - prev[2]))


def free_cores(cores: int) -> int:
    """The cores other processes leave this one at the last read (cores_idle's; at least 1, `cores` when
    the gate is off or not yet read): a split across more threads than this waits for a core."""
    free = _load[2] if len(_load) > 2 else None
    return cores if free is None else max(1, min(cores, free))


def cores_idle(cores: int) -> bool:
    """Whether other processes leave this one, on `cores` cores, a second core (others_busy under
    cores - 2 + (1 - IDLE_MARGIN)), read at most every LOAD_RECHECK_S (a read costs about 10 us).
    ISTHMUS_IDLE_GATE=0 answers True always: for a process the scheduler favours over the others
    (a higher priority, or autogroup nice), whose splits their CPU time does not delay."""
    now = perf_counter()
    if now - _load[1] > LOAD_RECHECK_S:
        if os.environ.get("ISTHMUS_IDLE_GATE", "").strip() == "0":  # the gate off: as on an idle machine
            _load[:] = [True, now]
            return True
        first = _stat[0] is None
        others = others_busy()
        # a first interval soon; the free cores: cores - others, with a quarter core's slack
        _load[:] = [others < cores - 1 - IDLE_MARGIN, now - LOAD_RECHECK_S + FIRST_WINDOW_S if first else now,
                    int(cores + 1 - IDLE_MARGIN - others)]
    return _load[0]


__all__ = ["cores_idle", "free_cores", "others_busy", "IDLE_MARGIN", "LOAD_RECHECK_S", "FIRST_WINDOW_S"]

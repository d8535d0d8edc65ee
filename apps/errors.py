"""Commands fail like tools: bad input is one line on stderr naming the file, flag or field, exit 2."""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Callable, Optional, Sequence

from isthmus.wire.link import parse_bandwidth, parse_duration

EXIT_USAGE = 2


class UsageError(Exception):
    """Input a user can fix (a file, a flag, a field): reported as one line, exit code 2."""


def run_command(prog: str, fn: Callable[[], int], debug: bool = False) -> int:
    """Run a command's body; any exception becomes one line on stderr and exit 2 (1 for a failure
    that is not the input's fault), unless `debug` asks for the traceback."""
    try:
        return int(fn() or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`isthmus info m.onnx | head`): stop quietly, as tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except SystemExit as e:  # older commands stop with SystemExit("message")
        if e.code is None or isinstance(e.code, int):
            return int(e.code or 0)
        if debug:
            traceback.print_exc()
        print(_line(prog, str(e.code)), file=sys.stderr)
        return EXIT_USAGE
    except BaseException as e:  # noqa: BLE001  (a tool reports, it does not dump its stack)
        if debug:
            traceback.print_exc()
        bad_input = _is_input_error(e)
        hint = "" if debug or bad_input else " (--debug shows the traceback)"
        print(_line(prog, describe(e)) + hint, file=sys.stderr)
        return EXIT_USAGE if bad_input else 1


def describe(e: BaseException) -> str:
    """The exception as one line: its message, or its type where the message is empty or bare."""
    msg = " ".join(str(e).split())
    if isinstance(e, OSError) and getattr(e, "filename", None):
        msg = f"{e.filename}: {e.strerror or msg}"
    if isinstance(e, (UsageError, ValueError, OSError, KeyError, LookupError)) and msg:
        return msg.strip("'\"") if isinstance(e, KeyError) else msg
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _is_input_error(e: BaseException) -> bool:
    # deferred: the graph machinery (isthmus.core), loaded only by the commands that need it
    from isthmus.core.errors import IsthmusError
    return isinstance(e, (UsageError, ValueError, OSError, LookupError, IsthmusError, EOFError, UnicodeError))


def _line(prog: str, msg: str) -> str:
    msg = " ".join(msg.split())
    if msg.startswith(prog + ":"):
        return msg
    return f"{prog}: error: {msg}" if not msg.startswith("error:") else f"{prog}: {msg}"


# ---- checks shared by the commands --------------------------------------------------------------------
def input_file(path: str, flag: str = "MODEL") -> str:
    """`path` exists, is a file and is not empty; else a UsageError naming the flag and the file."""
    if not os.path.exists(path):
        raise UsageError(f"{flag} {path}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a directory, expected a file")
    if os.path.getsize(path) == 0:
        raise UsageError(f"{flag} {path}: the file is empty")
    return path


def output_path(path: str, force: bool, flag: str = "-o") -> str:
    """`path` may be written: it does not exist yet (or --force), and its folder exists."""
    if os.path.exists(path) and not force:
        raise UsageError(f"{flag} {path}: exists; pass --force to overwrite it")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {path}: folder {folder} does not exist")
    return path


def _parsed(text: str, cast: Callable, what: str):
    """cast(text), or argparse's error saying the text is not `what` (e.g. "an integer")."""
    try:
        return cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def _is_port(v) -> bool:
    """A TCP port number a server may bind: 0 (a free one) to 65535."""
    return isinstance(v, int) and 0 <= v <= 65535


def port(text: str) -> int:
    """argparse type: a TCP port, 0 (a free one) to 65535."""
    v = _parsed(text, int, "a port number")
    if not _is_port(v):
        raise argparse.ArgumentTypeError(f"{v} is not a port (0-65535; 0 picks a free one)")
    return v


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    v = _parsed(text, int, "an integer")
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    return v


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    v = _parsed(text, int, "an integer")
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} must be 0 or more")
    return v


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    v = _parsed(text, float, "a number")
    if not (v > 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number above 0")
    return v


def strip_debug(argv: Sequence[str]) -> tuple:
    """(argv without --debug, whether it was there); $ISTHMUS_DEBUG=1 also turns it on."""
    rest = [a for a in argv if a != "--debug"]
    return rest, len(rest) != len(argv) or os.environ.get("ISTHMUS_DEBUG", "") not in ("", "0")


__all__ = ["UsageError", "run_command", "describe", "input_file", "output_path", "port", "positive_int",
           "non_negative_int", "positive_float", "strip_debug", "EXIT_USAGE"]


# ---- checks every command gets from cli.py, after parsing -------------------------------------------------
FILE_ARGS = ("model", "graph", "file")   # positional arguments that name an input file
POSITIVE_ARGS = ("batch", "max_batch", "repeat", "runs", "blas_threads", "max_queue", "max_waiting_per_peer",
                 "client_requests")  # counts: 1 or more
NON_NEGATIVE_ARGS = ("task", "malloc_mmap_threshold_kb", "malloc_trim_threshold_kb", "max_delay_ms")
POSITIVE_FLOAT_ARGS = ("recv_timeout", "max_recv_wait", "max_message_mb", "max_request_mb", "deadline_ms",
                       "slowdown", "edge_slowdown", "memory_budget", "timeout")  # finite, above 0


def check_common(args) -> None:
    """Flags shared by many commands, checked once: input files exist and are not empty (a
    `file.py:function` spec is checked by its loader), ports are ports, sizes are positive."""
    for name in FILE_ARGS:
        v = getattr(args, name, None)
        if isinstance(v, str) and (os.path.splitext(v)[1] or os.sep in v) and ":" not in os.path.basename(v):
            input_file(v, name.upper())
    p = getattr(args, "port", None)
    if p is not None and not _is_port(p):
        raise UsageError(f"--port {p}: not a port (0-65535; 0 picks a free one)")
    for path, flag in _outputs(args):
        refuse_overwrite(path, args, flag)
    for names, bad, rule in ((POSITIVE_ARGS, lambda v: v < 1, "must be at least 1"),
                             (NON_NEGATIVE_ARGS, lambda v: not v >= 0, "must be 0 or more"),
                             (POSITIVE_FLOAT_ARGS, lambda v: not 0 < v < float("inf"), "must be a finite number above 0")):
        for name in names:
            v = getattr(args, name, None)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and bad(v):
                raise UsageError(f"--{name.replace('_', '-')} {v:g}: {rule}")
    _check_edge_run_link(args)


def _check_edge_run_link(args) -> None:
    """edge-run's emulated link applies only to the calls a split model makes to --cloud; its values parse."""
    if getattr(args, "command", None) != "edge-run" or not getattr(args, "emulate_link", None):
        return
    if not getattr(args, "cloud", None):
        raise UsageError(f"--emulate-link {args.emulate_link}: needs --cloud HOST:PORT (it slows the calls to the cloud)")
    for flag, text, parse in (("--emulate-link", args.emulate_link, parse_bandwidth), ("--rtt", args.rtt, parse_duration)):
        try:
            ok = parse(text) > 0 if flag == "--emulate-link" else parse(text) >= 0
        except ValueError as e:
            raise UsageError(f"{flag} {text}: {e}") from None
        if not ok:
            raise UsageError(f"{flag} {text}: must be above 0")


def _outputs(args):
    """The files a command given --force-less flags would replace (commands that check their own
    outputs, like quantize and split, are not listed)."""
    command = getattr(args, "command", None)
    if command == "edge-run" and getattr(args, "save", None):
        yield args.save, "--save"
    if command == "partition":
        yield from ((path, flag) for path, flag in ((args.svg, "--svg"), (args.latency_plot, "--latency-plot")) if path)
    if command == "profile" and not getattr(args, "from_trace", None) and getattr(args, "device", None):
        yield args.out or f"{args.device}.json", "--out"


def refuse_overwrite(path: str, args, flag: str = "-o") -> None:
    """An existing output is replaced only with --force."""
    if os.path.exists(path) and not getattr(args, "force", False):
        raise UsageError(f"{flag} {path}: exists; pass --force to overwrite it")

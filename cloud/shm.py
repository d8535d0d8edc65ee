"""Same-host tensor transfer through shared memory: the bytes go in a /dev/shm segment, the
RecvTensor answer carries only its name (proto/worker.proto, shm_name and shm_bytes).

Python's gRPC unary path costs one copy of the payload per side plus the loopback socket;
two tasks on one machine (a local cluster runs all its tasks on one) can skip the socket:
the sending task writes the tensor into a fresh segment when its Send runs, the receiving
task maps it read-only and unlinks its name at once, so the array it gets is a view of
the segment's pages, freed when the array is.

When it is used (and when not)
- The caller offers its host identity (`host_identity`: the kernel's boot id, the device
  number of the /dev/shm filesystem and the user id). Only a sender whose own identity is
  the same answers with a segment: same boot and same tmpfs instance mean the caller can
  open the sender's files there, whatever the addresses say. Anything else gets the bytes.
  The identity is a claim, not a secret: a caller elsewhere that sends a copied one gets a
  name it cannot open (the bytes stay in the sender's /dev/shm, mode 0600), reports it,
  and gets the bytes by gRPC. What proves the host is that the open of an unguessable
  name in that tmpfs succeeds.
- Tensors of at least `min_bytes` only; smaller ones stay inline (a segment costs a few
  system calls and fresh pages on each side: DEFAULT_MIN_BYTES, the measured crossover).
- `ISTHMUS_SHM=0` (or shm_enabled=False on the Worker, WorkerClient, Server or LocalCluster;
  `isthmus server --no-shm`) turns it off.
- Any failure falls back to gRPC with nothing lost: a segment that cannot be created
  (/dev/shm full, no /dev/shm) is not made; a segment the caller cannot open (missing,
  no permission) is reported back (shm_failed) and the sender answers with the bytes,
  which it still holds through its open descriptor.

Lifetime: a segment's name is unguessable (`isthmus-<pid namespace>-<pid>-<32 hex>`), the
file is 0600. The receiver unlinks it as soon as it is mapped, and marks it taken (its last
byte) so the sender closes its descriptor; a segment not taken within `lease_s` is unlinked
by the sender; an aborted step's segments are unlinked with its values; a task's segments
are unlinked when it stops. A task killed outright leaves its names behind: `sweep` unlinks
the segments of processes that no longer exist (a Server does it when it starts, a
LocalCluster when it kills, restarts or stops a task).

The receiver validates the descriptor before it maps anything: the name's pattern, the
declared size against dtype x shape and the byte limit, then the file itself (a regular
file of this user, exactly the declared size plus the mark byte); the Recv kernel then
checks dtype and shape against the ones it expects, as for bytes that came by gRPC. The
mapping stays valid while the array lives: after the unlink only the sender's descriptor
(closed once the segment is taken) could still change the file, and the sender is a task
of the same cluster, run by the same user.
"""
from __future__ import annotations

import atexit
import functools
import mmap
import os
import re
import secrets
import stat
import threading
import time
import weakref
from typing import Dict, Iterable, Mapping, Optional, Tuple

import numpy as np

from ..wire import tensor_codec
from ..wire.tensor_codec import TensorCodecError

ENV_VAR = "ISTHMUS_SHM"
SHM_DIR = "/dev/shm"
DEFAULT_MIN_BYTES = 512 << 10   # smaller tensors stay inline: below this gRPC was as fast (cloud_transfer.py --crossover)
DEFAULT_LEASE_S = 30.0          # a lent segment not taken in this time is unlinked by its sender
_POLL_S = 0.1                   # how often a sender's thread looks whether its lent segments were taken
_NAME = re.compile(r"^isthmus-([0-9]{1,20})-([0-9]{1,10})-([0-9a-f]{32})$")
_TAKEN = b"\x01"                # the mark byte after the payload, written by the receiver


class ShmDescriptorError(TensorCodecError):
    """A RecvTensor answer names a segment that does not match what it declares."""


class ShmUnavailable(OSError):
    """The named segment cannot be read here (missing, no permission): fall back to gRPC."""


def enabled_by_env(environ: Optional[Mapping[str, str]] = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


@functools.lru_cache(maxsize=None)
def host_identity() -> str:
    """'boot id/device of /dev/shm/uid', or '' where there is no /dev/shm to share."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        st = os.stat(SHM_DIR)
    except OSError:
        return ""
    ok = bool(boot) and stat.S_ISDIR(st.st_mode) and os.access(SHM_DIR, os.W_OK | os.X_OK)
    return f"{boot}/{st.st_dev}/{os.getuid()}" if ok else ""


@functools.lru_cache(maxsize=None)
def _pid_ns() -> int:
    """This process's pid namespace (a pid names a process only within its namespace)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def _unlink(name: str) -> None:
    try:
        os.unlink(_path(name))
    except FileNotFoundError:
        pass


class Segment:
    """A tensor written into a fresh /dev/shm file, as its sender holds it: the name and an
    open descriptor (through which the bytes stay readable after the name is gone)."""
    __slots__ = ("name", "fd", "dtype", "shape", "nbytes", "deadline", "__weakref__")

    def __init__(self, value, max_bytes: int = tensor_codec.DEFAULT_MAX_BYTES):
        self.fd = -1
        arr = tensor_codec.as_array(value)
        if arr.nbytes > max_bytes:
            raise TensorCodecError(f"tensor of {arr.nbytes} bytes ({arr.dtype}{list(arr.shape)}) is over "
                                   f"the limit of {max_bytes} bytes")
        if arr.nbytes == 0:
            raise ValueError("an empty tensor needs no segment")
        tensor_codec.dtype_to_enum(arr.dtype)
        self.dtype, self.shape, self.nbytes = arr.dtype, tuple(arr.shape), int(arr.nbytes)
        self.deadline = 0.0
        self.name = f"isthmus-{_pid_ns()}-{os.getpid()}-{secrets.token_hex(16)}"
        self.fd = os.open(_path(self.name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        _live.add(self)
        try:
            le = arr.dtype.newbyteorder("<") if arr.dtype.itemsize > 1 else arr.dtype
            if arr.flags.c_contiguous and arr.dtype == le:
                # written, not mapped: a full /dev/shm is an error here (ENOSPC), never a SIGBUS
                _write_all(self.fd, memoryview(arr).cast("B"))
                os.pwrite(self.fd, b"\0", self.nbytes)   # the mark byte, not taken yet
            else:  # strided or big-endian: one copy, straight into the mapped segment
                os.posix_fallocate(self.fd, 0, self.nbytes + 1)  # its pages exist before they are touched
                with mmap.mmap(self.fd, self.nbytes) as m:
                    np.copyto(np.frombuffer(m, le).reshape(arr.shape), arr, casting="equiv")
        except BaseException:
            self.release()
            raise

    def linked(self) -> bool:
        return self.fd >= 0 and os.fstat(self.fd).st_nlink > 0

    def taken(self) -> bool:
        """Whether a receiver mapped it (and marked it so)."""
        return self.fd >= 0 and os.pread(self.fd, 1, self.nbytes) == _TAKEN

    def to_array(self) -> np.ndarray:
        """The bytes back, read through the descriptor (a fallback: the caller could not map it)."""
        out = np.empty(self.shape, self.dtype.newbyteorder("<") if self.dtype.itemsize > 1 else self.dtype)
        buf, pos = memoryview(out.reshape(-1).view(np.uint8)), 0
        while pos < self.nbytes:
            n = os.preadv(self.fd, [buf[pos:]], pos)
            if n <= 0:
                raise ShmUnavailable(f"shared-memory segment {self.name} ended after {pos} of {self.nbytes} bytes")
            pos += n
        return out.astype(self.dtype, copy=False)

    def release(self) -> None:
        """Unlink the name (if still there) and close the descriptor; idempotent."""
        if self.fd >= 0:
            try:
                if os.fstat(self.fd).st_nlink > 0:
                    _unlink(self.name)
            finally:
                os.close(self.fd)
                self.fd = -1

    def __del__(self):  # a segment dropped without release(): its name and descriptor go with it
        try:
            self.release()
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass

    def __repr__(self) -> str:
        return f"Segment({self.name}, {self.dtype}{list(self.shape)})"


_live: "weakref.WeakSet[Segment]" = weakref.WeakSet()   # every segment this process holds


@atexit.register
def _release_all() -> None:
    """A process that exits normally leaves no segment behind, whoever forgot to release one."""
    for seg in list(_live):
        _quietly_release(seg)


def _write_all(fd: int, data: memoryview) -> None:
    pos = 0
    while pos < len(data):
        n = os.pwrite(fd, data[pos:], pos)
        if n <= 0:
            raise OSError(f"short write to a shared-memory segment ({pos} of {len(data)} bytes)")
        pos += n


def check_descriptor(name: str, shm_bytes: int, nbytes: int, what: str) -> None:
    """Refuse a descriptor whose name or size is not what the tensor it announces needs."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ShmDescriptorError(f"{what}: malformed shared-memory segment name {name!r} "
                                 "(expected isthmus-<pid namespace>-<pid>-<32 hex digits>)")
    if shm_bytes != nbytes:
        raise ShmDescriptorError(f"{what}: shared-memory segment {name} declares {shm_bytes} bytes; "
                                 f"the announced tensor needs {nbytes}")


def map_segment(name: str, nbytes: int, what: str) -> mmap.mmap:
    """Map a segment read-only (its pages populated), mark it taken and unlink its name.
    ShmUnavailable when it cannot be opened here; ShmDescriptorError when the file is not
    what the descriptor says. Call check_descriptor first."""
    try:
        fd = os.open(_path(name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ShmUnavailable(e.errno, f"{what}: cannot open shared-memory segment {name}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():   # not one we could have been sent
            raise ShmUnavailable(f"{what}: shared-memory segment {name} is not a regular file of this user "
                                 f"(uid {st.st_uid}); falling back to gRPC")
        if st.st_size != nbytes + 1:
            raise ShmDescriptorError(f"{what}: shared-memory segment {name} holds {st.st_size} bytes; "
                                     f"the descriptor needs {nbytes} and the mark byte")
        m = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ)
        os.pwrite(fd, _TAKEN, nbytes)
    finally:
        os.close(fd)
    _unlink(name)
    return m


def read_segment(name: str, shm_bytes: int, dtype_enum: int, shape, max_bytes: int, what: str) -> np.ndarray:
    """The array a descriptor announces, a read-only view of the segment's pages."""
    try:
        d, shp, nbytes = tensor_codec.check_header(dtype_enum, shape, max_bytes)
    except TensorCodecError as e:
        raise ShmDescriptorError(f"{what}: {e}") from None
    check_descriptor(name, shm_bytes, nbytes, what)
    if nbytes == 0:
        raise ShmDescriptorError(f"{what}: an empty tensor cannot come in a shared-memory segment")
    return tensor_codec.from_bytes(map_segment(name, nbytes, what), d, shp, nbytes)


class Lender:
    """A sending task's side: which receiving devices share its host, the segments it has
    answered with and not yet seen taken, and the thread that closes (or, past their lease,
    unlinks) them."""

    def __init__(self, min_bytes: int = DEFAULT_MIN_BYTES, lease_s: float = DEFAULT_LEASE_S):
        self.identity = host_identity()
        self.min_bytes = max(1, int(min_bytes))
        self.lease_s = float(lease_s)
        self.peers: set = set()   # destination devices whose task offered our identity
        self._lent: Dict[str, Tuple[Segment, tuple]] = {}
        self.lent_total = 0       # segments answered with, ever
        self._cond = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    def accepts(self, offered: str) -> bool:
        return bool(offered) and offered == self.identity

    def wants(self, dst_device: str, value) -> bool:
        """Whether a value for `dst_device` goes into a segment when its Send runs."""
        return dst_device in self.peers and getattr(value, "nbytes", 0) >= self.min_bytes

    def lend(self, seg: Segment, key: tuple) -> None:
        """Keep `seg` (answered with) until its receiver marks it taken or its lease ends. The
        reaper thread closes it then, off the serving thread: the close may be what frees the
        segment's pages (milliseconds for tens of MiB). It is woken only when it had nothing to
        watch; waking it on every answer costs each answer a thread switch."""
        with self._cond:
            if self._closed:
                raise ShmUnavailable(f"shared memory is closed on this task; {seg.name} not lent")
            seg.deadline = time.monotonic() + self.lease_s
            was_empty = not self._lent
            self._lent[seg.name] = (seg, key)
            self.lent_total += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._reap_loop, name="isthmus-shm-reaper", daemon=True)
                self._thread.start()
            if was_empty:
                self._cond.notify()

    def reclaim(self, name: str, key: tuple) -> Optional[Segment]:
        """The segment lent as `name` for `key` (its caller could not read it), or None."""
        with self._cond:
            got = self._lent.get(name)
            if got is None or tuple(got[1]) != tuple(key):
                return None
            del self._lent[name]
            return got[0]

    def abort_step(self, step_id: int) -> None:
        """Unlink the segments lent for a step that was aborted (a receiver that gave up on its
        answer will not read them; one still reading has its mapping already)."""
        with self._cond:
            names = [n for n, (_, key) in self._lent.items() if key[3] == step_id]
            segs = [self._lent.pop(n)[0] for n in names]
        for seg in segs:
            _quietly_release(seg)

    def outstanding(self) -> int:
        with self._cond:
            return len(self._lent)

    def reap(self) -> None:
        """Close the segments taken; unlink those past their lease. A segment unlinked but not
        marked taken (someone else removed it) is kept for its caller's fallback until its lease ends."""
        now = time.monotonic()
        with self._cond:
            items = list(self._lent.items())
        done = []
        for name, (seg, _key) in items:
            try:
                if seg.taken() or now > seg.deadline:
                    done.append(name)
            except OSError:
                done.append(name)
        if done:
            with self._cond:
                segs = [self._lent.pop(n)[0] for n in done if n in self._lent]
            for seg in segs:
                _quietly_release(seg)

    def _reap_loop(self) -> None:
        while True:
            with self._cond:
                while not self._lent and not self._closed:
                    self._cond.wait()
                if not self._closed:
                    self._cond.wait(_POLL_S)
                if self._closed:
                    return
            self.reap()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            segs = [s for s, _ in self._lent.values()]
            self._lent.clear()
            self._cond.notify_all()
        for s in segs:
            _quietly_release(s)


def _quietly_release(seg: Segment) -> None:
    try:
        seg.release()
    except OSError:
        pass


def release_value(value) -> None:
    """Free what a discarded rendezvous value holds (a Segment's name and descriptor)."""
    if isinstance(value, Segment):
        _quietly_release(value)


def segments(pids: Optional[Iterable[int]] = None) -> list:
    """The isthmus segment names in /dev/shm (of these pids in this pid namespace, if given)."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    want = None if pids is None else {int(p) for p in pids}
    ns = str(_pid_ns())
    out = []
    for n in names:
        m = _NAME.match(n)
        if m and (want is None or (m.group(1) == ns and int(m.group(2)) in want)):
            out.append(n)
    return sorted(out)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(pids: Optional[Iterable[int]] = None) -> int:
    """Unlink the segments left by dead processes of this pid namespace (only those of
    `pids` when given, alive or not: a caller that killed them knows). Returns how many.
    A segment removed under a live transfer costs that transfer its gRPC fallback, no data."""
    ns = str(_pid_ns())
    uid = os.getuid()
    gone = 0
    for n in segments(pids):
        m = _NAME.match(n)
        if m.group(1) != ns or (pids is None and _alive(int(m.group(2)))):
            continue
        try:
            if os.stat(_path(n), follow_symlinks=False).st_uid != uid:
                continue
            os.unlink(_path(n))
            gone += 1
        except OSError:
            pass
    return gone

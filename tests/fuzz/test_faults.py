"""The fault-injection scenarios of benchmarks/faults.py, each checking its own claim."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
try:
    import faults  # noqa: E402
finally:
    sys.path.pop(0)


@pytest.mark.parametrize("name", ["stalled_link", "dropped_link", "corrupt_checkpoint", "disk_full_checkpoint"])
def test_scenario_holds(name):
    r = faults.SCENARIOS[name]()
    assert r["holds"], r


def test_worker_load_short():
    r = faults.worker_load(seconds=2.0, clients=4)
    assert r["errors"] == 0 and r["requests"] > 20, r
    assert r["holds"], r


def test_stall_proxy_really_stalls():
    """The proxy itself: bytes pass, then stop passing, then pass again."""
    import socket
    import threading
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def echo():
        c, _ = srv.accept()
        with c:
            while True:
                d = c.recv(100)
                if not d:
                    return
                c.sendall(d)
    threading.Thread(target=echo, daemon=True).start()
    proxy = faults.StallProxy(f"127.0.0.1:{srv.getsockname()[1]}")
    try:
        s = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        s.sendall(b"ping")
        assert s.recv(10) == b"ping"
        proxy.set_mode("stall")
        s.sendall(b"held")
        s.settimeout(0.3)
        with pytest.raises(socket.timeout):
            s.recv(10)
        proxy.set_mode("pass")
        s.settimeout(2)
        assert s.recv(10) == b"held"
        s.close()
    finally:
        proxy.close()
        srv.close()

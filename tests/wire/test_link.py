"""wire/: one link formula for the partitioner and the edge's emulated link; the package stays a leaf."""
import subprocess
import sys

import pytest

from isthmus.edge.link_emulation import EmulatedLink
from isthmus.wire.link import LinkModel, parse_bandwidth, parse_duration, transfer_seconds


def test_one_formula_prices_the_partitioner_and_the_emulated_link():
    link = LinkModel(up_bandwidth_bps=5e6, down_bandwidth_bps=20e6, rtt_s=0.040, call_s=0.002)
    # bits / bandwidth + half of (rtt + call cost), by hand
    assert link.upload_time(10_000) == pytest.approx(80_000 / 5e6 + 0.021)
    assert link.download_time(10_000) == pytest.approx(80_000 / 20e6 + 0.021)
    emu = EmulatedLink(5e6, 0.040)
    assert emu.transfer_time(10_000) == pytest.approx(80_000 / 5e6 + 0.020)
    assert emu.transfer_time(10_000) == transfer_seconds(10_000, 5e6, 0.040)
    assert LinkModel(5e6, 5e6, 0.040).upload_time(10_000) == emu.transfer_time(10_000)


def test_units_parse_to_bits_per_second_and_seconds():
    assert parse_bandwidth("5mbps") == 5e6 and parse_bandwidth("0.5 Gbit/s") == 5e8
    assert parse_duration("40ms") == pytest.approx(0.040) and parse_duration("200us") == pytest.approx(2e-4)
    with pytest.raises(ValueError, match="bandwidth 'fast'"):
        parse_bandwidth("fast")
    link = LinkModel.parse("5mbps", "40ms").with_uplink(10e6)
    assert (link.up_bandwidth_bps, link.down_bandwidth_bps) == (10e6, 10e6)


def test_importing_wire_loads_neither_grpc_nor_core():
    code = ("import sys, isthmus.wire.link, isthmus.wire.tensor_codec, isthmus.wire.security, "
            "isthmus.wire.trace_events, isthmus.wire.split_format; "
            "print([m for m in ('grpc', 'isthmus.core', 'isthmus.edge', 'isthmus.cloud', 'onnx') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

"""Device profiles and the link between the edge and the cloud.

A DeviceProfile says how fast a device runs each op type: per-op-type regression
coefficients fitted on measurements (see calibrate.py), falling back to a roofline of
peak FLOP/s, memory bandwidth and per-op overhead. The link (LinkModel, the transfer formula and
the units' parsers) is wire/link.py's, shared with the edge's emulated link.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, FrozenSet, Optional, Sequence, Tuple

from isthmus.edge.capabilities import FP32, NOT_KERNELS, refusal

from .client_cost import ClientCost
from .part_cost import PartCost

EDGE_DEVICE = "/job:edge/task:0/device:CPU:0"
CLOUD_DEVICE = "/job:cloud/task:0/device:CPU:0"

Coeffs = Tuple[float, float, float]  # seconds = c0 + c_flops * flops + c_bytes * bytes
MEMORY = "@memory"  # op_coeffs' suffix of a kernel's regression timed with its weights from memory


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    kind: str = "CPU"                     # CPU or GPU
    peak_flops: float = 50e9              # FLOP/s, for ops without fitted coefficients
    mem_bandwidth: float = 10e9           # bytes/s
    op_overhead: float = 2e-6             # seconds per op (dispatch)
    memory_budget: Optional[float] = None  # bytes; None: unlimited
    supported_ops: Optional[FrozenSet[str]] = None  # None: every registered op
    kernel_table: Optional[str] = None  # "edge": also ask the edge's own table (edge/capabilities.py) per node
    op_coeffs: Dict[str, Coeffs] = field(default_factory=dict)
    default_coeffs: Optional[Coeffs] = None  # fitted over all measured ops, for the others
    blas_threads: Optional[int] = None      # the BLAS thread count calibration ran with (threads.py); None: unknown
    client: Optional[ClientCost] = None  # an edge's offload client's own cost per request (client_cost.py); None: unmeasured
    part: Optional[PartCost] = None  # an edge part's cost beyond its kernels (part_cost.py); None: unmeasured
    # what a step fused into a product (a bias, an activation, a folded batch norm) costs there, as a share
    # of its own price: the core Session runs it as one numpy call in place (1); the int8 interpreter folds
    # it into the product's requantization (measured by converters/edge_profile: about 0)
    fused_steps: float = 1.0
    # weights streamed from memory (converters/edge_profile.measure_weight_streaming): the calibration
    # times a product with its weights in the shared cache; a part whose products' weights exceed
    # `weight_cache` elements reads the excess from memory every request, `weight_stream_s` seconds each
    # (ResNet-shaped's few-pixel 1x1 convolutions ran 1.7x their one-node time in its 6M weights)
    # (an older profile's measure; calibrate_edge now writes the one below and leaves this at 0)
    weight_stream_s: float = 0.0
    weight_cache: float = 0.0
    # the same effect measured per kernel: a weight-bound kernel (few output pixels: STREAMED_KEYS) has
    # a second regression "<key>@memory", timed with its weights coming from memory, not the shared
    # cache; a part whose products read W weight elements pays weight_fraction(W) of the difference
    # for each of its such kernels, the fraction rising from 0 at `weight_cache` to 1 at
    # `weight_cache_hi` (a cycle of such convolutions here: 45 us each up to 3M weights, 100 from 6.3M)
    weight_cache_hi: float = 0.0

    def weight_streaming(self, weights: float) -> float:
        """Seconds a part whose products read `weights` elements loses to those beyond the cache
        (the older, whole-part measure: weight_stream_s)."""
        return self.weight_stream_s * max(float(weights) - self.weight_cache, 0.0)

    def weight_fraction(self, weights: float) -> float:
        """How far a part reading `weights` elements has its kernels' weights come from memory (0-1)."""
        lo, hi = self.weight_cache, self.weight_cache_hi
        if hi <= lo:
            return 0.0
        return min(max((float(weights) - lo) / (hi - lo), 0.0), 1.0)

    def streamed_extra(self, op: str, flops: float, nbytes: float) -> float:
        """What a kernel of cost key `op` takes beyond its calibration when its weights come from
        memory ("<op>@memory" less the regression op_time uses; 0 without that regression). Priced
        beside the part, as weight_streaming is: not scaled by its kernel_scale."""
        c = self.op_coeffs.get(op + MEMORY)
        if c is None:
            return 0.0
        t = c[0] + c[1] * flops + c[2] * nbytes
        hot = self.op_time(op, flops, nbytes) / (1.0 if self.part is None else self.part.kernel_scale)
        return max(t - hot, 0.0)

    def supports(self, op: str, node=None) -> bool:
        """Whether this device runs `op`; given the graph node, its attributes and dtypes count too."""
        if self.supported_ops is not None and op not in self.supported_ops:
            return False
        if self.kernel_table == "edge" and node is not None:
            return refusal(op, node.attrs, [(t.dtype, t.shape) for t in node.inputs],
                           [(t.dtype, t.shape) for t in node.outputs]) is None
        if self.kernel_table == "edge":
            return op in FP32 or op in NOT_KERNELS
        return True

    def op_time(self, op: str, flops: float, nbytes: float) -> float:
        """Seconds for an op (a cost key: "Conv2D:grouped" falls back to "Conv2D", then to the default)."""
        c = self.op_coeffs.get(op) or self.op_coeffs.get(op.split(":")[0]) or self.default_coeffs
        if c is not None:
            t = c[0] + c[1] * flops + c[2] * nbytes
        else:
            t = self.op_overhead + flops / self.peak_flops + nbytes / self.mem_bandwidth
        # inside a real part, per request, kernels take kernel_scale x their calibration (part_cost.py)
        return t if self.part is None else t * self.part.kernel_scale

    def scaled(self, slowdown: float, name: Optional[str] = None) -> "DeviceProfile":
        """The same device `slowdown` times slower (an edge emulated from this machine)."""
        if not slowdown > 0:
            raise ValueError(f"slowdown must be positive, got {slowdown!r}")
        s = float(slowdown)
        return replace(self, name=name or f"{self.name}/{s:g}x",
                       peak_flops=self.peak_flops / s, mem_bandwidth=self.mem_bandwidth / s,
                       op_overhead=self.op_overhead * s,
                       op_coeffs={k: _mul(c, s) for k, c in self.op_coeffs.items()},
                       default_coeffs=None if self.default_coeffs is None else _mul(self.default_coeffs, s),
                       client=None if self.client is None else self.client.scaled(s),
                       part=None if self.part is None else self.part.scaled(s),
                       weight_stream_s=self.weight_stream_s * s)

    # ---- JSON ---------------------------------------------------------------------------------
    def to_json(self) -> str:
        d = asdict(self)
        d["supported_ops"] = None if self.supported_ops is None else sorted(self.supported_ops)
        d["op_coeffs"] = {k: list(v) for k, v in sorted(self.op_coeffs.items())}
        d["client"] = None if self.client is None else self.client.to_dict()
        d["part"] = None if self.part is None else self.part.to_dict()
        return json.dumps(d, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "DeviceProfile":
        d = json.loads(text)
        known = set(cls.__dataclass_fields__)
        extra = set(d) - known
        if extra:
            raise ValueError(f"device profile has unknown fields {sorted(extra)}; known: {sorted(known)}")
        if d.get("supported_ops") is not None:
            d["supported_ops"] = frozenset(d["supported_ops"])
        if d.get("kernel_table") not in (None, "edge"):
            raise ValueError(f"device profile field kernel_table must be \"edge\" or null, got {d['kernel_table']!r}")
        d["op_coeffs"] = {k: _coeffs(v, k) for k, v in d.get("op_coeffs", {}).items()}
        if d.get("default_coeffs") is not None:
            d["default_coeffs"] = _coeffs(d["default_coeffs"], "default_coeffs")
        bt = d.get("blas_threads")
        if bt is not None and (isinstance(bt, bool) or not isinstance(bt, int) or bt < 1):
            raise ValueError(f"device profile field blas_threads must be an integer >= 1 or null, got {bt!r}")
        fs = d.get("fused_steps", 1.0)
        if isinstance(fs, bool) or not isinstance(fs, (int, float)) or not 0.0 <= fs < float("inf"):
            raise ValueError(f"device profile field fused_steps must be a finite number >= 0, got {fs!r}")
        for k in ("weight_stream_s", "weight_cache", "weight_cache_hi"):
            v = d.get(k, 0.0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < float("inf"):
                raise ValueError(f"device profile field {k} must be a finite number >= 0, got {v!r}")
        if d.get("client") is not None:
            d["client"] = ClientCost.from_dict(d["client"], "device profile field client")
        if d.get("part") is not None:
            d["part"] = PartCost.from_dict(d["part"], "device profile field part")
        return cls(**d)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str) -> "DeviceProfile":
        with open(path) as f:
            return cls.from_json(f.read())


def _mul(c: Sequence[float], s: float) -> Coeffs:
    return (c[0] * s, c[1] * s, c[2] * s)


def _coeffs(v, what: str) -> Coeffs:
    if not isinstance(v, (list, tuple)) or len(v) != 3 or not all(isinstance(x, (int, float)) for x in v):
        raise ValueError(f"coefficients for {what} must be 3 numbers [c0, c_flops, c_bytes], got {v!r}")
    return (float(v[0]), float(v[1]), float(v[2]))


# Defaults: the cloud about this machine kind (one core of numpy), the edge 8x slower.
CLOUD = DeviceProfile("cloud", peak_flops=50e9, mem_bandwidth=10e9, op_overhead=1.5e-6)
EDGE = CLOUD.scaled(8.0, name="edge")
EDGE = replace(EDGE, memory_budget=512e6, kernel_table="edge")  # runs what the edge's table says, no more

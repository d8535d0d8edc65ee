"""Writes the torch.onnx-exported fixture models (run by hand; torch is a benchmark-only peer).

    pip install torch==2.13.0 transformers onnxscript
    python tests/converters/torch_models/make.py [--only NAME] [--exporter torchscript|dynamo]

Six tiny random-weight models of public architectures (a BERT-style encoder and a ViT from
transformers' config classes, an LSTM/GRU audio model with an STFT as a 1-D conv and an If, a
MobileNetV3-style CNN with HardSwish, a segmentation head with ConvTranspose and Resize, an
opset-9 Inception-style net with LRN), each exported by torch.onnx's TorchScript exporter and by
its dynamo exporter with a dynamic batch axis (and dynamic sequence length, audio length, image
height and width where the architecture allows), into this folder as NAME.EXPORTER.onnx (TorchScript at
opset 17, Inception at 9; dynamo at 18, the lowest it implements: in torch 2.13 its conversion down to
17 or 9 fails or writes an invalid model). Each file's metadata_props records the exporter, the
opset asked for and the torch/transformers versions. An export that fails is recorded in
failures.json (name, exporter, error) instead of a file.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import traceback
import warnings

import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def _axes(per_name):
    """{input or output name: {axis: dim name}} with the batch axis 0 added to each."""
    return {k: {0: "batch", **v} for k, v in per_name.items()}


# how the dynamo exporter must see a dim besides the batch: (multiple of, min, max)
DIMS = {"seq": (1, 2, 64), "samples": (8, 64, 4096), "height": (4, 8, 512), "width": (4, 8, 512)}


# ---- the models -----------------------------------------------------------------------------------------
def bert():
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, type_vocab_size=2)

    class Enc(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = BertModel(cfg, add_pooling_layer=True)

        def forward(self, input_ids, attention_mask):
            out = self.m(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state, out.pooler_output

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 120, (2, 16), generator=g)
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 12:] = 0
    return Enc(), (ids, mask), ["input_ids", "attention_mask"], ["hidden", "pooled"], _axes({"input_ids": {1: "seq"}, "attention_mask": {1: "seq"}, "hidden": {1: "seq"}, "pooled": {}})


def vit():
    from transformers import ViTConfig, ViTModel
    cfg = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=64)

    class V(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = ViTModel(cfg, add_pooling_layer=False)

        def forward(self, pixel_values):
            return self.m(pixel_values=pixel_values).last_hidden_state
    return V(), (torch.randn(2, 3, 32, 32),), ["pixel_values"], ["hidden"], _axes({"pixel_values": {}, "hidden": {}})


def _gate(x: torch.Tensor) -> torch.Tensor:
    """An If on the data: loud clips (mean log power above 0) are scaled down (scripted for the TorchScript exporter)."""
    if bool(x.mean() > 0.0):
        return x * 0.5
    return x + 0.0


class Audio(nn.Module):
    """STFT as a strided 1-D conv with a cos/sin kernel, log magnitude, LSTM then GRU, an If."""

    def __init__(self, dynamo: bool, n_fft: int = 32, hop: int = 8):
        super().__init__()
        import math
        k = torch.arange(n_fft // 2 + 1, dtype=torch.float32)[:, None]
        t = torch.arange(n_fft, dtype=torch.float32)[None, :]
        win = 0.5 - 0.5 * torch.cos(2 * math.pi * t / n_fft)
        ker = torch.cat([torch.cos(2 * math.pi * k * t / n_fft) * win, -torch.sin(2 * math.pi * k * t / n_fft) * win])
        self.register_buffer("kernel", ker[:, None, :])
        self.hop, self.bins, self.dynamo = hop, n_fft // 2 + 1, dynamo
        self.lstm = nn.LSTM(self.bins, 24, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(48, 16, batch_first=True)
        self.head = nn.Linear(16, 5)
        self.gate = _gate if dynamo else torch.jit.script(_gate)

    def forward(self, wave):
        spec = F.conv1d(wave[:, None, :], self.kernel, stride=self.hop)
        re, im = spec[:, :self.bins], spec[:, self.bins:]
        feat = torch.log(re * re + im * im + 1e-6).transpose(1, 2)
        if self.dynamo:
            feat = feat.contiguous()  # torch.cond refuses a strided view as a branch output at dynamic length
            feat = torch.cond(feat.mean() > 0.0, lambda v: v * 0.5, lambda v: v + 0.0, (feat,))
        else:
            feat = self.gate(feat)
        h, _ = self.lstm(feat)
        h, _ = self.gru(h)
        return self.head(h)


def audio(dynamo: bool):
    return Audio(dynamo), (torch.randn(2, 256),), ["wave"], ["logits"], _axes({"wave": {1: "samples"}, "logits": {1: "frames"}})


def _conv_bn(cin, cout, k, s=1, groups=1, act=None):
    layers = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act] if act is not None else []))


class _SE(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))


class _IR(nn.Module):
    def __init__(self, cin, exp, cout, k, s, se, act):
        super().__init__()
        self.body = nn.Sequential(_conv_bn(cin, exp, 1, act=act), _conv_bn(exp, exp, k, s, groups=exp, act=act),
                                  _SE(exp) if se else nn.Identity(), _conv_bn(exp, cout, 1))
        self.res = s == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.res else y


def mobilenet():
    hs, re = nn.Hardswish(), nn.ReLU()
    m = nn.Sequential(_conv_bn(3, 16, 3, 2, act=hs), _IR(16, 16, 16, 3, 2, True, re), _IR(16, 64, 24, 3, 2, False, re),
                      _IR(24, 72, 24, 3, 1, False, re), _IR(24, 96, 40, 5, 2, True, hs), _IR(40, 120, 40, 5, 1, True, hs),
                      _conv_bn(40, 96, 1, act=hs), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(96, 64), nn.Hardswish(),
                      nn.Dropout(0.2), nn.Linear(64, 10))
    return m, (torch.randn(2, 3, 64, 64),), ["image"], ["logits"], _axes({"image": {}, "logits": {}})


class Seg(nn.Module):
    """Encoder, ConvTranspose decoder with a skip, bilinear and nearest Resize, a box-regression head."""

    def __init__(self):
        super().__init__()
        self.e1, self.e2 = _conv_bn(3, 16, 3, 2, act=nn.ReLU()), _conv_bn(16, 32, 3, 2, act=nn.ReLU())
        self.up = nn.ConvTranspose2d(32, 16, 4, stride=2, padding=1)
        self.up2 = nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1)
        self.cls = nn.Conv2d(8, 4, 1)
        self.box = nn.Conv2d(32, 4, 1)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(a)
        u = F.relu(self.up(b)) + a
        seg = self.cls(F.relu(self.up2(u)))
        seg = F.interpolate(seg, scale_factor=2.0, mode="bilinear", align_corners=False)
        boxes = F.interpolate(self.box(b), size=(16, 16), mode="nearest")
        return seg, boxes


def seg():
    return Seg(), (torch.randn(2, 3, 32, 32),), ["image"], ["seg", "boxes"], _axes({"image": {2: "height", 3: "width"}, "seg": {2: "h2", 3: "w2"}, "boxes": {}})


class _Inception(nn.Module):
    def __init__(self, cin):
        super().__init__()
        self.b1 = nn.Conv2d(cin, 8, 1)
        self.b3 = nn.Sequential(nn.Conv2d(cin, 8, 1), nn.ReLU(), nn.Conv2d(8, 12, 3, padding=1))
        self.b5 = nn.Sequential(nn.Conv2d(cin, 4, 1), nn.ReLU(), nn.Conv2d(4, 6, 5, padding=2))
        self.bp = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(cin, 6, 1))

    def forward(self, x):
        return F.relu(torch.cat([self.b1(x), self.b3(x), self.b5(x), self.bp(x)], 1))


def inception():
    m = nn.Sequential(nn.Conv2d(3, 16, 5, 2, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1), nn.LocalResponseNorm(5, 1e-4, 0.75, 2.0),
                      _Inception(16), _Inception(32), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(32 * 4 * 4, 10))
    return m, (torch.randn(2, 3, 32, 32),), ["image"], ["logits"], _axes({"image": {}, "logits": {}})


MODELS = {"bert": (bert, 17), "vit": (vit, 17), "audio": (audio, 17), "mobilenet": (mobilenet, 17),
          "seg": (seg, 17), "inception": (inception, 9)}


# ---- export ---------------------------------------------------------------------------------------------
def _build(name, dynamo):
    make, opset = MODELS[name]
    torch.manual_seed(0)
    m, args, ins, outs, axes = make(dynamo) if name == "audio" else make()
    m.eval()
    _calibrate_norms(m, args)
    return m, args, ins, outs, axes, opset


def _calibrate_norms(m, args):
    """BatchNorm running statistics set from one training-mode pass over random inputs (then random
    scales and shifts), as a trained network has: with the default 0/1 statistics the tiny networks'
    activations shrink ~10x per block and the outputs hardly depend on the input."""
    norms = [mod for mod in m.modules() if isinstance(mod, nn.BatchNorm2d)]
    if not norms:
        return
    g = torch.Generator().manual_seed(3)
    for mod in norms:
        mod.momentum = 1.0
    m.train()
    with torch.no_grad():
        m(*[torch.randn((16,) + tuple(a.shape[1:]), generator=g) if a.is_floating_point() else a for a in args])
        for mod in norms:
            mod.weight.copy_(1.0 + 0.2 * torch.randn(mod.num_features, generator=g))
            mod.bias.copy_(0.2 * torch.randn(mod.num_features, generator=g))
    m.eval()


def export(name: str, exporter: str) -> onnx.ModelProto:
    dynamo = exporter == "dynamo"
    m, args, ins, outs, axes, opset = _build(name, dynamo)
    if dynamo:  # the dynamo exporter implements opset 18 up; asked for less it converts down, which fails
        opset = max(opset, 18)  # for Pad (to 9), ReduceMean axes (to 17), or writes an invalid ReduceMean-13
    with torch.no_grad():
        if dynamo:
            dims = {"batch": torch.export.Dim("batch", min=1, max=1024)}
            for k, (mult, lo, hi) in DIMS.items():
                dims[k] = mult * torch.export.Dim(k, min=lo // mult, max=hi // mult) if mult > 1 else \
                    torch.export.Dim(k, min=lo, max=hi)
            if name == "audio":  # torch 2.13's cond rejects its branches' symbolic strides at a dynamic
                axes = _axes({k: {} for k in axes})  # length ("not a simple accumulative multiplication")
            shapes = tuple({a: dims[d] for a, d in axes[k].items()} for k in ins)
            prog = torch.onnx.export(m, args, input_names=ins, output_names=outs, opset_version=opset,
                                     dynamo=True, dynamic_shapes=shapes, external_data=False)
            model = prog.model_proto
        else:
            import io
            buf = io.BytesIO()
            torch.onnx.export(m, args, buf, input_names=ins, output_names=outs, opset_version=opset,
                              dynamo=False, dynamic_axes=axes)
            model = onnx.load_from_string(buf.getvalue())
    import transformers
    meta = {"exporter": f"torch.onnx {exporter}", "opset_requested": str(opset), "torch": torch.__version__,
            "transformers": transformers.__version__, "onnx": onnx.__version__}
    del model.metadata_props[:]
    for k, v in meta.items():
        model.metadata_props.add(key=k, value=v)
    return model


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", action="append")
    p.add_argument("--exporter", action="append", choices=["torchscript", "dynamo"])
    a = p.parse_args(argv)
    path_fail = os.path.join(HERE, "failures.json")
    failures = {}
    if os.path.exists(path_fail):
        with open(path_fail) as f:
            failures = json.load(f)
    for name in a.only or list(MODELS):
        for exp in a.exporter or ["torchscript", "dynamo"]:
            key = f"{name}.{exp}"
            out = os.path.join(HERE, f"{key}.onnx")
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    model = export(name, exp)
                onnx.checker.check_model(model)
                onnx.save(model, out)
                failures.pop(key, None)
                print(f"{key}: opset {model.opset_import[0].version}, {os.path.getsize(out)} bytes")
            except Exception as e:  # noqa: BLE001  (record why this exporter cannot export it)
                traceback.print_exc()
                text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
                failures[key] = f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:400]
                if os.path.exists(out):
                    os.remove(out)
                print(f"{key}: FAILED {failures[key]}", file=sys.stderr)
    with open(path_fail, "w") as f:
        json.dump(failures, f, indent=1, sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

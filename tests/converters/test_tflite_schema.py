"""converters/tflite_schema.py exposes, from the PyPI `tflite` package, every schema name the TFLite writer
uses (builder functions, builtin operators, options tables and their fields, tensor types), and a file
written through it reads back with the `tflite` package's own reader."""
import ast
import glob
import os
import re

import numpy as np
import pytest

tflite = pytest.importorskip("tflite")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WRITER_FILES = sorted(glob.glob(os.path.join(ROOT, "converters", "tflite_write*.py")))
NOT_OPERATORS = {"NHWC", "NCHW"}   # upper-case strings of the writer files that are layouts, not operators


def _writer_trees():
    assert len(WRITER_FILES) >= 5, WRITER_FILES
    return {os.path.basename(p): ast.parse(open(p, encoding="utf-8").read()) for p in WRITER_FILES}


def _options_strings(node):
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and re.fullmatch(r"[A-Z][A-Za-z0-9]*Options", n.value)}


def _op_fields(tree):
    """(options table, field) pairs of the `b.op(kind, ins, outs, options, version, Field=...)` calls. Where
    the table is a variable, each field is paired with every table the function (or a module-level dict it
    reads) names; `**extra` fields come from the function's dict literals."""
    module_dicts = {t.id: _options_strings(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    for t in n.targets if isinstance(t, ast.Name)}
    pairs = set()
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
        fn_tables = _options_strings(fn).union(*(module_dicts.get(n, set()) for n in names))
        dict_keys = {k.value for d in ast.walk(fn) if isinstance(d, ast.Dict) for k in d.keys
                     if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "op"
                    and len(call.args) >= 4):
                continue
            kws = {kw.arg for kw in call.keywords if kw.arg not in (None, "version")}
            opt = call.args[3]
            if isinstance(opt, ast.Constant):
                pairs.update((opt.value, k) for k in kws if opt.value)
            else:
                if any(kw.arg is None for kw in call.keywords):
                    kws |= dict_keys
                pairs.update((t, k) for t in fn_tables for k in kws)
    return pairs


def _uses():
    """(fb attribute names, operator-like strings, options table names, (table, field) pairs) in the writer."""
    attrs, upper, tables, fields, exported = set(), set(), set(), set(), set()
    for tree in _writer_trees().values():
        exported |= {c.value for n in tree.body if isinstance(n, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
                     for c in ast.walk(n.value) if isinstance(c, ast.Constant)}
        tables |= _options_strings(tree)
        fields |= _op_fields(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "fb":
                attrs.add(node.attr)
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and re.fullmatch(r"[A-Z][A-Z0-9_]+", node.value)):
                upper.add(node.value)
    return attrs, upper - NOT_OPERATORS - exported, tables, fields


def test_adapter_exposes_every_name_the_writer_uses():
    from isthmus.converters.tflite_schema import fb, schema
    from isthmus.converters.tflite_write_fb import TENSOR_TYPES
    ns = vars(schema())
    attrs, operators, tables, fields = _uses()
    operators -= set(TENSOR_TYPES.values())
    assert {"ModelStart", "TensorAddShapeSignature", "SignatureDefStart", "BuiltinOperator"} <= attrs
    assert {"CONV_2D", "FULLY_CONNECTED", "UNIDIRECTIONAL_SEQUENCE_LSTM", "QUANTIZE"} <= operators
    assert len(fields) > 20 and {("Conv2DOptions", "StrideH"), ("DivOptions", "FusedActivationFunction"),
                                 ("ResizeBilinearOptions", "HalfPixelCenters")} <= fields
    assert sorted(a for a in attrs if a not in ns) == []
    assert sorted(o for o in operators if not hasattr(fb.BuiltinOperator, o)) == []
    for t in tables:
        assert hasattr(fb.BuiltinOptions, t), t
        assert callable(ns.get(t + "Start")) and callable(ns.get(t + "End")), t
    assert sorted(f"{t}Add{f}" for t, f in fields if f"{t}Add{f}" not in ns) == []
    assert sorted(v for v in TENSOR_TYPES.values() if not hasattr(fb.TensorType, v)) == []
    # the names are the package's own code, not copies
    assert fb.Model is tflite.Model and fb.ModelStart is tflite.ModelStart
    assert fb.BuiltinOperator.CONV_2D == 3 and fb.TensorType.INT8 == 9


def test_an_unknown_name_is_named_in_the_error():
    from isthmus.converters.tflite_schema import fb
    with pytest.raises(AttributeError, match="NoSuchTableStart"):
        fb.NoSuchTableStart


def test_a_missing_package_names_the_extra(monkeypatch):
    import sys
    from isthmus.converters import tflite_schema
    tflite_schema.schema.cache_clear()
    monkeypatch.setitem(sys.modules, "tflite", None)
    try:
        with pytest.raises(ImportError, match=r"isthmus\[tflite\]"):
            tflite_schema.fb.ModelStart
    finally:
        monkeypatch.undo()
        tflite_schema.schema.cache_clear()
    assert callable(tflite_schema.fb.ModelStart)


def test_written_file_reads_back_with_the_tflite_package():
    from isthmus.converters.tflite_write_fb import TFLiteBuilder
    b = TFLiteBuilder()
    x = b.tensor("x", np.float32, (1, 4))
    w = b.const("w", np.arange(8, dtype=np.int8).reshape(2, 4), scale=[0.5, 0.25], zero_point=[0, 0], axis=0)
    y = b.tensor("y", np.float32, (1, 2))
    b.op("FULLY_CONNECTED", [x, w, -1], [y], "FullyConnectedOptions", FusedActivationFunction=1)
    b.inputs, b.outputs = [x], [y]
    b.set_metadata_json("k", {"a": 1})
    m = tflite.Model.GetRootAsModel(b.to_bytes(), 0)
    sg = m.Subgraphs(0)
    t = sg.Tensors(1)
    assert t.Name() == b"w" and list(t.ShapeAsNumpy()) == [2, 4] and t.Type() == 9
    assert list(t.Quantization().ScaleAsNumpy()) == [0.5, 0.25]
    assert bytes(m.Buffers(t.Buffer()).DataAsNumpy()) == np.arange(8, dtype=np.int8).tobytes()
    op = sg.Operators(0)
    assert m.OperatorCodes(op.OpcodeIndex()).BuiltinCode() == 9 and list(op.InputsAsNumpy()) == [0, 1, -1]
    assert m.Metadata(0).Name() == b"k" and m.SignatureDefs(0).SignatureKey() == b"serving_default"
    assert op.BuiltinOptionsType() == tflite.BuiltinOptions.FullyConnectedOptions

"""Every command fails like a tool (issue 22, item 4): for bad input, one line on stderr naming the
file, flag or field, a non-zero exit (2 for input errors), and never a traceback."""
import os
import re

import numpy as np
import pytest

from isthmus.apps import cli

from .cli_models import cnn_onnx, images


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    p = {k: str(d / k) for k in ("empty.onnx", "garbage.onnx", "trunc.onnx", "unknown_op.onnx", "cnn.onnx",
                                 "noshape.onnx", "empty.isth", "garbage.isth", "trunc.isth", "cnn.isth",
                                 "calib.npz", "bad.npz", "wrong.npz", "nan.npz", "trunc.npy", "x.npy", "text.txt",
                                 "garbage.cloud", "empty.graph", "garbage.graph", "profile.json", "folder.onnx")}
    from onnx import TensorProto, helper
    cnn_onnx(p["cnn.onnx"], res=16)
    data = open(p["cnn.onnx"], "rb").read()
    open(p["trunc.onnx"], "wb").write(data[: len(data) // 3])
    open(p["empty.onnx"], "wb").close()
    for k in ("garbage.onnx", "garbage.isth", "garbage.cloud", "garbage.graph"):
        open(p[k], "wb").write(b"\xff\x00garbage" * 40)
    for k in ("empty.isth", "empty.graph"):
        open(p[k], "wb").close()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    m = helper.make_model(helper.make_graph([helper.make_node("Frobnicate", ["x"], ["y"], name="hm")], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 10
    open(p["unknown_op.onnx"], "wb").write(m.SerializeToString())
    xs = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)  # no shape at all
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g", [xs], [y]),
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 10
    open(p["noshape.onnx"], "wb").write(m.SerializeToString())
    assert cli.main(["convert", p["cnn.onnx"], "-o", p["cnn.isth"]]) == 0
    data = open(p["cnn.isth"], "rb").read()
    open(p["trunc.isth"], "wb").write(data[: len(data) // 2])
    np.savez(p["calib.npz"], image=images(4, res=16))
    np.savez(p["wrong.npz"], other=images(4, res=16), more=images(4, res=16))
    np.savez(p["bad.npz"], image=np.zeros((4, 3, 5), np.float32))
    np.savez(p["nan.npz"], image=np.full((4, 1, 16, 16), np.nan, np.float32))
    np.save(p["x.npy"], images(1, res=16))
    open(p["trunc.npy"], "wb").write(open(p["x.npy"], "rb").read()[:60])
    open(p["text.txt"], "w").write("hello")
    open(p["profile.json"], "w").write('{"name": "x", "warp_speed": 9}')
    os.makedirs(p["folder.onnx"])
    p["missing.onnx"] = str(d / "missing.onnx")
    p["out"] = str(d / "out")
    p["existing"] = p["text.txt"]
    return p


# command -> bad argument lists (placeholders in {braces} are fixture files); each is one kind of bad input
CASES = {
    "quantize": ["{missing.onnx} --calibration-data {calib.npz}", "{empty.onnx} --calibration-data {calib.npz}",
                 "{trunc.onnx} --calibration-data {calib.npz}", "{garbage.onnx} --calibration-data {calib.npz}",
                 "{unknown_op.onnx} --calibration-data {calib.npz}", "{cnn.onnx} --calibration-data {wrong.npz}",
                 "{cnn.onnx} --calibration-data {bad.npz}", "{cnn.onnx} --calibration-data {nan.npz}",
                 "{cnn.onnx} --calibration-data {trunc.npy}", "{cnn.onnx} --calibration-data {calib.npz} --method x",
                 "{cnn.onnx} --calibration-data {calib.npz} --method percentile --percentile 20",
                 "{cnn.onnx} --calibration-data {calib.npz} -o {existing}", "{folder.onnx} --calibration-data {calib.npz}",
                 "{noshape.onnx} --calibration-data {calib.npz}", "{text.txt} --calibration-data {calib.npz}",
                 "{cnn.isth} --calibration-data {calib.npz}", "{cnn.onnx}"],
    "split": ["{missing.onnx} -o {out}", "{empty.onnx} -o {out}", "{trunc.onnx} -o {out}", "{garbage.onnx} -o {out}",
              "{unknown_op.onnx} -o {out}", "{cnn.onnx} -o {out} --bandwidth fast", "{cnn.onnx} -o {out} --rtt -4ms",
              "{cnn.onnx} -o {out} --bandwidth 0mbps", "{cnn.onnx} -o {out} --edge-profile {profile.json}",
              "{cnn.onnx} -o {out} --edge-profile {missing.onnx}", "{cnn.onnx} -o {out} --int8",
              "{cnn.onnx} -o {out} --int8 --calibration-data {wrong.npz}", "{cnn.onnx} -o {existing}",
              "{cnn.onnx} -o {out} --batch 0", "{cnn.onnx} -o {out} --input-shape image=1,x"],
    "info": ["{missing.onnx}", "{empty.onnx}", "{trunc.onnx}", "{garbage.onnx}", "{unknown_op.onnx}", "{empty.isth}",
             "{garbage.isth}", "{trunc.isth}", "{garbage.cloud}", "{garbage.graph}", "{text.txt}", "{folder.onnx}"],
    "bench": ["{missing.onnx} --random-input", "{empty.isth} --random-input", "{trunc.isth} --random-input",
              "{garbage.isth} --random-input", "{cnn.isth}", "{cnn.isth} --input {trunc.npy}",
              "{cnn.isth} --input nope={x.npy}", "{cnn.isth} --input {wrong.npz}", "{cnn.isth} --runs 0 --random-input",
              "{cnn.isth} --warmup -1 --random-input", "{cnn.isth} --threads x --random-input",
              "{cnn.isth} --input image={calib.npz}", "{unknown_op.onnx} --random-input",
              "{cnn.onnx} --random-input --input-shape nope=1,2"],
    "edge-run": ["{missing.onnx} --zeros", "{empty.isth} --zeros", "{trunc.isth} --zeros", "{garbage.isth} --zeros",
                 "{cnn.isth}", "{cnn.isth} --input {trunc.npy}", "{cnn.isth} --input {text.txt}",
                 "{cnn.isth} --input nope={x.npy}", "{cnn.isth} --repeat 0 --zeros", "{cnn.isth} --repeat x --zeros",
                 "{cnn.isth} --cloud 127.0.0.1:1 --zeros", "{cnn.isth} --require-cloud --zeros",
                 "{cnn.isth} --input {x.npy} --zeros", "{cnn.isth} --input {wrong.npz}",
                 "{cnn.isth} --zeros --save {existing}"],
    "convert": ["{missing.onnx}", "{empty.onnx}", "{trunc.onnx} -o {out}.isth", "{garbage.onnx} -o {out}.isth",
                "{unknown_op.onnx} -o {out}.isth", "{cnn.onnx} --batch 0", "{cnn.onnx} --to tflite",
                "{cnn.onnx} -o {existing}", "{text.txt}", "{garbage.graph} -o {out}.isth",
                "{noshape.onnx} -o {out}.isth", "{folder.onnx}"],
    "partition": ["{missing.onnx}", "{empty.onnx}", "{trunc.onnx}", "{garbage.onnx}", "{unknown_op.onnx}",
                  "{cnn.onnx} --bandwidth fast", "{cnn.onnx} --rtt soon", "{cnn.onnx} --batch 0",
                  "{cnn.onnx} --edge-profile {profile.json}", "{cnn.onnx} --algorithm magic", "{garbage.graph}",
                  "{empty.graph}"],
    "import": ["{missing.onnx}", "{empty.onnx}", "{trunc.onnx}", "{garbage.onnx}", "{unknown_op.onnx}",
               "{text.txt}", "{cnn.onnx} -o {existing}", "{folder.onnx}", "{noshape.onnx} --nhwc --trainable"],
    "export": ["{missing.onnx}", "{empty.graph}", "{garbage.graph}", "{text.txt}", "{cnn.onnx}",
               "{garbage.graph} --to edge", "{empty.graph} --batch 0", "{garbage.graph} --to tflite"],
    "serve": ["{missing.onnx}", "{garbage.cloud}", "{text.txt} --port 99999", "{garbage.cloud} --port -1",
              "{garbage.cloud} --port x", "{garbage.cloud} --max-batch 0", "{cnn.isth}", "{empty.isth}"],
    "server": ["--cluster {missing.onnx} --job worker", "--cluster {text.txt} --job worker",
               "--cluster {garbage.graph} --job worker", "--cluster ps=127.0.0.1:1 --job worker",
               "--cluster ps=127.0.0.1:1 --job ps --task 3", "--cluster ps=127.0.0.1:1 --job ps --port 99999",
               "--cluster ps=127.0.0.1:1 --job ps --task x", "--cluster {profile.json} --job ps",
               "--cluster ps=127.0.0.1:1 --job ps --recv-timeout soon"],
    "demo": ["--bandwidth fast", "--rtt soon", "--epochs 0", "--batch 0", "--res 4", "--samples 0",
             "--edge-profile {missing.onnx}", "--edge-profile {profile.json}", "--edge-slowdown 0.5",
             "--train-limit 5", "--calibration 0", "--epochs x"],
    "health": ["127.0.0.1", "127.0.0.1:99999", "nohost", ":7070", "127.0.0.1:1 --timeout 0.5",
               "127.0.0.1:1 --timeout 0", "127.0.0.1:1 --timeout x", "127.0.0.1:x"],
    "profile": ["--ops NoSuchOp --quick --out {out}.json", "--clock sundial", "--device gpu",
                "--from-trace {missing.onnx}", "--from-trace {garbage.isth}", "--blas-threads x",
                "--slowdown fast", "--ops Relu --quick --clock cpu --blas-threads 2 --out {out}.json",
                "--ops Relu --quick --out {existing}", "--runtime litert --ops Softmax --quick --out {out}.json",
                "--runtime litert --clock cpu --out {out}.json", "--runtime litert --from-trace {missing.onnx}",
                "--runtime tvm"],
}


def _expand(text, files):
    return [re.sub(r"\{([^}]+)\}", lambda m: files[m.group(1)], a) for a in text.split()]


@pytest.mark.parametrize("command", sorted(CASES))
def test_bad_input_gives_one_line_and_no_traceback(command, files, capsys):
    assert len(CASES[command]) >= 8
    for case in CASES[command]:
        argv = [command, *_expand(case, files)]
        capsys.readouterr()
        code = cli.main(argv)
        out, err = capsys.readouterr()
        assert code != 0, (case, out, err)
        assert "Traceback" not in err + out, (case, err)
        lines = [ln for ln in err.strip().splitlines() if not ln.startswith(("usage:", " "))]
        assert len(lines) == 1, (case, err)
        assert lines[0].startswith(f"isthmus {command}"), (case, err)
        if code == 2:  # names what is at fault: a file, a flag or value given, or the input field
            named = [os.path.basename(a) for a in argv[1:]] + [a.lstrip("-") for a in argv[1:] if a.startswith("--")]
            assert any(len(n) > 2 and n in lines[0] for n in named) or "input" in lines[0] or "argument" in lines[0], (case, err)


def test_debug_shows_the_traceback(files, capsys):
    assert cli.main(["info", files["garbage.isth"], "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err

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
                                 "garbage.cloud", "empty.graph", "garbage.graph", "profile.json", "folder.onnx",
                                 "cnn.graph", "trunc.graph", "trunc.cloud")}
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
    assert cli.main(["import", p["cnn.onnx"], "-o", p["cnn.graph"]]) == 0
    data = open(p["cnn.graph"], "rb").read()
    open(p["trunc.graph"], "wb").write(data[: len(data) // 2])
    from isthmus.apps.deploy import deploy_split
    dep = deploy_split(p["cnn.onnx"], str(d / "split"), "1gbps", "1ms", "phone")  # offloads at this link
    assert dep.cloud_file, dep.report
    p["split.isth"], p["split.cloud"] = dep.edge_file, dep.cloud_file
    data = open(dep.cloud_file, "rb").read()
    open(p["trunc.cloud"], "wb").write(data[: len(data) // 2])
    p["missing.onnx"] = str(d / "missing.onnx")
    p["out"] = str(d / "out")
    p["existing"] = p["text.txt"]
    p["nodir"] = str(d / "no-such-folder" / "out")
    return p


# command -> (kind of bad input, arguments); placeholders in {braces} are fixture files. Each command gets at
# least 8 distinct kinds; every one exits 2 (bad input), or 1 where the input is fine and a server is not
KINDS_EXIT_1 = ("unreachable server",)
CASES = {
    "quantize": [("missing file", "{missing.onnx} --calibration-data {calib.npz}"),
                 ("empty file", "{empty.onnx} --calibration-data {calib.npz}"),
                 ("truncated file", "{trunc.onnx} --calibration-data {calib.npz}"),
                 ("corrupt file", "{garbage.onnx} --calibration-data {calib.npz}"),
                 ("unknown op", "{unknown_op.onnx} --calibration-data {calib.npz}"),
                 ("data with wrong names", "{cnn.onnx} --calibration-data {wrong.npz}"),
                 ("data of wrong shape", "{cnn.onnx} --calibration-data {bad.npz}"),
                 ("NaN data", "{cnn.onnx} --calibration-data {nan.npz}"),
                 ("truncated data file", "{cnn.onnx} --calibration-data {trunc.npy}"),
                 ("unknown choice", "{cnn.onnx} --calibration-data {calib.npz} --method x"),
                 ("out of range value", "{cnn.onnx} --calibration-data {calib.npz} --method percentile --percentile 20"),
                 ("existing output", "{cnn.onnx} --calibration-data {calib.npz} -o {existing}"),
                 ("missing output folder", "{cnn.onnx} --calibration-data {calib.npz} -o {nodir}"),
                 ("directory", "{folder.onnx} --calibration-data {calib.npz}"),
                 ("no input shape", "{noshape.onnx} --calibration-data {calib.npz}"),
                 ("wrong format", "{text.txt} --calibration-data {calib.npz}"),
                 ("already converted", "{cnn.isth} --calibration-data {calib.npz}"),
                 ("missing required flag", "{cnn.onnx}")],
    "split": [("missing file", "{missing.onnx} -o {out}"), ("empty file", "{empty.onnx} -o {out}"),
              ("truncated file", "{trunc.onnx} -o {out}"), ("corrupt file", "{garbage.onnx} -o {out}"),
              ("unknown op", "{unknown_op.onnx} -o {out}"), ("unparsable value", "{cnn.onnx} -o {out} --bandwidth fast"),
              ("negative value", "{cnn.onnx} -o {out} --rtt -4ms"),
              ("out of range value", "{cnn.onnx} -o {out} --bandwidth 0mbps"),
              ("bad profile", "{cnn.onnx} -o {out} --edge-profile {profile.json}"),
              ("missing profile", "{cnn.onnx} -o {out} --edge-profile {missing.onnx}"),
              ("flag needs another", "{cnn.onnx} -o {out} --int8"),
              ("data with wrong names", "{cnn.onnx} -o {out} --int8 --calibration-data {wrong.npz}"),
              ("existing output", "{cnn.onnx} -o {existing}"), ("zero count", "{cnn.onnx} -o {out} --batch 0"),
              ("bad shape", "{cnn.onnx} -o {out} --input-shape image=1,x"),
              ("unknown choice", "{cnn.onnx} -o {out} --edge-format jpg"),
              ("missing required flag", "{cnn.onnx}")],
    "info": [("missing file", "{missing.onnx}"), ("empty file", "{empty.onnx}"), ("truncated file", "{trunc.onnx}"),
             ("corrupt file", "{garbage.onnx}"), ("unknown op", "{unknown_op.onnx}"), ("empty edge file", "{empty.isth}"),
             ("corrupt edge file", "{garbage.isth}"), ("truncated edge file", "{trunc.isth}"),
             ("corrupt cloud file", "{garbage.cloud}"), ("truncated cloud file", "{trunc.cloud}"),
             ("corrupt graph file", "{garbage.graph}"), ("truncated graph file", "{trunc.graph}"),
             ("wrong format", "{text.txt}"), ("directory", "{folder.onnx}"), ("unknown flag", "{cnn.onnx} --per-op")],
    "bench": [("missing file", "{missing.onnx} --random-input"), ("empty file", "{empty.isth} --random-input"),
              ("truncated file", "{trunc.isth} --random-input"), ("corrupt file", "{garbage.isth} --random-input"),
              ("no input given", "{cnn.isth}"), ("truncated data file", "{cnn.isth} --input {trunc.npy}"),
              ("unknown input name", "{cnn.isth} --input nope={x.npy}"),
              ("data with wrong names", "{cnn.isth} --input {wrong.npz}"),
              ("zero count", "{cnn.isth} --runs 0 --random-input"),
              ("negative value", "{cnn.isth} --warmup -1 --random-input"),
              ("unparsable value", "{cnn.isth} --threads x --random-input"),
              ("wrong data format", "{cnn.isth} --input image={calib.npz}"),
              ("unknown op", "{unknown_op.onnx} --random-input"),
              ("unknown input name in shape", "{cnn.onnx} --random-input --input-shape nope=1,2")],
    "edge-run": [("missing file", "{missing.onnx} --zeros"), ("empty file", "{empty.isth} --zeros"),
                 ("truncated file", "{trunc.isth} --zeros"), ("corrupt file", "{garbage.isth} --zeros"),
                 ("no input given", "{cnn.isth}"), ("truncated data file", "{cnn.isth} --input {trunc.npy}"),
                 ("wrong data format", "{cnn.isth} --input {text.txt}"),
                 ("unknown input name", "{cnn.isth} --input nope={x.npy}"),
                 ("zero count", "{cnn.isth} --repeat 0 --zeros"), ("unparsable value", "{cnn.isth} --repeat x --zeros"),
                 ("not a split model", "{cnn.isth} --cloud 127.0.0.1:1 --zeros"),
                 ("flag needs another", "{cnn.isth} --require-cloud --zeros"),
                 ("conflicting flags", "{cnn.isth} --input {x.npy} --zeros"),
                 ("data with wrong names", "{cnn.isth} --input {wrong.npz}"),
                 ("existing output", "{cnn.isth} --zeros --save {existing}"),
                 ("unreachable server", "{split.isth} --zeros --cloud 127.0.0.1:1 --require-cloud --deadline-ms 3000"),
                 ("out of range value", "{split.isth} --zeros --cloud 127.0.0.1:1 --deadline-ms 0"),
                 ("missing token file", "{split.isth} --zeros --cloud 127.0.0.1:1 --token-file {missing.onnx}"),
                 ("unparsable link", "{split.isth} --zeros --cloud 127.0.0.1:1 --emulate-link fast"),
                 ("wrong format for the runtime", "{cnn.isth} --runtime onnxruntime --zeros"),
                 ("not a .tflite for litert", "{cnn.onnx} --runtime litert --zeros"),
                 ("cloud flag without --cloud", "{split.isth} --zeros --cut cut1"),
                 ("unknown cut", "{split.isth} --zeros --cloud 127.0.0.1:1 --cut nosuch")],
    "convert": [("missing file", "{missing.onnx}"), ("empty file", "{empty.onnx}"),
                ("truncated file", "{trunc.onnx} -o {out}.isth"), ("corrupt file", "{garbage.onnx} -o {out}.isth"),
                ("unknown op", "{unknown_op.onnx} -o {out}.isth"), ("zero count", "{cnn.onnx} --batch 0"),
                ("unknown choice", "{cnn.onnx} --to tflite"), ("existing output", "{cnn.onnx} -o {existing}"),
                ("missing output folder", "{cnn.onnx} -o {nodir}"), ("wrong format", "{text.txt}"),
                ("corrupt graph file", "{garbage.graph} -o {out}.isth"), ("no input shape", "{noshape.onnx} -o {out}.isth"),
                ("directory", "{folder.onnx}"), ("bad shape", "{noshape.onnx} -o {out}.isth --input-shape x=1,-3")],
    "partition": [("missing file", "{missing.onnx}"), ("empty file", "{empty.onnx}"), ("truncated file", "{trunc.onnx}"),
                  ("corrupt file", "{garbage.onnx}"), ("unknown op", "{unknown_op.onnx}"),
                  ("unparsable value", "{cnn.onnx} --bandwidth fast"), ("unparsable duration", "{cnn.onnx} --rtt soon"),
                  ("zero count", "{cnn.onnx} --batch 0"), ("bad profile", "{cnn.onnx} --edge-profile {profile.json}"),
                  ("unknown choice", "{cnn.onnx} --algorithm magic"), ("corrupt graph file", "{garbage.graph}"),
                  ("empty graph file", "{empty.graph}"), ("unparsable call cost", "{cnn.onnx} --call-cost soon"),
                  ("out of range value", "{cnn.onnx} --edge-slowdown 0"),
                  ("existing output", "{cnn.onnx} --svg {existing}")],
    "import": [("missing file", "{missing.onnx}"), ("empty file", "{empty.onnx}"), ("truncated file", "{trunc.onnx}"),
               ("corrupt file", "{garbage.onnx}"), ("unknown op", "{unknown_op.onnx}"), ("wrong format", "{text.txt}"),
               ("existing output", "{cnn.onnx} -o {existing}"), ("directory", "{folder.onnx}"),
               ("no input shape", "{noshape.onnx} --nhwc --trainable"), ("missing output folder", "{cnn.onnx} -o {nodir}")],
    "export": [("missing file", "{missing.onnx}"), ("empty file", "{empty.graph}"), ("corrupt file", "{garbage.graph}"),
               ("truncated file", "{trunc.graph}"), ("wrong format", "{text.txt}"), ("an ONNX file, not a graph", "{cnn.onnx}"),
               ("unknown choice", "{cnn.graph} --to tflite2"), ("zero count", "{cnn.graph} --to edge --batch 0"),
               ("existing output", "{cnn.graph} -o {existing}"), ("missing output folder", "{cnn.graph} -o {nodir}"),
               ("missing checkpoint", "{cnn.graph} -o {out}.onnx --checkpoint {missing.onnx}"),
               ("directory", "{folder.onnx}")],
    "serve": [("missing file", "{missing.onnx}"), ("corrupt file", "{garbage.cloud}"),
              ("truncated file", "{trunc.cloud}"), ("out of range port", "{text.txt} --port 99999"),
              ("negative port", "{garbage.cloud} --port -1"), ("unparsable value", "{garbage.cloud} --port x"),
              ("zero count", "{split.cloud} --max-batch 0"), ("wrong format", "{cnn.isth}"), ("empty file", "{empty.isth}"),
              ("negative value", "{split.cloud} --max-delay-ms -1"), ("zero threads", "{split.cloud} --blas-threads 0"),
              ("flag needs another", "{split.cloud} --tls-cert {text.txt}"),
              ("missing TLS file", "{split.cloud} --tls-cert {missing.onnx} --tls-key {missing.onnx}")],
    "server": [("missing file", "--cluster {missing.onnx} --job worker"),
               ("corrupt spec", "--cluster {text.txt} --job worker"),
               ("binary spec file", "--cluster {garbage.graph} --job worker"),
               ("unknown job", "--cluster ps=127.0.0.1:1 --job worker"),
               ("task out of range", "--cluster ps=127.0.0.1:1 --job ps --task 3"),
               ("out of range port", "--cluster ps=127.0.0.1:1 --job ps --port 99999"),
               ("unparsable value", "--cluster ps=127.0.0.1:1 --job ps --task x"),
               ("wrong JSON shape", "--cluster {profile.json} --job ps"),
               ("unparsable duration", "--cluster ps=127.0.0.1:1 --job ps --recv-timeout soon"),
               ("negative duration", "--cluster ps=127.0.0.1:1 --job ps --recv-timeout -1"),
               ("zero size", "--cluster ps=127.0.0.1:1 --job ps --max-message-mb 0"),
               ("missing TLS file", "--cluster ps=127.0.0.1:1 --job ps --tls-cert {missing.onnx} --tls-key {missing.onnx}"),
               ("no cluster", "--job ps")],
    "demo": [("unparsable value", "--bandwidth fast"), ("unparsable duration", "--rtt soon"), ("zero count", "--epochs 0"),
             ("zero batch", "--batch 0"), ("out of range value", "--res 4"), ("zero samples", "--samples 0"),
             ("missing profile", "--edge-profile {missing.onnx}"), ("bad profile", "--edge-profile {profile.json}"),
             ("below 1", "--edge-slowdown 0.5"), ("fewer images than a batch", "--train-limit 5"),
             ("zero calibration", "--calibration 0"), ("not a number", "--epochs x"), ("unknown flag", "--nonsense-flag"),
             ("zero bandwidth", "--bandwidth 0mbps")],
    "health": [("no port", "127.0.0.1"), ("out of range port", "127.0.0.1:99999"), ("no host", ":7070"),
               ("unreachable server", "127.0.0.1:1 --timeout 0.5"), ("zero timeout", "127.0.0.1:1 --timeout 0"),
               ("unparsable value", "127.0.0.1:1 --timeout x"), ("unparsable port", "127.0.0.1:x"),
               ("missing required argument", ""), ("a name, no address", "nohost")],
    "profile": [("unknown op", "--ops NoSuchOp --quick --out {out}.json"), ("unknown choice", "--clock sundial"),
                ("no GPU", "--device gpu"), ("missing file", "--from-trace {missing.onnx}"),
                ("corrupt file", "--from-trace {garbage.isth}"), ("unparsable value", "--blas-threads x"),
                ("not a number", "--slowdown fast"),
                ("conflicting flags", "--ops Relu --quick --clock cpu --blas-threads 2 --out {out}.json"),
                ("existing output", "--ops Relu --quick --out {existing}"),
                ("op LiteRT is not timed on", "--runtime litert --ops Softmax --quick --out {out}.json"),
                ("clock LiteRT does not have", "--runtime litert --clock cpu --out {out}.json"),
                ("flag not for this runtime", "--runtime litert --from-trace {missing.onnx}"),
                ("unknown runtime", "--runtime tvm"), ("zero slowdown", "--slowdown 0 --ops Relu --quick --out {out}.json"),
                ("zero threads", "--blas-threads 0 --ops Relu --quick --out {out}.json"),
                ("zero count", "--client --client-requests 0")],
    # `ops` takes one switch and no input: these are all the kinds of bad input it can get
    "ops": [("unknown flag", "--jsn"), ("unexpected argument", "Relu"), ("value given to a switch", "--json=yes")],
}


def _expand(text, files):
    return [re.sub(r"\{([^}]+)\}", lambda m: files[m.group(1)], a) for a in text.split()]


FEWER_KINDS = {"ops": "one switch, no input: three kinds are all there are"}  # commands allowed under 8, and why


def test_every_command_has_eight_kinds_of_bad_input():
    assert set(CASES) == set(cli.COMMANDS), "every command `isthmus --help` lists gets its bad inputs here"
    for command, cases in CASES.items():
        kinds = {k for k, _ in cases}
        assert len(kinds) == len(cases), f"{command}: a kind listed twice"
        assert len(kinds) >= 8 or command in FEWER_KINDS, f"{command}: {len(kinds)} kinds of bad input"


class _Hung(Exception):
    pass


@pytest.mark.parametrize("command", sorted(CASES))
def test_bad_input_gives_one_line_and_no_traceback(command, files, capsys):
    import signal
    hung = []
    old = signal.signal(signal.SIGALRM, lambda *_: (hung.append(1), (_ for _ in ()).throw(_Hung())))
    try:
        for kind, case in CASES[command]:
            argv = [command, *_expand(case, files)]
            capsys.readouterr()
            signal.alarm(60)  # bounded: a case that starts a server instead of refusing is a failure, not a hang
            code = cli.main(argv)
            signal.alarm(0)
            out, err = capsys.readouterr()
            assert not hung, (kind, case, "did not return within 60 s")
            assert code == (1 if kind in KINDS_EXIT_1 and code == 1 else 2), (kind, case, code, err)
            assert "Traceback" not in err + out, (kind, case, err)
            lines = [ln for ln in err.strip().splitlines() if not ln.startswith(("usage:", " "))]
            assert len(lines) == 1, (kind, case, err)
            assert lines[0].startswith(f"isthmus {command}") or lines[0].startswith("isthmus: error"), (kind, case, err)
            # names what is at fault: a file, a flag or value given, or the input field
            named = [os.path.basename(a) for a in argv[1:]] + [a.lstrip("-") for a in argv[1:] if a.startswith("--")]
            assert any(len(n) > 2 and n in lines[0] for n in named) or "input" in lines[0] or "argument" in lines[0] \
                or "cluster" in lines[0], (kind, case, err)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_no_command_or_an_unknown_one(capsys):
    assert cli.main([]) == 2
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "frobnicate" in err and "Traceback" not in err


def test_debug_shows_the_traceback(files, capsys):
    assert cli.main(["info", files["garbage.isth"], "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err

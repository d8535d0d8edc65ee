"""Every Python snippet in docs/ runs (each page's snippets in order, in one namespace)."""
import os
import re

import pytest

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
PAGES = sorted(f for f in os.listdir(DOCS) if f.endswith(".md"))


@pytest.mark.parametrize("page", PAGES)
def test_snippets_run(page, tmp_path, monkeypatch):
    text = open(os.path.join(DOCS, page), encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{page}"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/{page} snippet {i + 1}", "exec"), namespace)  # noqa: S102 - our own docs


# ---- command lines ----------------------------------------------------------------------------------
ROOT = os.path.dirname(DOCS)
TEXTS = ["README.md"] + [os.path.join("docs", p) for p in PAGES]
# placeholders the docs write for values a user fills in, as a value each command accepts
PLACEHOLDERS = {"P": "7070", "N": "1", "NAME": "x", "HOST:PORT": "127.0.0.1:7070", "SPEC": "cluster.json",
                "CKPT": "ckpt", "DIR": "out", "FILE": "m.isth", "MODEL": "m.onnx", "TRACE": "t.json"}


# command lines a page names as not wired yet (none now; docs/phone.md had one): they must keep failing to parse until they
# are wired, then leave this set
NOT_YET: set = set()


def command_lines(text: str):
    """(line, in a console block) for every `isthmus ...` command shown: in code blocks (`$ ` prompts,
    `\\` continuations, trailing comments and `&` dropped) and in inline code spans."""
    out = []
    for lang, block in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S):
        if lang not in ("bash", "sh", "console", ""):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line.strip()).removeprefix("$ ").strip().rstrip("&").strip()
            if line.startswith("isthmus "):
                out.append((line, lang == "console"))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    out += [(m, False) for m in re.findall(r"`(isthmus [a-z][a-z-]*(?: [^`]*)?)`", prose)]
    return out


def _normalise(line: str) -> list:
    """A documented line as argv: [optional] parts kept, the first of a|b alternatives, `...` and
    bare placeholders replaced by a value the flag accepts."""
    line = line.replace("\\|", "|").replace("[", " ").replace("]", " ")
    argv = []
    for tok in line.split()[1:]:
        tok = tok.split("|")[0]
        if tok in ("...", "…"):
            if argv and argv[-1].startswith("--"):
                argv.append("x")  # `--flag ...`: some value
            continue
        argv.append(PLACEHOLDERS.get(tok, tok))
    return argv


def test_every_documented_command_line_parses():
    """Each command line in README.md, docs/ and the commands' --help examples names a command that
    exists, with flags it accepts."""
    import argparse
    import importlib

    from isthmus.apps import cli
    seen = 0
    shown = [(path, line) for path in TEXTS
             for line, _ in command_lines(open(os.path.join(ROOT, path), encoding="utf-8").read())]
    for name, (module, _) in cli.COMMANDS.items():  # and the examples each command's --help prints
        examples = getattr(importlib.import_module(module), "EXAMPLES", "")
        shown += [(f"isthmus {name} --help", ln.strip().rstrip("&").split("  #")[0].strip())
                  for ln in examples.splitlines() if ln.strip().startswith("isthmus ")]
    for path, line in shown:
        argv = _normalise(line)
        if argv[:1] == ["-h"] or "--help" in argv or "--help-demo" in argv or "--version" in argv:
            continue
        command = cli.ALIASES.get(argv[0], argv[0]) if argv else ""
        assert command in cli.COMMANDS, f"{path}: `{line}`: no command {command!r}"
        if len(argv) == 1 and line.strip() == f"isthmus {argv[0]}":
            continue  # the command named in prose, not a command line
        p = argparse.ArgumentParser(prog=f"isthmus {command}", exit_on_error=False)
        mod = importlib.import_module(cli.COMMANDS[command][0])
        mod.add_arguments(p)
        if command in cli.OVERWRITING:
            p.add_argument("--force", action="store_true")
        try:
            if getattr(mod, "PASSTHROUGH", False):
                p.parse_known_args(argv[1:])
            else:
                p.parse_args(argv[1:])
        except (argparse.ArgumentError, SystemExit) as e:
            if line in NOT_YET:
                continue
            raise AssertionError(f"{path}: `{line}` does not parse: {e}") from None
        assert line not in NOT_YET, f"`{line}` parses now: take it out of NOT_YET"
        seen += 1
    assert seen > 20


# the command lines run (not only parse) in tests/test_cli_docs.py

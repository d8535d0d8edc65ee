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

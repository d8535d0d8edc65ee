"""ISTHMUS_JIT is read at each call of jit.enabled_by_env (its fast path looks the raw value up in
os.environ's own dict): every write through os.environ is seen at once, whatever the spelling."""
import os

import pytest

from isthmus import jit


@pytest.mark.parametrize("value,enabled", [("0", False), ("false", False), (" Off ", False), ("NO", False),
                                           ("1", True), ("yes", True), ("", True)])
def test_each_spelling_is_seen_at_the_next_call(monkeypatch, value, enabled):
    monkeypatch.setenv("ISTHMUS_JIT", value)
    assert jit.enabled_by_env() is enabled
    monkeypatch.setenv("ISTHMUS_JIT", "1" if not enabled else "0")
    assert jit.enabled_by_env() is (not enabled)


def test_unset_means_enabled(monkeypatch):
    monkeypatch.setenv("ISTHMUS_JIT", "0")
    assert not jit.enabled_by_env()
    monkeypatch.delenv("ISTHMUS_JIT")
    assert jit.enabled_by_env()


def test_many_spellings_stay_bounded(monkeypatch):
    for i in range(40):
        monkeypatch.setenv("ISTHMUS_JIT", "off" + " " * i)
        assert not jit.enabled_by_env()
    assert len(jit._verdicts) <= 17


def test_agrees_with_os_environ_get(monkeypatch):
    for value in ("0", "on", "off", "False", "2"):
        monkeypatch.setenv("ISTHMUS_JIT", value)
        assert jit.enabled_by_env() == jit._parse(os.environ.get("ISTHMUS_JIT", "1"))

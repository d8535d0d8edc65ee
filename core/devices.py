"""Device names: /job:<job>/task:<n>/device:<CPU|GPU>:<n>, any part may be left out."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

_PART = re.compile(r"^(?:/job:(?P<job>[A-Za-z_][\w-]*))?(?:/replica:\d+)?(?:/task:(?P<task>\d+))?"
                   r"(?:/device:(?P<kind>CPU|GPU):(?P<index>\d+|\*))?$")


@dataclass(frozen=True)
class DeviceSpec:
    job: Optional[str] = None
    task: Optional[int] = None
    kind: Optional[str] = None
    index: Optional[int] = None

    @classmethod
    def parse(cls, name: str) -> "DeviceSpec":
        if not isinstance(name, str):
            raise ValueError(f"device must be a string, got {name!r}")
        m = _PART.match(name.strip())
        if not m:
            raise ValueError(f"malformed device name {name!r}; expected "
                             "/job:<job>/task:<n>/device:<CPU|GPU>:<n> (any part may be omitted)")
        idx = m.group("index")
        return cls(m.group("job"), int(m.group("task")) if m.group("task") else None,
                   m.group("kind"), None if idx in (None, "*") else int(idx))

    def merged_onto(self, outer: "DeviceSpec") -> "DeviceSpec":
        """Fields set here win; unset fields come from the enclosing scope."""
        return DeviceSpec(self.job if self.job is not None else outer.job,
                          self.task if self.task is not None else outer.task,
                          self.kind if self.kind is not None else outer.kind,
                          self.index if self.index is not None else outer.index)

    def __str__(self) -> str:
        s = ""
        if self.job is not None:
            s += f"/job:{self.job}"
        if self.task is not None:
            s += f"/task:{self.task}"
        if self.kind is not None:
            s += f"/device:{self.kind}:{self.index if self.index is not None else 0}"
        return s


def canonical(name: Optional[str]) -> Optional[str]:
    return None if not name else str(DeviceSpec.parse(name))

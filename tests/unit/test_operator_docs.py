"""docs/operator.md lists every controller's steps in the order the code runs them."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operator.md"
MODULES = {
    "NstanceCluster": "nstance.operator.controllers.cluster",
    "NstanceMachinePool": "nstance.operator.controllers.machinepool.steps",
    "NstanceShardGroup": "nstance.operator.controllers.shardgroup.steps",
    "NstanceMachine": "nstance.operator.controllers.machine.steps",
    "On-demand pods": "nstance.operator.controllers.ondemand.steps",
}
_ROW = re.compile(r"^\| ([^|]+?) \| `([A-Z_]+)`[^|]* \| ([^|]+?) \|$")


def _documented() -> dict[tuple[str, str], list[str]]:
    rows = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        match = _ROW.match(line)
        if match and match.group(1) in MODULES:
            rows[(match.group(1), match.group(2))] = [s.strip() for s in match.group(3).split(",")]
    return rows


def _in_code() -> dict[tuple[str, str], list[str]]:
    lists = {}
    for controller, name in MODULES.items():
        module = importlib.import_module(name)
        for attr in ("STEPS", "DELETE_STEPS", "ENSURE_STEPS"):
            steps = getattr(module, attr, None)
            if steps is not None:
                lists[(controller, attr)] = [step.name for step in steps]
    return lists


def test_the_step_table_is_the_code() -> None:
    assert _documented() == _in_code()

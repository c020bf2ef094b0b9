"""docs/operator.md lists every controller's steps (and the drain coordinator's) in the order the code
runs them: every ``*STEPS`` list of each module below is a row of the table, and every row is a list."""

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
    "Drain coordinator": "nstance.operator.drain.steps",
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
        for attr, steps in vars(module).items():
            if attr.endswith("STEPS") and isinstance(steps, tuple):
                lists[(controller, attr)] = [step.name for step in steps]
    return lists


def test_the_step_table_is_the_code() -> None:
    assert _documented() == _in_code()


def test_every_controller_has_rows() -> None:
    documented = {controller for controller, _ in _documented()}
    assert documented == set(MODULES)

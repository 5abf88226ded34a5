"""Mapping ONNX values to module calls through the exporter's scope metadata."""

from __future__ import annotations

from pathlib import Path

import onnx
import torch
from torch import nn

from paritygate.precision.onnx_compare import map_module_outputs, node_scopes


class Repeats(nn.Module):
    """One activation module called twice, plus modules the exporter removes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.1)
        self.idle = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))
        return self.idle(self.drop(self.act(self.fc2(h))))


def test_scopes_map_repeated_calls_and_exporter_records_them(tmp_path: Path) -> None:
    torch.manual_seed(0)
    program = torch.onnx.export(Repeats().eval(), (torch.randn(2, 4),), dynamo=True, verbose=False)
    path = tmp_path / "repeats.onnx"
    program.save(str(path))
    graph = onnx.load(str(path)).graph
    # the dynamo exporter of this torch version records the module path on every node
    assert all(node_scopes(n) is not None for n in graph.node)
    mapped, unmapped, unscoped = map_module_outputs(graph)
    assert set(mapped) == {"fc1", "act", "fc2", "act#1"}
    producers = {out: n.op_type for n in graph.node for out in n.output}
    assert producers[mapped["act"]] == "Gelu" and producers[mapped["act#1"]] == "Gelu"
    assert mapped["act"] != mapped["act#1"]
    assert mapped["act#1"] == graph.output[0].name
    assert "drop" not in mapped and "idle" not in mapped and not unmapped and unscoped == 0

"""Compare an ONNX artifact's intermediate tensors with the torch modules' fp32 outputs.

The torch.onnx dynamo exporter records, on every node, the module path it
came from (``pkg.torch.onnx.name_scopes``, e.g. ``['', 'blocks.0', 'blocks.0.fc',
'linear']``; the older ``namespace`` string carries the same). The nodes of one
module call form a connected piece of the graph; the one value that leaves it
is the module's output. Repeated calls of a module are told apart by order
(``act``, ``act#1``). Those values are added as extra graph outputs on an
in-memory copy (the file is never touched) and read in one ONNX Runtime
session per batch. The final output always comes from a session on the
unmodified artifact. Modules that cannot be mapped are listed with the reason.

Marking a tensor as a graph output keeps ONNX Runtime from fusing nodes across
it, so the marked copy may run other kernels (in fp16 visibly so): the output
reads differently there than in the artifact as served. The report keeps both:
the headline (judged) output from the unmodified artifact, the per-layer rows
and the output as read in the marked copy beside it, labelled.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.errors import InputError, MissingExtra
from paritygate.precision.budgets import output_budget, unit_roundoff
from paritygate.precision.report import OnnxFirstDivergent, OnnxReport, OnnxRow, OnnxUnmapped
from paritygate.precision.stats import ErrorStats

if TYPE_CHECKING:
    import onnx
    import torch


def node_scopes(node: onnx.NodeProto) -> list[str] | None:
    """Module path of an exported node, outermost first, without the root and the op."""
    props = {p.key: p.value for p in node.metadata_props}
    raw = props.get("pkg.torch.onnx.name_scopes")
    if raw:
        try:
            scopes = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            scopes = None
        if isinstance(scopes, list) and scopes:
            return [s for s in scopes[:-1] if s]
    raw = props.get("namespace")
    if raw:
        parts = [p.split(":")[0].strip() for p in raw.split("/")]
        return [p for p in parts[:-1] if p]
    return None


def map_module_outputs(graph: onnx.GraphProto) -> tuple[dict[str, str], dict[str, str], int]:
    """``({layer key: value name}, {layer key: why unmapped}, unscoped node count)``."""
    members: dict[str, list[int]] = {}
    unscoped = 0
    for index, node in enumerate(graph.node):
        scopes = node_scopes(node)
        if scopes is None:
            unscoped += 1
            continue
        for scope in dict.fromkeys(scopes):
            members.setdefault(scope, []).append(index)
    consumers: dict[str, set[int]] = {}
    for index, node in enumerate(graph.node):
        for name in node.input:
            consumers.setdefault(name, set()).add(index)
    graph_outputs = {o.name for o in graph.output}
    mapped: dict[str, str] = {}
    unmapped: dict[str, str] = {}
    for scope, nodes in members.items():
        for call, component in enumerate(_components(graph, nodes, consumers)):
            key = f"{scope}#{call}" if call else scope
            inside = set(component)
            leaving = [
                out
                for i in component
                for out in graph.node[i].output
                if out and (out in graph_outputs or consumers.get(out, set()) - inside)
            ]
            if len(leaving) == 1:
                mapped[key] = leaving[0]
            else:
                unmapped[key] = f"its graph piece has {len(leaving)} outgoing values, not one"
    return mapped, unmapped, unscoped


def _components(graph: onnx.GraphProto, nodes: list[int], consumers: dict[str, set[int]]
                ) -> list[list[int]]:
    """Connected pieces of ``nodes`` (linked by values flowing between them), in graph order."""
    parent = {i: i for i in nodes}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in nodes:
        for out in graph.node[i].output:
            for j in consumers.get(out, ()):
                if j in parent:
                    parent[find(j)] = find(i)
    groups: dict[int, list[int]] = {}
    for i in nodes:
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def _through_casts(graph: onnx.GraphProto, name: str) -> str:
    """The value ``name`` is a Cast or Identity of (followed back), else ``name`` itself."""
    producer = {out: node for node in graph.node for out in node.output}
    node = producer.get(name)
    while node is not None and node.op_type in ("Cast", "Identity") and node.input:
        name = node.input[0]
        node = producer.get(name)
    return name


def artifact_dtype(model: onnx.ModelProto) -> str:
    """``float16``/``bfloat16`` when most floating initializers are, else ``float32``."""
    from onnx import TensorProto

    counts = {"float16": 0, "bfloat16": 0, "float32": 0}
    names = {
        TensorProto.FLOAT16: "float16",
        TensorProto.BFLOAT16: "bfloat16",
        TensorProto.FLOAT: "float32",
    }
    for init in model.graph.initializer:
        if init.data_type in names:
            counts[names[init.data_type]] += int(np.prod(init.dims)) if init.dims else 1
    return max(counts, key=lambda k: counts[k]) if any(counts.values()) else "float32"


class OnnxComparison:
    """One artifact compared layer by layer with the torch fp32 pass, batch by batch."""

    def __init__(self, path: Path, feeds: list[dict[str, np.ndarray]], output_name: str | None,
                 output_transform: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        try:
            import onnx
            import onnxruntime as ort
        except ImportError as exc:
            raise MissingExtra(exc.name or "onnx", "onnx") from None
        try:
            model = onnx.load(str(path))
        except Exception as exc:
            raise InputError(path, None, f"cannot read ONNX artifact: {exc}") from None
        self.path = Path(path)
        self.feeds = feeds
        self.output_transform = output_transform
        """The torch output in the artifact's terms (see ``PrecisionSubject``)."""
        self.dtype = artifact_dtype(model)
        self.mapped, self.unmapped, self.unscoped = map_module_outputs(model.graph)
        instrumented = onnx.ModelProto()
        instrumented.CopyFrom(model)
        existing = {o.name for o in instrumented.graph.output}
        typed = {v.name: v for v in instrumented.graph.value_info}
        for value in dict.fromkeys(self.mapped.values()):
            if value not in existing:
                info = typed.get(value) or onnx.ValueInfoProto(name=value)
                instrumented.graph.output.append(info)
        providers = ["CPUExecutionProvider"]
        self.session = ort.InferenceSession(instrumented.SerializeToString(), providers=providers)
        self.plain = ort.InferenceSession(str(path), providers=providers)
        outputs = [o.name for o in self.plain.get_outputs()]
        if output_name is not None and output_name not in outputs:
            raise InputError(path, "onnx_output_name", f"artifact has no output {output_name!r}")
        self.output_name = output_name or outputs[0]
        self.output_value = _through_casts(model.graph, self.output_name)
        """The value the output is a cast or copy of (its layer's row reads the output)."""
        self.values: dict[str, np.ndarray] = {}
        self.final: np.ndarray | None = None
        self.layers: dict[str, ErrorStats] = {}
        self.mismatch: dict[str, str] = {}
        self.output_error: str | None = None
        self.output = ErrorStats()
        self.output_marked = ErrorStats()
        """The same output read in the marked copy (what the per-layer rows see)."""
        self.missing_feeds = 0

    def unrunnable(self) -> str | None:
        """Why the artifact cannot run the first probe batch (e.g. a batch axis baked
        to 1), or None. The per-layer comparison needs whole batches."""
        if not self.feeds:
            return None
        try:
            self.plain.run([self.output_name], self.feeds[0])
        except Exception as exc:  # onnxruntime raises its own error types
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return f"{type(exc).__name__}: {first}"
        return None

    def run_batch(self, index: int) -> None:
        """Run both sessions on batch ``index``'s feeds, keeping this batch's values only."""
        if index >= len(self.feeds):
            self.missing_feeds += 1
            self.values, self.final = {}, None
            return
        feeds = self.feeds[index]
        names = [o.name for o in self.session.get_outputs()]
        self.values = dict(zip(names, self.session.run(names, feeds), strict=True))
        self.final = self.plain.run([self.output_name], feeds)[0]

    def compare_layer(self, key: str, outputs: list[torch.Tensor]) -> None:
        """Fold the artifact's tensor of layer ``key`` against the torch fp32 outputs."""
        import torch

        value = self.mapped.get(key)
        if value is None or value not in self.values:
            return
        array = self.values[value]
        matches = [t for t in outputs if tuple(t.shape) == tuple(array.shape)]
        if not matches:
            shapes = [tuple(t.shape) for t in outputs]
            self.mismatch[key] = (
                f"ONNX value {value!r} has shape {array.shape}, torch output {shapes}"
            )
            return
        candidate = torch.from_numpy(np.ascontiguousarray(array))
        self.layers.setdefault(key, ErrorStats()).update(matches[0], candidate)

    def compare_output(self, reference: torch.Tensor) -> None:
        import torch

        if self.final is None:
            return
        if self.output_transform is not None:
            served = self.output_transform(reference.detach().cpu().numpy())
            reference = torch.from_numpy(np.ascontiguousarray(served)).to(reference.dtype)
        if tuple(self.final.shape) != tuple(reference.shape):
            self.output_error = (
                f"artifact output {self.output_name!r} has shape {list(self.final.shape)}, the "
                f"torch model's {list(reference.shape)}"
            )
            return
        self.output.update(reference, torch.from_numpy(np.ascontiguousarray(self.final)))
        marked = self.values.get(self.output_name)
        if marked is not None and tuple(marked.shape) == tuple(reference.shape):
            self.output_marked.update(reference, torch.from_numpy(np.ascontiguousarray(marked)))

    def finish_batch(self) -> None:
        self.values, self.final = {}, None

    def budget(self, depth: int, k_out: float, fp32_budget: float) -> float:
        """Cumulative budget of a tensor ``depth`` parameterised layers deep.

        A low-precision artifact gets the output-budget formula of its dtype; an
        fp32 artifact differs from torch only by summation order and op
        implementations, so it gets the flat ``fp32_budget``.
        """
        if self.dtype == "float32":
            return fp32_budget
        return output_budget(self.dtype, k_out, depth)

    def report(self, run: Any, k_out: float, fp32_budget: float) -> OnnxReport:
        """Rows per compared layer (execution order), unmapped layers with reasons, output."""
        u = unit_roundoff(self.dtype)
        rows: list[OnnxRow] = []
        unmapped: list[OnnxUnmapped] = []
        for record in run.layers:
            stats = self.layers.get(record.key)
            if stats is None:
                reason = self.mismatch.get(record.key) or self.unmapped.get(record.key)
                if reason is None:
                    reason = (
                        "no graph node carries this module's scope "
                        "(folded, fused or removed at export)"
                        if record.key not in self.mapped
                        else "its value was not produced by the session"
                    )
                unmapped.append(OnnxUnmapped(layer=record.key, reason=reason))
                continue
            budget = self.budget(max(record.depth, 1), k_out, fp32_budget)
            nonfinite = stats.nan + stats.inf
            rows.append(
                OnnxRow(
                    index=record.index,
                    layer=record.key,
                    type=record.info.type,
                    onnx_value=self.mapped[record.key],
                    **stats.summary("onnx"),
                    budget=budget,
                    over_budget=nonfinite > 0 or not stats.rel_l2 <= budget,
                )
            )
        first = next((r for r in rows if r.over_budget), None)
        out = self.output
        out_budget = self.budget(run.depth, k_out, fp32_budget)
        output_row = next(
            (r.layer for r in rows if r.onnx_value in (self.output_name, self.output_value)),
            None,
        )
        return OnnxReport(
            path=str(self.path),
            dtype=self.dtype,
            unit_roundoff=u,
            output_name=self.output_name,
            rows=rows,
            unmapped=unmapped,
            unscoped_nodes=self.unscoped,
            missing_feeds=self.missing_feeds,
            output_error=self.output_error,
            first_divergent=None
            if first is None
            else OnnxFirstDivergent(
                layer=first.layer, index=first.index, rel_l2=first.onnx_rel_l2, budget=first.budget
            ),
            output_rel_l2=out.rel_l2,
            output_max_abs=out.max_abs,
            output_nan=out.nan,
            output_inf=out.inf,
            output_budget=out_budget,
            output_over_budget=out.nan + out.inf > 0 or not out.rel_l2 <= out_budget,
            marked_output_rel_l2=self.output_marked.rel_l2,
            marked_output_row=output_row,
            marking_note=self._marking_note(output_row),
        )

    def _marking_note(self, output_row: str | None) -> str | None:
        """Why the output's per-layer reading differs from the headline, when it does."""
        plain, marked = self.output.rel_l2, self.output_marked.rel_l2
        seen = self.output_marked.n + self.output_marked.nan + self.output_marked.inf
        if not seen or not self.layers:
            return None
        same = plain == marked or (
            np.isfinite(plain) and np.isfinite(marked) and abs(plain - marked) <= 0.01 * plain
        )
        if same:
            return None
        where = f" (the row of {output_row!r})" if output_row else ""
        return (
            f"ONNX output {self.output_name!r}: rel L2 {plain:.3g} in the artifact as served "
            f"(judged) and {marked:.3g} in the copy with {len(self.mapped)} intermediate tensors "
            f"marked as graph outputs{where}. Marking a tensor as an output keeps ONNX Runtime "
            "from fusing nodes across it, so the marked copy runs other kernels; the per-layer "
            "rows are read from that copy"
        )

"""The artifact-format zoo: the demo policy shipped as TorchScript and as a torch.export program.

Each entry writes one artifact for the clean demo checkpoint (or for a checkpoint 1e-4 away: a
stale artifact) into ``out_dir`` and returns the config overrides that gate it. The clean twins
must pass every policy check; each fault must fail ``check`` with the finding ``kind`` (the kinds
the ONNX zoo's faults of the same nature record).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policy_zoo_builders import _inference_model, _perturbed, _state

Overrides = dict[str, Any]


def _model(clean: Path, *, stale: bool, train: bool, random: bool = False) -> Any:
    state = _state(clean)
    cls = None
    if random:
        from paritygate.demo.faults import StochasticDepthInference

        cls = StochasticDepthInference
    model = _inference_model(_perturbed(state) if stale else state, cls)
    return model.train() if train else model.eval()


def torchscript(*, stale: bool = False, train: bool = False, script: bool = False,
                random: bool = False) -> Callable[[Path, Path], Overrides]:
    """``torch.jit.trace`` (or ``script``) of the inference model, saved with torch.jit.save."""

    def build(clean: Path, out: Path) -> Overrides:
        import torch

        out.mkdir(parents=True, exist_ok=True)
        model = _model(clean, stale=stale, train=train, random=random)
        with torch.no_grad():
            module = (torch.jit.script(model) if script else
                      torch.jit.trace(model, torch.zeros(4, 8), check_trace=False))
        path = out / "policy.pt"
        torch.jit.save(module, str(path))
        return {"policy": {"artifact": str(path)}}

    return build


def exported(*, stale: bool = False, train: bool = False, random: bool = False
             ) -> Callable[[Path, Path], Overrides]:
    """``torch.export.export`` of the inference model (dynamic batch), saved as ``.pt2``."""

    def build(clean: Path, out: Path) -> Overrides:
        import torch

        out.mkdir(parents=True, exist_ok=True)
        model = _model(clean, stale=stale, train=train, random=random)
        batch = torch.export.Dim("batch", min=1, max=4096)
        program = torch.export.export(model, (torch.zeros(4, 8),),
                                      dynamic_shapes=({0: batch},))
        path = out / "policy.pt2"
        torch.export.save(program, str(path))
        return {"policy": {"artifact": str(path)}, "allow_pickle": True}

    return build


@dataclass(frozen=True)
class FormatEntry:
    """One artifact: its builder and, for a fault, the check and finding kind that catch it."""

    id: str
    summary: str
    build: Callable[[Path, Path], Overrides]
    check: str | None = None
    kind: str | None = None


ENTRIES = (
    FormatEntry("torchscript_clean", "traced TorchScript of the clean checkpoint", torchscript()),
    FormatEntry("torchscript_scripted_clean", "torch.jit.script of the clean checkpoint",
                torchscript(script=True)),
    FormatEntry("pt2_clean", "torch.export program of the clean checkpoint", exported()),
    FormatEntry("torchscript_stale", "traced from a checkpoint 1e-4 relative away",
                torchscript(stale=True), "export_integrity", "not_from_checkpoint"),
    FormatEntry("pt2_stale", "exported from a checkpoint 1e-4 relative away",
                exported(stale=True), "export_integrity", "not_from_checkpoint"),
    FormatEntry("torchscript_train_dropout", "traced in training mode: dropout stays on",
                torchscript(train=True), "dropout_off", "random_operators"),
    FormatEntry("torchscript_train_bn", "traced in training mode: BatchNorm uses batch stats",
                torchscript(train=True), "batchnorm_export", "training_mode_export"),
    FormatEntry("torchscript_scripted_train", "scripted and saved in training mode (flags set)",
                torchscript(train=True, script=True), "dropout_off", "random_operators"),
    FormatEntry("pt2_train_dropout", "exported in training mode: dropout stays on",
                exported(train=True), "dropout_off", "random_operators"),
    FormatEntry("pt2_train_bn", "exported in training mode: BatchNorm uses batch stats",
                exported(train=True), "batchnorm_export", "training_mode_export"),
    FormatEntry("torchscript_random_op", "stochastic depth (torch.rand) traced into the graph",
                torchscript(random=True), "dropout_off", "random_operators"),
    FormatEntry("pt2_random_op", "stochastic depth (torch.rand) exported into the program",
                exported(random=True), "dropout_off", "random_operators"),
)
ENTRIES_BY_ID = {e.id: e for e in ENTRIES}


def scripted_inference_model(**kwargs: Any) -> Any:
    """The demo inference model as a TorchScript module (what a user points the inference
    factory at when the serving code loads TorchScript): its layers take no hooks."""
    import torch

    from paritygate.demo.policy import InferencePolicy

    return torch.jit.script(InferencePolicy(**kwargs).eval())


def traced_from(config: Any, out: Path) -> Path:
    """The subject of a gate ``config`` as a traced TorchScript file: its inference model as
    the gate builds it from the checkpoint (heads removed, eval), traced on the probe feeds in
    the declared input order (a recurrent policy's state inputs included)."""
    import torch

    from paritygate.engines.torch_engine import ForwardAdapter
    from paritygate.gate import Gate

    ctx = Gate(config).context
    names, call = ctx.input_names, ctx.spec.call
    model = ctx.heads_removed_model
    if call != "positional":
        model = ForwardAdapter(model, names, call).eval()
    example = tuple(torch.from_numpy(ctx.feeds[n][:4].copy()) for n in names)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "policy.pt"
    with torch.no_grad():
        torch.jit.save(torch.jit.trace(model, example, check_trace=False), str(path))
    return path


def traced_batch_one() -> Callable[[Path, Path], Overrides]:
    """A trace on one row that reads the batch size as a Python int: fixed to batch 1."""

    def build(clean: Path, out: Path) -> Overrides:
        import torch
        from normaliser_subject import BatchOne

        out.mkdir(parents=True, exist_ok=True)
        model = BatchOne(_model(clean, stale=False, train=False)).eval()
        with torch.no_grad():
            module = torch.jit.trace(model, torch.zeros(1, 8), check_trace=False)
        path = out / "policy.pt"
        torch.jit.save(module, str(path))
        return {"policy": {"artifact": str(path)}}

    return build


def exported_batch_one() -> Callable[[Path, Path], Overrides]:
    """``torch.export`` on one row without dynamic shapes: the batch axis is the constant 1."""

    def build(clean: Path, out: Path) -> Overrides:
        import torch

        out.mkdir(parents=True, exist_ok=True)
        model = _model(clean, stale=False, train=False)
        program = torch.export.export(model, (torch.zeros(1, 8),))
        path = out / "policy.pt2"
        torch.export.save(program, str(path))
        return {"policy": {"artifact": str(path)}, "allow_pickle": True}

    return build


BATCH_ONE = (
    FormatEntry("torchscript_batch_one", "traced on one row, the batch size read as an int",
                traced_batch_one(), "export_integrity", "batch_axis_baked"),
    FormatEntry("pt2_batch_one", "exported on one row without a dynamic batch axis",
                exported_batch_one(), "export_integrity", "batch_axis_baked"),
)
"""A batch axis fixed to 1 is one finding in every format (TorchScript, torch.export)."""

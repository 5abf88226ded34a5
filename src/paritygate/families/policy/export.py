"""ONNX export of an inference policy, with a manifest proving where it came from.

``manifest.json`` records the sha256 of the source checkpoint and of the
artifact, the exporter, opset and library versions; ``export_integrity`` checks
it so a stale artifact built from another checkpoint cannot ship.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paritygate.errors import InputError
from paritygate.files import atomic_write_bytes, atomic_write_text
from paritygate.reading_text import read_json

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor, nn

    from paritygate.config import GateConfig
    from paritygate.families.policy.loading import LoadReport
    from paritygate.metrics.tiers import Limits

EXPORTER_NOISE_LOGGERS: tuple[str, ...] = (
    # one warning per optional torchvision op the exporter cannot register
    "torch.onnx._internal.exporter._registration",
    # "Evaluation failed: cannot reshape array ...": constant folding tried an op on a
    # symbolic (dynamic batch) shape, gave up and kept the node; the export is unaffected
    "onnxscript.optimizer._constant_folding",
)


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Silence the exporter's known-harmless log lines and warnings for one export only."""
    loggers = [logging.getLogger(name) for name in EXPORTER_NOISE_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def export_onnx(
    model: nn.Module,
    example: Tensor | tuple[Tensor, ...],
    path: Path,
    *,
    input_name: str | None = None,
    output_names: list[str],
    opset: int = 18,
    input_names: list[str] | None = None,
) -> Path:
    """Export ``model`` (eval mode) with a dynamic batch axis, through torch's dynamo exporter.

    ``example`` is one tensor, or a tuple of tensors for the positional inputs
    ``input_names``. The file is written atomically: the export goes to a temp folder first.
    """
    import torch

    model.eval()
    names = list(input_names or [input_name or "obs"])
    examples = example if isinstance(example, tuple) else (example,)
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    with tempfile.TemporaryDirectory() as tmp, quiet_exporter():
        tmp_path = Path(tmp) / "model.onnx"
        program = torch.onnx.export(
            model,
            examples,
            input_names=names,
            output_names=output_names,
            opset_version=opset,
            dynamo=True,
            dynamic_shapes=_dynamic_shapes(model, examples, batch),
            external_data=False,
            verbose=False,
        )
        assert program is not None  # dynamo=True always returns the program
        program.save(str(tmp_path))
        atomic_write_bytes(path, tmp_path.read_bytes())
    return path


def _dynamic_shapes(model: nn.Module, examples: tuple[Tensor, ...], batch: object
                    ) -> tuple[object, ...]:
    """A dynamic batch axis for every input; a ``*inputs`` forward (the adapter of a keyword
    or dict forward) takes them as one tuple."""
    from paritygate.engines.torch_engine import ForwardAdapter

    axes = tuple({0: batch} for _ in examples)
    return (axes,) if isinstance(model, ForwardAdapter) else axes


def export_policy(
    config: GateConfig,
    model: nn.Module,
    report: LoadReport,
    ckpt: Path,
    probes: Mapping[str, np.ndarray],
    out: Path,
) -> Path:
    """Export the heads-removed model the checks inspect (loaded, ``report`` its load) to
    ``out/policy.onnx`` with its manifest; the artifact path."""
    import torch

    spec = config.policy
    assert spec is not None
    if report.missing or report.shape_mismatch:
        raise InputError(
            ckpt,
            "state_dict",
            "cannot export: the inference model does not load "
            f"from the checkpoint (missing {report.missing[:3]}, shape "
            f"{[m[0] for m in report.shape_mismatch[:3]]})",
        )
    from paritygate.engines.torch_engine import ForwardAdapter

    names = spec.input_names
    rows = min(2, len(probes[names[0]]))
    example = tuple(torch.from_numpy(probes[n][:rows]) for n in names)
    exported = model.eval()
    if len(names) > 1 or spec.call != "positional":
        exported = ForwardAdapter(model, names, spec.call).eval()
    try:
        artifact = export_onnx(
            exported,
            example if len(names) > 1 else example[0],
            out / "policy.onnx",
            input_names=names,
            output_names=list(spec.output_names),
            opset=spec.opset,
        )
    except Exception as exc:
        raise InputError(
            config.path, "policy.inference_factory",
            f"the ONNX export of the inference model failed: "
            f"{_first_line(exc.__cause__ or exc)} (or give "
            "the artifact in policy.artifact)") from None
    write_manifest(artifact, ckpt, opset=spec.opset)
    return artifact


def _first_line(exc: BaseException) -> str:
    """An exception's type and first non-empty line, without terminal colour codes."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", str(exc))
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {line[:300]}"


def write_manifest(
    artifact: Path, checkpoint: Path, *, opset: int, extra: Mapping[str, object] | None = None
) -> Path:
    """Write ``manifest.json`` beside ``artifact``."""
    from paritygate.provenance import environment, sha256_file

    manifest = {
        "artifact": artifact.name,
        "artifact_sha256": sha256_file(artifact),
        "checkpoint": os.path.relpath(checkpoint, artifact.parent),
        "checkpoint_sha256": sha256_file(checkpoint),
        "exporter": "torch.onnx.export(dynamo=True)",
        "opset": opset,
        "versions": environment(),
        **(extra or {}),
    }
    path = artifact.parent / "manifest.json"
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(path: Path) -> dict[str, Any] | None:

    if not path.exists():
        return None
    data = read_json(path, "policy.manifest", what="manifest")
    if not isinstance(data, dict):
        raise InputError(
            path, "policy.manifest", f"manifest is not a JSON object (got {type(data).__name__})"
        )
    return data


@dataclass(frozen=True)
class ArtifactPrecision:
    """The precision an artifact stores its weights in, as declared and as found.

    ``converted`` counts, by dtype, the weight initializers that are checkpoint tensors cast
    to that dtype (:func:`.initializers.match_initializers`); ``comparable`` is the number of
    initializers compared. The artifact *stores* a dtype when at least half of them are
    converted to it.
    """

    declared: str
    converted: Mapping[str, int]
    comparable: int

    @property
    def stored(self) -> str:
        if self.converted:
            dtype, n = max(self.converted.items(), key=lambda kv: kv[1])
            if n * 2 >= self.comparable:
                return dtype
        return "float32"

    @property
    def undeclared(self) -> bool:
        """A conversion the config does not declare (``policy.artifact_dtype``)."""
        return self.stored != self.declared

    def tier(self) -> tuple[str, dict[str, float]] | None:
        """The precision tier the artifact's outputs are judged by: training float32 against
        the declared dtype (``None`` for a float32 artifact: the fp32 defaults apply)."""
        from paritygate.metrics.tiers import tier_for

        return None if self.declared == "float32" else tier_for("float32", self.declared)

    def share(self) -> str:
        return f"{self.converted.get(self.stored, 0)}/{self.comparable}"


def artifact_limits(
    precision: ArtifactPrecision,
    thresholds: Mapping[str, float | None],
    output_keys: Sequence[str],
    overrides: Collection[str] = (),
    *,
    gaussian: bool = False,
) -> tuple[dict[str, float | None], str | None]:
    """``thresholds`` for the artifact's declared precision, and a note naming the tier
    (``None`` for a float32 artifact): :func:`paritygate.metrics.tiers.tier_thresholds`, the
    rule every served-copy comparison uses. The fp32 torch-vs-ONNX limits named in
    ``output_keys`` take the tier's ``max_abs_diff``; ``logits_agreement``'s distribution limits
    (and, with ``gaussian``, a Gaussian policy's) take the tier's own; names in ``overrides``
    (set in the config) keep their value."""
    from paritygate.metrics.tiers import GAUSSIAN_LIMITS, judged_limits, tier_thresholds

    def judge(defaults: Mapping[str, float | None], user_set: Collection[str],
              names: Collection[str]) -> Limits:
        return judged_limits(precision.tier(), defaults, user_set, names=names,
                             aliases={name: "max_abs_diff" for name in output_keys},
                             declared_by=f"policy.artifact_dtype {precision.declared}")

    limits, note = tier_thresholds(
        judge, thresholds, overrides, output_keys=output_keys,
        extra=GAUSSIAN_LIMITS if gaussian else (),
        shown=[*output_keys, *(GAUSSIAN_LIMITS if gaussian else ("kl_max", "tv_max"))])
    return dict(limits), note

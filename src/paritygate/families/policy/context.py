"""The torch-policy family: load both models, the probes and the ONNX artifact once.

Building the context validates every input (exit code 2 on failure): the
factories import and build, the checkpoint reads, the probes load, a configured
artifact opens and its input matches the probes. Without a configured artifact
the first check that reads one exports it (so a run that reads none never
exports). Checks then share the loaded pieces and the cached forward passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.errors import InputError, keyed
from paritygate.families.policy.loading import LoadReport, load_into
from paritygate.families.policy.probes import (
    finite_rows,
    load_probes,
    preprocess,
    preprocessors,
)
from paritygate.imports import import_callable

if TYPE_CHECKING:
    from paritygate.check import Thresholds
    from paritygate.config import GateConfig
    from paritygate.families.policy.config import PolicySpec


@dataclass
class PolicyContext:
    """Everything the policy checks share, loaded once."""

    config: GateConfig
    spec: PolicySpec
    checkpoint_path: Path
    checkpoint_sha256: str
    state: dict[str, Any]
    training_model: Any
    inference_model: Any
    training_load: LoadReport
    inference_load: LoadReport
    raw_probes: np.ndarray
    probes: np.ndarray
    """Model-input probes: the raw rows without NaN/Inf, preprocessed for training."""
    given_artifact: Path | None
    """The configured artifact (opened and validated while building), or ``None``: then
    the first check that needs an artifact exports one into ``export_dir``."""
    export_dir: Path
    training_preprocess: Any = None
    serving_preprocess: Any = None
    family: str = "policy"
    exported_on_the_fly: bool = False
    probe_rows_dropped: int = 0
    """Raw probe rows holding NaN/Inf, left out of the model checks (preprocessing sees them)."""
    state_dict_source: str | None = None
    """The key of a training checkpoint the state dict was read from (``None``: the file is
    the state dict)."""
    state_dict_key_reason: str = ""
    """Why that key: set by ``policy.state_dict_key`` or found under a common name."""

    @cached_property
    def candidate(self) -> Any:
        """The ONNX Runtime engine over the artifact (one session).

        Without a configured artifact this exports one first, so a run whose
        selected checks never touch the artifact (e.g. only ``precision_per_layer``
        with ``precision.onnx_compare: false``) never exports.
        """
        if self.given_artifact is not None:
            return open_artifact(self.given_artifact, self.spec, self.probes)
        from paritygate.families.policy.export import export_policy

        artifact = export_policy(
            self.config,
            self.inference_model,
            self.inference_load,
            self.checkpoint_path,
            self.probes,
            self.export_dir,
        )
        self.exported_on_the_fly = True
        return open_artifact(artifact, self.spec, self.probes)

    @property
    def artifact_path(self) -> Path:
        """The artifact file (exported on first use when none is configured)."""
        return Path(self.candidate.path)

    @property
    def manifest_path(self) -> Path:
        if self.spec.manifest:
            return self.config.resolve(self.spec.manifest)
        return self.artifact_path.parent / "manifest.json"

    def note_probes(self, m: Any) -> None:
        """Tell a check's measurement how many probe rows the model checks left out, and why."""
        if self.probe_rows_dropped:
            n, total = self.probe_rows_dropped, len(self.raw_probes)
            m.metric("probe_rows_dropped", n, bad="none", ratchet=False)
            m.note(
                f"{n} of {total} probe rows hold NaN/Inf and were left out of the model "
                f"inputs ({total - n} rows used); preprocessing_parity compares them"
            )

    @property
    def numerics(self) -> dict[str, str]:
        """Settings that move the numbers by design, recorded with a blessed baseline."""
        return {"artifact dtype": self.spec.artifact_dtype}

    @cached_property
    def probes_sha256(self) -> str:
        """Digest of the raw probe array (values, shape and dtype)."""
        import hashlib

        raw = np.ascontiguousarray(self.raw_probes)
        h = hashlib.sha256(f"{raw.dtype}{raw.shape}".encode())
        h.update(raw.tobytes())
        return h.hexdigest()

    @property
    def input_name(self) -> str:
        return self.spec.input_name

    @property
    def output_name(self) -> str:
        return self.spec.output_names[0]

    def new_inference_model(self) -> Any:
        factory = import_callable(
            self.spec.inference_factory, self.config.path, "policy.inference_factory"
        )
        return factory(**factory_kwargs(self.config, self.spec))

    @cached_property
    def reference(self) -> Any:
        from paritygate.engines.torch_engine import TorchEngine

        return TorchEngine(
            self.training_model,
            input_name=self.input_name,
            output_name=self.output_name,
            select=self.spec.policy_output,
            name="torch training model (eval, fp32)",
        )

    @cached_property
    def reference_outputs(self) -> np.ndarray:
        """Training model's policy output on the probes, (N, A); as the deterministic env
        action when the artifact serves actions (``distribution.serving_output: action``)."""
        return self.as_served(self.reference.infer({self.input_name: self.probes})[
            self.output_name])

    def reference_gaussian(self) -> Any:
        """The training model's Gaussian on the probes (``policy.distribution`` set):
        :class:`paritygate.metrics.gaussian.Gaussian`."""
        from paritygate.families.policy.distribution import reference_gaussian

        assert self.spec.distribution is not None
        return reference_gaussian(self, self.spec.distribution)

    def candidate_log_std(self) -> np.ndarray | None:
        """The artifact's log-std on the probes, or ``None`` when it serves none."""
        from paritygate.families.policy.distribution import candidate_log_std

        assert self.spec.distribution is not None
        return candidate_log_std(self, self.spec.distribution)

    def deterministic_action(self, output: np.ndarray, *, served: bool = False) -> np.ndarray:
        """:func:`paritygate.families.policy.distribution.deterministic_action` of this spec."""
        from paritygate.families.policy.distribution import deterministic_action

        return deterministic_action(self.spec, output, served=served)

    def as_served(self, training_output: np.ndarray) -> np.ndarray:
        """The training policy output in the artifact's terms: itself, or its deterministic env
        action when the artifact serves actions (``distribution.serving_output: action``)."""
        dist = self.spec.distribution
        if dist is None or dist.serving_output != "action":
            return training_output
        from paritygate.families.policy.distribution import deterministic_action

        return deterministic_action(self.spec, training_output).astype(training_output.dtype)

    @cached_property
    def inference_engine(self) -> Any:
        """The serving torch model (heads removed, eval) as an engine."""
        from paritygate.engines.torch_engine import TorchEngine

        return TorchEngine(
            self.inference_model,
            input_name=self.input_name,
            output_name=self.output_name,
            select=0,
            name="torch inference model",
        )

    @cached_property
    def inference_outputs(self) -> np.ndarray:
        """The inference model built from the checkpoint, on the probes, (N, A)."""
        return self.inference_engine.infer({self.input_name: self.probes})[self.output_name]

    @cached_property
    def rollout_env(self) -> Any:
        """The ``policy.rollout`` environment (:class:`paritygate.families.policy.rollout.
        RolloutEnv`), built and checked against the policy on first use; ``None`` without
        a rollout section."""
        if self.spec.rollout is None:
            return None
        from paritygate.families.policy.rollout import RolloutEnv

        return RolloutEnv(self, self.spec.rollout)

    @cached_property
    def rollouts(self) -> Any:
        """The ``policy.rollout`` episodes stepped by the training path and by the serving
        path (:class:`paritygate.families.policy.rollout.Rollouts`), or ``None``."""
        from paritygate.families.policy.rollout import run_rollouts

        return run_rollouts(self)

    def rollout_step_diagnosis(self, raw: np.ndarray) -> dict[str, float]:
        """Where the paths part at one raw observation: model inputs (preprocessing) or
        outputs on the same input (artifact); see :func:`~paritygate.families.policy.rollout.
        step_diagnosis`."""
        from paritygate.families.policy.rollout import step_diagnosis

        return step_diagnosis(self, raw)

    @cached_property
    def candidate_outputs(self) -> dict[str, np.ndarray]:
        return self.candidate.infer({self.input_name: self.probes})

    def manifest(self) -> dict[str, Any] | None:
        """The artifact's ``manifest.json`` as a mapping, or ``None`` when there is none."""
        from paritygate.families.policy.export import read_manifest

        return read_manifest(self.manifest_path)

    @cached_property
    def onnx_model(self) -> Any:
        import onnx

        return onnx.load(str(self.artifact_path))

    @cached_property
    def initializer_match(self) -> dict[str, Any]:
        """The artifact's weight initializers matched against the checkpoint's tensors, by
        value and by role (the inference model's parameter of the same name)."""
        from paritygate.families.policy.export import match_initializers

        return match_initializers(self.onnx_model, self.state,
                                  self.inference_model.state_dict())

    @cached_property
    def artifact_precision(self) -> Any:
        """The artifact's weight precision, declared (``policy.artifact_dtype``) and found
        (:class:`paritygate.families.policy.export.ArtifactPrecision`)."""
        from paritygate.families.policy.export import ArtifactPrecision

        match = self.initializer_match
        return ArtifactPrecision(self.spec.artifact_dtype, match["converted"],
                                 match["comparable"])

    def artifact_limits(
        self, thresholds: Thresholds, fp32_keys: Sequence[str]
    ) -> tuple[dict[str, float | None], str | None]:
        """A check's thresholds for this artifact's declared precision, and a note naming
        their tier (:func:`paritygate.families.policy.export.artifact_limits`); values the
        config sets for the check win."""
        from paritygate.families.policy.export import artifact_limits

        return artifact_limits(self.artifact_precision, thresholds, fp32_keys,
                               thresholds.overrides)

    def precision_subject(self) -> Any:
        import torch

        from paritygate.engines.torch_engine import select_output
        from paritygate.precision.subject import PrecisionSubject

        def build() -> Any:
            model = self.new_inference_model()
            load_into(model, self.state, ignore_prefixes=tuple(self.spec.training_heads))
            return model.eval()

        x = torch.from_numpy(self.probes)
        compare = self.config.precision.onnx_compare
        return PrecisionSubject(
            name=self.config.name,
            build_model=build,
            batches=[((x,), {})],
            select_output=lambda out: select_output(out, 0),
            # touching artifact_path exports one when none is configured: only when asked
            onnx_path=self.artifact_path if compare else None,
            onnx_feeds=[{self.input_name: self.probes}],
            onnx_output_name=self.output_name,
        )


def factory_kwargs(config: GateConfig, spec: PolicySpec) -> dict[str, Any]:
    """``factory_kwargs`` with the ``factory_path_kwargs`` resolved relative to the config."""
    kwargs = dict(spec.factory_kwargs)
    for name in spec.factory_path_kwargs:
        kwargs[name] = str(config.resolve(kwargs[name]))
    return kwargs


def _build_model(factory_spec: str, key: str, config: GateConfig, spec: PolicySpec) -> Any:
    factory = import_callable(factory_spec, config.path, key)
    try:
        model = factory(**factory_kwargs(config, spec))
    except Exception as exc:
        raise InputError(config.path, key, f"factory failed: {type(exc).__name__}: {exc}") from None
    if not hasattr(model, "state_dict"):
        raise InputError(config.path, key, "factory did not return a torch.nn.Module")
    return model


def _describe(output: Any) -> str:
    if isinstance(output, (tuple, list)):
        return f"a {type(output).__name__} of {len(output)}"
    if hasattr(output, "keys"):
        return f"a {type(output).__name__} with keys {list(output.keys())}"
    return f"a {type(output).__name__}"


def check_policy_output(config: GateConfig, spec: PolicySpec, model: Any, probes: Any) -> None:
    """``policy.policy_output`` must pick a tensor out of the training forward's result."""
    import torch

    from paritygate.engines.torch_engine import select_output

    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        try:
            output = model(torch.from_numpy(probes[: min(2, len(probes))]))
        except Exception:  # a forward that fails is the checks' to report
            return
        try:
            picked = select_output(output, spec.policy_output)
        except (KeyError, IndexError, TypeError, AttributeError):
            picked = None
    if not isinstance(picked, torch.Tensor):
        raise InputError(
            config.path,
            "policy.policy_output",
            f"{spec.policy_output!r} does not pick a tensor: the training forward returns "
            f"{_describe(output)}",
        )


def check_artifact_inputs(
    session: Any,
    ctx_artifact: Path,
    input_name: str,
    probes: np.ndarray,
    output_name: str | None = None,
) -> None:
    """The artifact's first input must be ``input_name`` with the probes' feature shape;
    ``output_name`` (the declared policy output), when given, must be one of its outputs."""
    outputs = [o.name for o in session.get_outputs()]
    if output_name is not None and output_name not in outputs:
        raise InputError(
            ctx_artifact,
            "policy.output_names",
            f"artifact has no output {output_name!r} (its outputs: {outputs})",
        )
    inputs = session.get_inputs()
    names = [i.name for i in inputs]
    if input_name not in names:
        raise InputError(
            ctx_artifact, "inputs", f"artifact inputs {names} do not include {input_name!r}"
        )
    shape = next(i.shape for i in inputs if i.name == input_name)
    if len(shape) != probes.ndim:
        raise InputError(
            ctx_artifact,
            f"inputs.{input_name}",
            f"rank {len(shape)} does not match the probes' rank {probes.ndim}",
        )
    for axis, (dim, want) in enumerate(zip(shape[1:], probes.shape[1:], strict=False), start=1):
        if isinstance(dim, int) and dim != want:
            raise InputError(
                ctx_artifact,
                f"inputs.{input_name}",
                f"axis {axis} is {dim} but the model input has {want}",
            )



def _stamp(path: Path) -> tuple[int, int, int]:
    """What changes when a file is rewritten: inode, size and modification time."""
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns

def build_policy_context(
    config: GateConfig, *, export_dir: Path | None = None, force_export: bool = False
) -> PolicyContext:
    """Load and validate every input of a policy gate."""
    import torch

    from paritygate.checkpoints import load_checkpoint_state, read_checkpoint

    spec = config.policy
    assert spec is not None
    torch.manual_seed(config.seed)
    ckpt = config.resolve(spec.checkpoint)
    with keyed("policy.checkpoint"):
        data, sha = read_checkpoint(ckpt)  # one read: the digest and the tensors
        stat_before = _stamp(ckpt)
        state, source = load_checkpoint_state(ckpt, allow_pickle=config.allow_pickle, data=data,
                                              state_dict_key=spec.state_dict_key)
        del data
    training = _build_model(spec.training_factory, "policy.training_factory", config, spec)
    inference = _build_model(spec.inference_factory, "policy.inference_factory", config, spec)
    training_load = load_into(training, state)
    inference_load = load_into(inference, state, ignore_prefixes=tuple(spec.training_heads))
    training.eval()
    inference.eval()

    raw = load_probes(config, spec)
    finite_raw, dropped = finite_rows(config, spec, raw)
    train_pre, serve_pre = preprocessors(config, spec)
    probes = finite_raw if train_pre is None else preprocess(config, spec, train_pre, finite_raw)
    if not np.all(np.isfinite(probes)):
        raise InputError(
            config.path,
            "policy.preprocessing.training",
            "training preprocessing turns finite probes into NaN/Inf",
        )

    check_policy_output(config, spec, training, probes)

    given = None
    if spec.artifact is not None and not force_export:
        given = config.resolve(spec.artifact)
        if not given.exists():
            raise InputError(given, "policy.artifact", "artifact not found")
    if _stamp(ckpt) != stat_before:
        raise InputError(ckpt, None, "checkpoint changed while the gate was reading it")
    ctx = PolicyContext(
        config=config,
        spec=spec,
        checkpoint_path=ckpt,
        checkpoint_sha256=sha,
        state=state,
        training_model=training,
        inference_model=inference,
        training_load=training_load,
        inference_load=inference_load,
        raw_probes=raw,
        probes=probes,
        given_artifact=given,
        export_dir=export_dir or (config.default_report_dir() / "export"),
        probe_rows_dropped=dropped,
        state_dict_source=source,
        state_dict_key_reason="set by policy.state_dict_key" if spec.state_dict_key else
        "found under a common name; set policy.state_dict_key to choose another",
        training_preprocess=train_pre,
        serving_preprocess=serve_pre,
    )
    from paritygate.families.policy.distribution import check_distribution

    check_distribution(ctx)
    if given is not None or force_export:
        ctx.candidate  # noqa: B018 - a configured artifact is validated before any check runs
    if given is not None:
        from paritygate.families.policy.export import read_manifest

        read_manifest(ctx.manifest_path)  # unreadable or not a mapping: bad input, up front
    return ctx


def open_artifact(artifact: Path, spec: PolicySpec, probes: np.ndarray) -> Any:
    """An ONNX Runtime engine over ``artifact``, its input and policy output validated."""
    from paritygate.engines.onnxruntime_engine import OnnxRuntimeEngine

    with keyed("policy.artifact"):
        candidate = OnnxRuntimeEngine(artifact)
    check_artifact_inputs(
        candidate.session, artifact, spec.input_name, probes, spec.output_names[0]
    )
    return candidate

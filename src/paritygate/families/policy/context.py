"""The torch-policy family: load both models, the probes and the ONNX artifact once.

Building the context validates every input (exit code 2 on failure): the
factories import and build, the checkpoint reads, the probes load, a configured
artifact opens and its input matches the probes. Without a configured artifact
the first check that reads one exports it (so a run that reads none never
exports). Checks then share the loaded pieces and the cached forward passes.

The context composes helpers that take explicit inputs (the spec, the reference
engine, the candidate engine, the feeds): :mod:`.sides`, :mod:`.artifact`,
:mod:`.distribution`, :mod:`.rollout`, :mod:`.initializers`, :mod:`.recurrent`,
:mod:`.precision_subject` and :mod:`.validation`; none of them imports it. The
*reference* is the training model (the training path), the *candidate* the
artifact that ships; the heads-removed torch model is what the artifact is
exported from.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import paritygate.families.policy.sides as sides
from paritygate.errors import keyed
from paritygate.families.policy.artifact import ArtifactEngine, artifact_format, open_artifact
from paritygate.families.policy.distribution import (
    candidate_log_std,
    clamped_log_std,
    deterministic_action,
    parameter_log_std,
    reference_gaussian,
)
from paritygate.families.policy.loading import LoadReport, load_into
from paritygate.families.policy.probes import Preprocessors, probes_digest, reference_inputs
from paritygate.families.policy.recurrent import initial_states, step_state
from paritygate.families.policy.sides import build_model

if TYPE_CHECKING:
    from torch import Tensor, nn

    from paritygate.check import Thresholds
    from paritygate.config import GateConfig
    from paritygate.config.policy import PolicySpec
    from paritygate.engines.artifact_graph import ArtifactGraph
    from paritygate.engines.torch_engine import TorchEngine
    from paritygate.families.policy.export import ArtifactPrecision
    from paritygate.families.policy.normaliser import SkippedNormaliser
    from paritygate.families.policy.rollout import (
        PolicyPath,
        RolloutEnv,
        Rollouts,
        StepDiagnosis,
    )
    from paritygate.families.policy.serving_log import Chunk
    from paritygate.metrics.gaussian import Gaussian
    from paritygate.precision.subject import PrecisionSubject
    from paritygate.provenance import InitializerMatch
    from paritygate.result import Measurement


@dataclass
class PolicyContext:
    """Everything the policy checks share, loaded once."""

    config: GateConfig
    spec: PolicySpec
    checkpoint_path: Path
    checkpoint_sha256: str
    state: dict[str, Tensor]
    reference_model: nn.Module
    """The training model (with heads), eval."""
    heads_removed_model: nn.Module
    """The serving torch model, training heads removed, eval: what the artifact is exported
    from (``policy.inference_factory``)."""
    reference_load: LoadReport
    heads_removed_load: LoadReport
    raw_inputs: dict[str, np.ndarray]
    """Raw probe observations, one (N, ...) array per observation input."""
    inputs: dict[str, np.ndarray]
    """Model-input probes per observation input: the raw rows without NaN/Inf (in any input),
    preprocessed for training."""
    given_artifact: Path | None
    """The configured artifact (opened and validated while building), or ``None``: then
    the first check that needs an artifact exports one into ``export_dir``."""
    export_dir: Path
    family: str = "policy"
    exported_on_the_fly: bool = False
    probe_rows_dropped: int = 0
    """Raw probe rows holding NaN/Inf, left out of the model checks (preprocessing sees them)."""
    input_preprocessors: Preprocessors | None = None
    """``{observation input: (training, serving)}`` preprocessing callables."""
    state_dict_source: str | None = None
    """The key of a training checkpoint the state dict was read from (``None``: the file is
    the state dict)."""
    state_dict_key_reason: str = ""
    """Why that key: set by ``policy.state_dict_key`` or found under a common name."""

    # -- probes and feeds ----------------------------------------------------------------------
    @property
    def raw_probes(self) -> np.ndarray:
        """The first observation input's raw probes."""
        return self.raw_inputs[self.input_name]

    @property
    def probes(self) -> np.ndarray:
        """The first observation input's model-input probes."""
        return self.inputs[self.input_name]

    @property
    def n_probes(self) -> int:
        return len(self.probes)

    @cached_property
    def feeds(self) -> dict[str, np.ndarray]:
        """Every model input for the probes: the observations, and for a recurrent policy its
        initial state and an episode-start flag of 0 (one step from the initial state)."""
        return {**self.inputs, **step_state(self.spec, self.initial_states, self.n_probes,
                                            start=False)}

    @cached_property
    def initial_states(self) -> dict[str, np.ndarray]:
        """Each recurrent state input's initial value, one row (per-row shape)."""
        return initial_states(self.config, self.spec)

    def note_probes(self, m: Measurement) -> None:
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
        return probes_digest(self.raw_inputs)

    @property
    def input_name(self) -> str:
        return self.spec.observation_inputs[0].name

    @property
    def input_names(self) -> list[str]:
        """Every model input, in call order."""
        return self.spec.input_names

    @property
    def output_name(self) -> str:
        return self.spec.output_names[0]

    def reference_inputs(self, raw: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Raw observations (per observation input) through the training preprocessing."""
        return reference_inputs(self.config, self.spec, self.input_preprocessors or {}, raw)

    # -- the candidate: the artifact -------------------------------------------------------------
    @cached_property
    def candidate(self) -> ArtifactEngine:
        """The engine over the artifact: ONNX Runtime, TorchScript or a torch.export program
        (``policy.artifact_format``, else told by the file).

        Without a configured artifact this exports one first, so a run whose
        selected checks never touch the artifact (e.g. only ``precision_per_layer``
        with ``precision.onnx_compare: false``) never exports.
        """
        if self.given_artifact is not None:
            return open_artifact(self.given_artifact, self.spec, self.feeds,
                                 allow_pickle=self.config.allow_pickle)
        from paritygate.families.policy.export import export_policy

        artifact = export_policy(self.config, self.heads_removed_model, self.heads_removed_load,
                                 self.checkpoint_path, self.feeds, self.export_dir)
        self.exported_on_the_fly = True
        return open_artifact(artifact, self.spec, self.feeds)

    @cached_property
    def candidate_outputs(self) -> dict[str, np.ndarray]:
        return self.candidate.infer(self.feeds)

    @property
    def artifact_path(self) -> Path:
        """The artifact file (exported on first use when none is configured)."""
        return Path(self.candidate.path)

    @property
    def artifact_format(self) -> str:
        """``onnx``, ``torchscript`` or ``torch_export``: the format the artifact is read as
        (an artifact exported on the fly is ONNX)."""
        return artifact_format(self.given_artifact, self.spec)

    @property
    def artifact_graph(self) -> ArtifactGraph:
        """The artifact's graph as the checks read it, whatever its format."""
        return self.candidate.graph

    @property
    def manifest_path(self) -> Path:
        if self.spec.manifest:
            return self.spec.manifest
        return self.artifact_path.parent / "manifest.json"

    def manifest(self) -> dict[str, Any] | None:
        """The artifact's ``manifest.json`` as a mapping, or ``None`` when there is none."""
        from paritygate.families.policy.export import read_manifest

        return read_manifest(self.manifest_path)

    @cached_property
    def initializer_match(self) -> InitializerMatch:
        """The artifact's weight initializers matched against the checkpoint's tensors, by
        value and by role (the heads-removed model's parameter of the same name)."""
        from paritygate.families.policy.initializers import match_initializers

        return match_initializers(self.artifact_graph.weights, self.state,
                                  self.heads_removed_model.state_dict())

    @cached_property
    def artifact_precision(self) -> ArtifactPrecision:
        """The artifact's weight precision, declared (``policy.artifact_dtype``) and found."""
        from paritygate.families.policy.export import ArtifactPrecision

        match = self.initializer_match
        return ArtifactPrecision(self.spec.artifact_dtype, match.converted, match.comparable)

    def artifact_limits(
        self, thresholds: Thresholds, fp32_keys: Sequence[str], *, gaussian: bool = False
    ) -> tuple[dict[str, float | None], str | None]:
        """A check's thresholds for this artifact's declared precision, and a note naming
        their tier (:func:`paritygate.families.policy.export.artifact_limits`); values the
        config sets for the check win."""
        from paritygate.families.policy.export import artifact_limits

        return artifact_limits(self.artifact_precision, thresholds, fp32_keys,
                               thresholds.overrides, gaussian=gaussian)

    # -- the reference: the training model -----------------------------------------------------
    @cached_property
    def reference(self) -> TorchEngine:
        return sides.reference_engine(self.reference_model, self.spec,
                                      "torch training model (eval, fp32)", extras=True)

    @cached_property
    def reference_results(self) -> dict[str, np.ndarray]:
        """The training forward on the probes, run once: its raw policy output, each recurrent
        state output and a distribution's log-std output (:data:`.sides.REFERENCE_LOG_STD`)."""
        return self.reference.infer(self.feeds)

    @cached_property
    def reference_outputs(self) -> np.ndarray:
        """Training model's policy output on the probes, (N, A); as the deterministic env
        action when the artifact serves actions (``distribution.serving_output: action``)."""
        return self.as_served(self.reference_results[self.output_name])

    def normaliser_skipped(self, served: np.ndarray, limit: float) -> SkippedNormaliser | None:
        """The training model's observation normaliser whose bypass gives ``served``
        (:func:`~paritygate.families.policy.normaliser.normaliser_skipped`), else ``None``."""
        from paritygate.families.policy.normaliser import normaliser_skipped

        def run() -> np.ndarray:
            return self.as_served(self.reference.infer(self.feeds)[self.output_name])

        return normaliser_skipped(self.reference_model, run, served, limit)

    def new_reference_engine(self, model: nn.Module, name: str = "torch training model"
                             ) -> TorchEngine:
        """A training torch model (e.g. an altered copy) as an engine: its policy output."""
        return sides.reference_engine(model, self.spec, name)

    @property
    def reference_log_std(self) -> np.ndarray:
        """The training forward's raw log-std output on the probes (``log_std: output``)."""
        return self.reference_results[sides.REFERENCE_LOG_STD]

    @cached_property
    def reference_declared_outputs(self) -> dict[str, np.ndarray]:
        """What the training model says a declared output after the first should be, on the
        probes: each recurrent state output, and the log-std of a distribution whose log_std
        is an output (the artifact's ``output_names[1]``), clamped as declared."""
        out: dict[str, np.ndarray] = {}
        if self.spec.recurrent is not None:
            result = self.reference_results
            out.update({name: result[name] for name in self.spec.state_output_names})
        dist = self.spec.gaussian
        if dist is not None and dist.log_std == "output" and len(self.spec.output_names) > 1:
            out[self.spec.output_names[1]] = clamped_log_std(self.reference_log_std, dist)
        return out

    # -- the heads-removed torch model ---------------------------------------------------------
    def new_heads_removed_model(self) -> nn.Module:
        return build_model(self.spec.inference_factory, "policy.inference_factory",
                           self.config, self.spec)

    @cached_property
    def heads_removed_engine(self) -> TorchEngine:
        """The heads-removed torch model (eval) as an engine."""
        return self.new_heads_removed_engine(self.heads_removed_model)

    def new_heads_removed_engine(self, model: nn.Module, name: str = "torch inference model"
                                 ) -> TorchEngine:
        """A heads-removed torch model as an engine: outputs in ``output_names`` order."""
        return sides.heads_removed_engine(model, self.spec, name)

    @cached_property
    def heads_removed_outputs(self) -> np.ndarray:
        """The heads-removed model built from the checkpoint, on the probes, (N, A)."""
        return self.heads_removed_engine.infer(self.feeds)[self.output_name]

    @cached_property
    def heads_removed_declared_outputs(self) -> dict[str, np.ndarray | None]:
        """The heads-removed model's output for each declared output after the first, on the
        probes (:func:`.sides.declared_outputs`)."""
        return sides.declared_outputs(self.heads_removed_model, self.spec, self.feeds)

    @cached_property
    def heads_removed_serves_action(self) -> bool:
        """Whether the heads-removed torch model returns the env action rather than the
        training policy output. With ``distribution.serving_output: action`` the artifact
        serves the action, but the heads-removed model is the training model less its heads
        (an adapter's actor returns ``u``) unless its factory applies the transform itself:
        the space its output on the probes is nearer to, the raw output or its action, says
        which."""
        if not sides.serves_action(self.spec):
            return False
        return sides.nearer_to_served(self.reference_results[self.output_name],
                                      self.reference_outputs, self.heads_removed_outputs)

    def heads_removed_terms(self, reference_output: np.ndarray) -> np.ndarray:
        """A training policy output in the heads-removed model's terms (see
        :attr:`heads_removed_serves_action`)."""
        return (self.as_served(reference_output) if self.heads_removed_serves_action
                else reference_output)

    # -- the distribution ------------------------------------------------------------------------
    def reference_gaussian(self) -> Gaussian:
        """The training model's Gaussian on the probes (``policy.distribution`` set)."""
        dist = self.spec.gaussian
        assert dist is not None
        log_std = (parameter_log_std(self.state, dist) if dist.log_std == "parameter"
                   else self.reference_log_std)
        return reference_gaussian(dist, self.reference_results[self.output_name], log_std)

    def candidate_log_std(self) -> np.ndarray | None:
        """The artifact's log-std on the probes, or ``None`` when it serves none."""
        assert self.spec.gaussian is not None
        return candidate_log_std(self.spec.gaussian, self.state, lambda: self.candidate_outputs,
                                 self.spec.output_names)

    def deterministic_action(self, output: np.ndarray, *, served: bool = False) -> np.ndarray:
        """:func:`paritygate.families.policy.distribution.deterministic_action` of this spec."""
        return deterministic_action(self.spec, output, served=served)

    def as_served(self, reference_output: np.ndarray) -> np.ndarray:
        """The training policy output in the artifact's terms (:func:`.sides.as_served`)."""
        return sides.as_served(self.spec, reference_output)

    # -- rollouts ------------------------------------------------------------------------------
    @cached_property
    def rollout_env(self) -> RolloutEnv | None:
        """The ``policy.rollout`` environment, built and checked against the policy on first
        use; ``None`` without a rollout section."""
        if self.spec.rollout is None:
            return None
        from paritygate.families.policy.rollout import RolloutEnv

        shapes = {n: tuple(v.shape[1:]) for n, v in self.raw_inputs.items()}
        return RolloutEnv(self.spec.rollout, self.config.path, self.spec, shapes,
                          lambda: int(np.prod(self.reference_outputs.shape[1:])))

    def _path(self, side: int) -> PolicyPath:
        """The reference (0: training preprocessing, training model) or candidate (1: serving
        preprocessing, artifact) path of a rollout."""
        from paritygate.families.policy.rollout import PolicyPath

        pres = {name: fns[side] for name, fns in (self.input_preprocessors or {}).items()
                if fns[side] is not None}
        engine = self.reference if side == 0 else self.candidate
        return PolicyPath(self.spec, engine, pres, self.raw_inputs, self.initial_states,
                          served=side == 1)

    @cached_property
    def rollouts(self) -> Rollouts | None:
        """The ``policy.rollout`` episodes stepped by the reference path and by the candidate
        path, or ``None`` without a rollout section."""
        from paritygate.families.policy.rollout import run_rollouts

        env = self.rollout_env
        return None if env is None else run_rollouts(env, self._path(0), self._path(1))

    def rollout_step_diagnosis(self, raw: Mapping[str, np.ndarray],
                               incoming: Mapping[str, np.ndarray] | None = None
                               ) -> StepDiagnosis:
        """Where the paths part at one raw observation (per observation input; ``incoming``:
        the reference path's recurrent inputs there): model inputs (preprocessing) or outputs
        on the same input (artifact); see :func:`.rollout.step_diagnosis`."""
        from paritygate.families.policy.rollout import step_diagnosis

        return step_diagnosis(self._path(0), self._path(1), dict(raw), incoming)

    # -- precision and the serving log -----------------------------------------------------------
    def precision_subject(self) -> PrecisionSubject:
        from paritygate.families.policy.precision_subject import precision_subject

        def build() -> nn.Module:
            model = self.new_heads_removed_model()
            load_into(model, self.state, ignore_prefixes=tuple(self.spec.training_heads))
            return model.eval()

        transform = (self.as_served if sides.serves_action(self.spec)
                     and not self.heads_removed_serves_action else None)
        # touching artifact_path exports one when none is configured: only when asked
        return precision_subject(
            self.config.name, self.spec, build, self.heads_removed_model, self.feeds,
            onnx_compare=self.config.precision.onnx_compare,
            artifact_format=self.artifact_format, artifact_path=lambda: self.artifact_path,
            output_transform=transform)

    def serving_log_chunks(self) -> Iterator[Chunk]:
        """``policy.serving_log`` read a chunk of records at a time
        (:class:`paritygate.families.policy.serving_log.Chunk`), each record checked against
        the policy's inputs and what it serves; bad records are :class:`InputError`."""
        from paritygate.families.policy.serving_log import Layout, read_chunks

        log = self.spec.serving_log
        assert log is not None
        inputs = {n: tuple(v.shape[1:]) for n, v in self.raw_inputs.items()}
        if log.served == "action" and self.spec.action_space == "discrete":
            layout = Layout(inputs, (1,), served_integer=True)
        else:
            out = self.reference_outputs[:1]
            if log.served == "action":
                out = self.deterministic_action(out)
            layout = Layout(inputs, tuple(out.shape[1:]) or (1,))
        with keyed("policy.serving_log"):
            yield from read_chunks(log.path, layout, log.chunk,
                                   log.max_records)

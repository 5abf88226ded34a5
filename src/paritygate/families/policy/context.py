"""The torch-policy family: load both models, the probes and the ONNX artifact once.

Building the context validates every input (exit code 2 on failure): the
factories import and build, the checkpoint reads, the probes load, a configured
artifact opens and its input matches the probes. Without a configured artifact
the first check that reads one exports it (so a run that reads none never
exports). Checks then share the loaded pieces and the cached forward passes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.errors import InputError, keyed
from paritygate.families.policy.loading import LoadReport, load_into
from paritygate.families.policy.probes import (
    finite_rows,
    input_preprocessors,
    load_probes,
    preprocess,
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
    input_preprocessors: dict[str, tuple[Any, Any]] | None = None
    """``{observation input: (training, serving)}`` preprocessing callables."""

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
        return {**self.inputs, **step_state(self, self.n_probes, start=False)}

    @cached_property
    def initial_states(self) -> dict[str, np.ndarray]:
        """Each recurrent state input's initial value, one row (per-row shape)."""
        return initial_states(self.config, self.spec)
    state_dict_source: str | None = None
    """The key of a training checkpoint the state dict was read from (``None``: the file is
    the state dict)."""
    state_dict_key_reason: str = ""
    """Why that key: set by ``policy.state_dict_key`` or found under a common name."""

    @cached_property
    def candidate(self) -> Any:
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

        artifact = export_policy(
            self.config,
            self.inference_model,
            self.inference_load,
            self.checkpoint_path,
            self.feeds,
            self.export_dir,
        )
        self.exported_on_the_fly = True
        return open_artifact(artifact, self.spec, self.feeds)

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

        h = hashlib.sha256()
        for i, (name, value) in enumerate(self.raw_inputs.items()):
            raw = np.ascontiguousarray(value)
            if i or len(self.raw_inputs) > 1:
                h.update(name.encode())
            h.update(f"{raw.dtype}{raw.shape}".encode())
            h.update(raw.tobytes())
        return h.hexdigest()

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
            input_names=self.input_names,
            call=self.spec.call,
            output_name=self.output_name,
            select=self.spec.policy_output,
            extra_outputs=training_extra_outputs(self.spec),
            name="torch training model (eval, fp32)",
        )

    @cached_property
    def reference_results(self) -> dict[str, np.ndarray]:
        """The training forward on the probes, run once: its raw policy output, each recurrent
        state output and a distribution's log-std output (:data:`TRAINING_LOG_STD`)."""
        return self.reference.infer(self.feeds)

    @cached_property
    def reference_outputs(self) -> np.ndarray:
        """Training model's policy output on the probes, (N, A); as the deterministic env
        action when the artifact serves actions (``distribution.serving_output: action``)."""
        return self.as_served(self.reference_results[self.output_name])

    @cached_property
    def inference_serves_action(self) -> bool:
        """Whether the heads-removed torch model returns the env action rather than the
        training policy output. With ``distribution.serving_output: action`` the artifact
        serves the action, but the inference model is the training model less its heads (an
        adapter's actor returns ``u``) unless its factory applies the transform itself: the
        space its output on the probes is nearer to, the raw output or its action, says which."""
        dist = self.spec.distribution
        if dist is None or dist.serving_output != "action":
            return False
        raw = self.reference_results[self.output_name]
        served = self.reference_outputs
        candidate = self.inference_outputs
        if candidate.shape != raw.shape:
            return True  # no raw comparison possible: judge it as served, the shapes will say

        def gap(reference: np.ndarray) -> float:
            with np.errstate(invalid="ignore"):
                return float(np.nanmax(np.abs(reference.astype(np.float64)
                                              - candidate.astype(np.float64)), initial=0.0))

        return gap(served) < gap(raw)

    def inference_terms(self, training_output: np.ndarray) -> np.ndarray:
        """A training policy output in the inference model's terms (see
        :attr:`inference_serves_action`)."""
        return self.as_served(training_output) if self.inference_serves_action else training_output

    @property
    def training_log_std(self) -> np.ndarray:
        """The training forward's raw log-std output on the probes (``log_std: output``)."""
        return self.reference_results[TRAINING_LOG_STD]

    def reference_gaussian(self) -> Any:
        """The training model's Gaussian on the probes (``policy.distribution`` set):
        :class:`paritygate.metrics.gaussian.Gaussian`."""
        from paritygate.families.policy.distribution import reference_gaussian

        assert self.spec.gaussian is not None
        return reference_gaussian(self, self.spec.gaussian)

    def candidate_log_std(self) -> np.ndarray | None:
        """The artifact's log-std on the probes, or ``None`` when it serves none."""
        from paritygate.families.policy.distribution import candidate_log_std

        assert self.spec.gaussian is not None
        return candidate_log_std(self, self.spec.gaussian)

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

        return self.new_inference_engine(self.inference_model)

    def new_training_engine(self, model: Any, name: str = "torch training model") -> Any:
        """A training torch model (e.g. an altered copy) as an engine: its policy output."""
        from paritygate.engines.torch_engine import TorchEngine

        return TorchEngine(model, input_names=self.input_names, call=self.spec.call,
                           output_name=self.output_name, select=self.spec.policy_output,
                           name=name)

    def new_inference_engine(self, model: Any, name: str = "torch inference model") -> Any:
        """A serving torch model as an engine: outputs in ``output_names`` order."""
        from paritygate.engines.torch_engine import TorchEngine

        extra = {o: i for i, o in enumerate(self.spec.output_names) if i}
        return TorchEngine(
            model,
            input_names=self.input_names,
            call=self.spec.call,
            output_name=self.output_name,
            select=0,
            extra_outputs=extra if self.spec.recurrent else None,
            name=name,
        )

    @cached_property
    def inference_outputs(self) -> np.ndarray:
        """The inference model built from the checkpoint, on the probes, (N, A)."""
        return self.inference_engine.infer(self.feeds)[self.output_name]

    @cached_property
    def inference_declared_outputs(self) -> dict[str, np.ndarray | None]:
        """The inference model's output for each declared output after the first, on the
        probes: the element of the same position in its result (the dict key of that name,
        else the tuple index); ``None`` where its result has no such element."""
        import torch

        from paritygate.engines.torch_engine import call_forward

        names = self.input_names
        tensors = {n: torch.from_numpy(np.ascontiguousarray(self.feeds[n])) for n in names}
        with torch.inference_mode():
            result = call_forward(self.inference_model, tensors, names, self.spec.call)
        out: dict[str, np.ndarray | None] = {}
        for index, name in enumerate(self.spec.output_names[1:], start=1):
            value: Any = None
            if isinstance(result, Mapping):
                value = result.get(name)
                if value is None and len(result) > index and all(
                        k not in result for k in self.spec.output_names):
                    value = list(result.values())[index]
            elif isinstance(result, (tuple, list)) and len(result) > index:
                value = result[index]
            out[name] = (value.detach().float().cpu().numpy()
                         if isinstance(value, torch.Tensor) else None)
        return out

    @cached_property
    def training_declared_outputs(self) -> dict[str, np.ndarray]:
        """What the training model says a declared output after the first should be, on the
        probes: each recurrent state output, and the log-std of a distribution whose log_std
        is an output (the artifact's ``output_names[1]``), clamped as declared."""
        out: dict[str, np.ndarray] = {}
        if self.spec.recurrent is not None:
            result = self.reference_results
            out.update({name: result[name] for name in self.spec.state_output_names})
        dist = self.spec.gaussian
        if dist is not None and dist.log_std == "output" and len(self.spec.output_names) > 1:
            from paritygate.families.policy.distribution import training_log_std

            out[self.spec.output_names[1]] = training_log_std(self, dist)
        return out

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

    def rollout_step_diagnosis(self, raw: Mapping[str, np.ndarray],
                               incoming: Mapping[str, np.ndarray] | None = None
                               ) -> dict[str, Any]:
        """Where the paths part at one raw observation (per observation input; ``incoming``:
        the training path's recurrent inputs there): model inputs (preprocessing) or outputs
        on the same input (artifact); see :func:`~paritygate.families.policy.rollout.
        step_diagnosis`."""
        from paritygate.families.policy.rollout import step_diagnosis

        return step_diagnosis(self, dict(raw), incoming)

    @cached_property
    def candidate_outputs(self) -> dict[str, np.ndarray]:
        return self.candidate.infer(self.feeds)

    def manifest(self) -> dict[str, Any] | None:
        """The artifact's ``manifest.json`` as a mapping, or ``None`` when there is none."""
        from paritygate.families.policy.export import read_manifest

        return read_manifest(self.manifest_path)

    @property
    def artifact_graph(self) -> Any:
        """The artifact's graph as the checks read it, whatever its format
        (:class:`paritygate.engines.artifact_graph.ArtifactGraph`)."""
        return self.candidate.graph

    @cached_property
    def initializer_match(self) -> dict[str, Any]:
        """The artifact's weight initializers matched against the checkpoint's tensors, by
        value and by role (the inference model's parameter of the same name)."""
        from paritygate.families.policy.export import match_initializers

        return match_initializers(self.artifact_graph.weights, self.state,
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
        self, thresholds: Thresholds, fp32_keys: Sequence[str], *, gaussian: bool = False
    ) -> tuple[dict[str, float | None], str | None]:
        """A check's thresholds for this artifact's declared precision, and a note naming
        their tier (:func:`paritygate.families.policy.export.artifact_limits`); values the
        config sets for the check win."""
        from paritygate.families.policy.export import artifact_limits

        return artifact_limits(self.artifact_precision, thresholds, fp32_keys,
                               thresholds.overrides, gaussian=gaussian)

    def precision_subject(self) -> Any:
        import torch

        from paritygate.engines.torch_engine import select_output
        from paritygate.precision.subject import PrecisionSubject

        def build() -> Any:
            model = self.new_inference_model()
            load_into(model, self.state, ignore_prefixes=tuple(self.spec.training_heads))
            return model.eval()

        from paritygate.engines.torch_engine import ForwardAdapter

        tensors = tuple(torch.from_numpy(np.ascontiguousarray(self.feeds[n]))
                        for n in self.input_names)
        compare = self.config.precision.onnx_compare
        notes: list[str] = []
        if compare and self.artifact_format != "onnx":
            compare = False
            notes.append(f"the {self.artifact_format} artifact is not compared layer by layer "
                         "(that comparison reads ONNX graphs); logits_agreement compares its "
                         "outputs")
        import torch

        if any(isinstance(mod, torch.jit.ScriptModule)
               for mod in self.inference_model.modules()):
            skip = ("the inference model is a TorchScript module, whose layers take no hooks: "
                    "set policy.inference_factory to the nn.Module and policy.artifact to the "
                    "TorchScript file")
        else:
            skip = None
        names, call = self.input_names, self.spec.call

        def build_adapted() -> Any:
            model = build()
            return model if len(names) == 1 and call == "positional" else ForwardAdapter(
                model, names, call).eval()

        return PrecisionSubject(
            name=self.config.name,
            build_model=build_adapted,
            batches=[(tensors, {})],
            select_output=lambda out: select_output(out, 0),
            # touching artifact_path exports one when none is configured: only when asked
            onnx_path=self.artifact_path if compare else None,
            onnx_feeds=[dict(self.feeds)],
            onnx_output_name=self.output_name,
            onnx_output_transform=(
                self.as_served if self.spec.distribution is not None
                and self.spec.distribution.serving_output == "action"
                and not self.inference_serves_action else None),
            extra={"notes": notes},
            skip=skip,
        )

    def training_inputs(self, raw: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Raw observations (per observation input) through the training preprocessing."""
        from paritygate.families.policy.probes import preprocess

        pres = self.input_preprocessors or {}
        out = {}
        for name, values in raw.items():
            fn = pres.get(name, (None, None))[0]
            out[name] = values if fn is None else preprocess(self.config, self.spec, fn, values,
                                                             name)
        return out

    def serving_log_chunks(self) -> Iterator[Any]:
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
            yield from read_chunks(self.config.resolve(log.path), layout, log.chunk,
                                   log.max_records)

    @property
    def artifact_format(self) -> str:
        """``onnx``, ``torchscript`` or ``torch_export``: the format the artifact is read as
        (an artifact exported on the fly is ONNX)."""
        if self.given_artifact is None:
            return "onnx"
        from paritygate.engines.artifact_graph import sniff_format

        return self.spec.artifact_format or sniff_format(self.given_artifact) or "onnx"


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


def _fed(spec: PolicySpec) -> str:
    """How the gate calls a forward, in words."""
    names = spec.input_names
    ticks = ", ".join(f"`{n}`" for n in names)
    if spec.call == "dict":
        return f"one dict with keys {ticks}"
    if spec.call == "keyword":
        return f"the keyword arguments {ticks}"
    return f"one tensor {ticks}" if len(names) == 1 else f"{len(names)} tensors {ticks}"


def _takes(forward: Any) -> str:
    """What a forward's signature takes, in words."""
    import inspect

    params = list(inspect.signature(forward).parameters.values())
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                       p.POSITIONAL_OR_KEYWORD)]
    required = [p.name for p in params if p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    n = len(positional)
    text = f"{n} positional argument{'s' if n != 1 else ''} ({', '.join(positional)})"
    if set(required) - set(positional):
        text += f" and the keyword arguments {sorted(set(required) - set(positional))}"
    return text


def check_forward_call(config: GateConfig, spec: PolicySpec, model: Any, side: str) -> None:
    """The forward must accept the inputs as the gate feeds them (``policy.inputs`` /
    ``policy.call``): a mismatch is bad input, named, before any check runs."""
    import inspect

    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a builtin or C forward: nothing to bind against
        return
    names = spec.input_names
    try:
        if spec.call == "dict":
            signature.bind({n: None for n in names})
        elif spec.call == "keyword":
            signature.bind(**dict.fromkeys(names))
        else:
            signature.bind(*names)
    except TypeError:
        key = "policy.inputs" if spec.inputs is None else "policy.call"
        fix = ("declare the inputs in policy.inputs" if spec.inputs is None
               else "declare how the forward takes them in policy.call (positional, keyword "
                    "or dict) and the inputs in order in policy.inputs")
        raise InputError(
            config.path, key,
            f"the {side} forward takes {_takes(model.forward)} but the gate feeds "
            f"{_fed(spec)}; {fix}") from None


TRAINING_LOG_STD = "log_std (training output)"
"""The reference engine's label for a distribution's log-std output (no output is named so)."""


def training_extra_outputs(spec: PolicySpec) -> dict[str, str | int]:
    """What the reference engine selects besides the policy output: each recurrent state
    output and, with ``distribution.log_std: output``, the log-std (:data:`TRAINING_LOG_STD`)."""
    extra = dict(training_state_outputs(spec) or {})
    dist = spec.gaussian
    if dist is not None and dist.log_std == "output":
        extra[TRAINING_LOG_STD] = dist.log_std_key
    return extra


def training_state_outputs(spec: PolicySpec) -> dict[str, str | int] | None:
    """The training forward's element holding each recurrent state output."""
    if spec.recurrent is None:
        return None
    return {s.output: (s.training_output if s.training_output is not None
                       else spec.output_names.index(s.output))
            for s in spec.recurrent.states}


def initial_states(config: GateConfig, spec: PolicySpec) -> dict[str, np.ndarray]:
    """Each state input's initial value (per-row shape), from a constant or a ``.npy`` file."""
    out: dict[str, np.ndarray] = {}
    if spec.recurrent is None:
        return out
    for i, state in enumerate(spec.recurrent.states):
        key = f"policy.recurrent.states[{i}].initial"
        if isinstance(state.initial, str):
            from paritygate.reading import load_arrays

            path = config.resolve(state.initial)
            loaded = load_arrays(path, key, what="initial state")
            if isinstance(loaded, dict):
                raise InputError(path, key, "an initial state is one .npy array, not an .npz")
            value = np.asarray(loaded).astype(np.float32)
            if list(value.shape) != list(state.shape):
                raise InputError(path, key, f"initial state of shape {list(value.shape)}, "
                                 f"the state is declared {list(state.shape)}")
        else:
            value = np.full(state.shape, state.initial, np.float32)
        out[state.input] = value
    return out


def step_state(ctx: PolicyContext, rows: int, *, start: bool) -> dict[str, np.ndarray]:
    """Recurrent inputs of ``rows`` rows at an episode start: the initial state and, when
    declared, the episode-start flag (``start``)."""
    spec = ctx.spec
    if spec.recurrent is None:
        return {}
    out = {name: np.repeat(value[None], rows, axis=0)
           for name, value in ctx.initial_states.items()}
    if spec.recurrent.episode_start:
        out[spec.recurrent.episode_start] = np.full(rows, float(start), np.float32)
    return out


def check_policy_output(config: GateConfig, spec: PolicySpec, model: Any, feeds: Any) -> None:
    """``policy.policy_output``, each recurrent state's ``training_output`` and a Gaussian's
    ``log_std_key`` must pick tensors out of the training forward's result (two probe rows)."""
    import torch

    from paritygate.engines.torch_engine import call_forward, select_output

    names = spec.input_names
    tensors = {n: torch.from_numpy(np.ascontiguousarray(feeds[n][:2])) for n in names}
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        try:
            output = call_forward(model, tensors, names, spec.call)
        except Exception:  # a forward that fails is the checks' to report
            return
        try:
            picked = select_output(output, spec.policy_output)
        except (KeyError, IndexError, TypeError, AttributeError):
            picked = None
        for key, which in training_extra_outputs(spec).items():
            try:
                state = select_output(output, which)
            except (KeyError, IndexError, TypeError, AttributeError):
                state = None
            if key == TRAINING_LOG_STD:
                if not isinstance(state, torch.Tensor) or isinstance(output, torch.Tensor):
                    raise InputError(config.path, "policy.distribution.log_std_key",
                                     f"{which!r} does not pick log_std out of the training "
                                     "forward's result")
            elif not isinstance(state, torch.Tensor):
                index = spec.state_output_names.index(key)
                raise InputError(
                    config.path, f"policy.recurrent.states[{index}].training_output",
                    f"{which!r} does not pick the state {key!r} out of the training forward's "
                    f"result: it returns {_describe(output)}")
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
    """The artifact's input ``input_name`` must have the probes' feature shape;
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
    spec = config.policy
    assert spec is not None
    _check_files(config, spec)
    import torch

    from paritygate.checkpoints import load_checkpoint_state, read_checkpoint

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
    check_forward_call(config, spec, training, "training")
    check_forward_call(config, spec, inference, "inference")
    training_load = load_into(training, state)
    inference_load = load_into(inference, state, ignore_prefixes=tuple(spec.training_heads))
    training.eval()
    inference.eval()

    raw = load_probes(config, spec)
    finite_raw, dropped = finite_rows(config, spec, raw)
    pres = input_preprocessors(config, spec)
    inputs: dict[str, np.ndarray] = {}
    for name, values in finite_raw.items():
        train_fn = pres.get(name, (None, None))[0]
        inputs[name] = values if train_fn is None else preprocess(
            config, spec, train_fn, values, name)
        if not np.all(np.isfinite(inputs[name])):
            raise InputError(
                config.path,
                f"{spec.preprocessing_key(name)}.training",
                "training preprocessing turns finite probes into NaN/Inf",
            )
    feeds = {**inputs, **_initial_feeds(config, spec, len(next(iter(inputs.values()))))}
    check_policy_output(config, spec, training, feeds)

    given = None
    if spec.artifact is not None and not force_export:
        from paritygate.reading import check_input

        given = check_input(config.resolve(spec.artifact), "policy.artifact", what="artifact")
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
        raw_inputs=raw,
        inputs=inputs,
        given_artifact=given,
        export_dir=export_dir or (config.default_report_dir() / "export"),
        probe_rows_dropped=dropped,
        state_dict_source=source,
        state_dict_key_reason="set by policy.state_dict_key" if spec.state_dict_key else
        "found under a common name; set policy.state_dict_key to choose another",
        input_preprocessors=pres,
    )
    from paritygate.families.policy.distribution import check_distribution

    check_distribution(ctx)
    if given is not None or force_export:
        ctx.candidate  # noqa: B018 - a configured artifact is validated before any check runs
    if given is not None:
        from paritygate.families.policy.export import read_manifest

        read_manifest(ctx.manifest_path)  # unreadable or not a mapping: bad input, up front
    return ctx


def _check_files(config: GateConfig, spec: PolicySpec) -> None:
    """The checkpoint, the probe file and each initial-state file may be read, and are within
    their size bounds (:mod:`paritygate.reading`; a zip checkpoint's members too): judged
    from ``stat``, zip directories and headers before torch is imported, so a sparse
    checkpoint or a zip bomb is refused in about a second."""
    from paritygate.checkpoints import memory_bytes
    from paritygate.reading import check_array_file, check_input, check_zip_members

    with keyed("policy.checkpoint"):
        ckpt = check_input(config.resolve(spec.checkpoint), None, what="checkpoint")
        # an SB3 zip or a torch zip file: its members' declared sizes (torch stores them)
        check_zip_members(ckpt, None, what="member", max_bytes=memory_bytes())
    if spec.probes.file is not None:
        check_array_file(config.resolve(spec.probes.file), "policy.probes.file",
                         what="probe file")
    for i, state in enumerate(spec.recurrent.states if spec.recurrent else []):
        if isinstance(state.initial, str):
            check_array_file(config.resolve(state.initial),
                             f"policy.recurrent.states[{i}].initial", what="initial state")


def _initial_feeds(config: GateConfig, spec: PolicySpec, rows: int) -> dict[str, np.ndarray]:
    """The recurrent inputs of ``rows`` rows one step after an episode start."""
    if spec.recurrent is None:
        return {}
    out = {name: np.repeat(value[None], rows, axis=0)
           for name, value in initial_states(config, spec).items()}
    if spec.recurrent.episode_start:
        out[spec.recurrent.episode_start] = np.zeros(rows, np.float32)
    return out


def open_artifact(artifact: Path, spec: PolicySpec, feeds: Mapping[str, np.ndarray], *,
                  allow_pickle: bool = False) -> Any:
    """An engine over ``artifact`` in its format (``policy.artifact_format``, else told by
    the file), its inputs and policy output validated."""
    from paritygate.engines.artifact_graph import FORMATS_TEXT, sniff_format

    fmt = spec.artifact_format or sniff_format(artifact)
    if fmt in ("torchscript", "torch_export"):
        return open_torch_artifact(artifact, fmt, spec, feeds, allow_pickle)
    from paritygate.engines.onnxruntime_engine import OnnxRuntimeEngine

    if fmt == "onnx":
        with keyed("policy.artifact"):
            candidate = OnnxRuntimeEngine(artifact)
    else:
        try:
            candidate = OnnxRuntimeEngine(artifact)
        except InputError:
            raise InputError(artifact, "policy.artifact",
                             f"not an artifact the gate reads: the gate reads {FORMATS_TEXT} "
                             "(set policy.artifact_format to name one)") from None
    names = candidate.input_names
    absent = [n for n in spec.input_names if n not in names]
    if len(spec.input_names) > 1 and absent:
        raise InputError(
            artifact, "inputs", f"artifact inputs {names} do not include {absent} "
            f"(policy.inputs declares {spec.input_names})")
    check_artifact_inputs(
        candidate.session, artifact, spec.input_names[0], feeds[spec.input_names[0]],
        spec.output_names[0]
    )
    for name in spec.input_names[1:]:
        check_artifact_inputs(candidate.session, artifact, name, feeds[name])
    check_input_dtypes(candidate.session, artifact, spec, feeds)
    return candidate


_ORT_DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64",
               "tensor(float16)": "float16", "tensor(uint8)": "uint8", "tensor(int8)": "int8",
               "tensor(int16)": "int16", "tensor(int32)": "int32", "tensor(int64)": "int64",
               "tensor(bool)": "bool", "tensor(uint16)": "uint16", "tensor(uint32)": "uint32",
               "tensor(uint64)": "uint64"}
"""ONNX Runtime's input type names, as numpy dtype names."""


def check_input_dtypes(session: Any, artifact: Path, spec: PolicySpec,
                       feeds: Mapping[str, np.ndarray]) -> None:
    """Every artifact input must take the dtype the gate feeds it (the probes as loaded, or
    the training preprocessing's output): uint8 image probes fed to a float32 artifact are bad
    input, named with both keys and both dtypes before any check runs."""
    for spec_input in session.get_inputs():
        fed = feeds.get(spec_input.name)
        want = _ORT_DTYPES.get(spec_input.type)
        if fed is None or want is None or np.dtype(want) == fed.dtype:
            continue
        name = spec_input.name
        observation = name in {i.name for i in spec.observation_inputs}
        pre = spec.input_preprocessing(name) if observation else None
        if not observation:
            source = f"the gate's recurrent input {name!r} ({fed.dtype})"
        elif pre is not None:
            source = (f"{spec.preprocessing_key(name)}.training gives {fed.dtype} for input "
                      f"{name!r}")
        else:
            source = f"policy.probes are {fed.dtype} for input {name!r}"
        raise InputError(
            artifact, "policy.artifact",
            f"input {name!r} takes {want}, but {source}: feed the artifact's dtype (save the "
            f"probes as {want}, or export the artifact with a {fed.dtype} input)")


def open_torch_artifact(artifact: Path, fmt: str, spec: PolicySpec,
                        feeds: Mapping[str, np.ndarray], allow_pickle: bool) -> Any:
    """A TorchScript or torch.export engine over ``artifact``: its input count must be the
    declared inputs' and it must run two probe rows, returning the policy output in the
    probes' batch (the first declared output: these formats name outputs by position)."""
    names = spec.input_names
    if fmt == "torchscript":
        from paritygate.engines.torchscript_engine import TorchScriptEngine

        candidate: Any = TorchScriptEngine(artifact, input_names=names,
                                           output_names=spec.output_names, call=spec.call)
    else:
        from paritygate.engines.torch_export_engine import TorchExportEngine

        candidate = TorchExportEngine(artifact, input_names=names,
                                      output_names=spec.output_names, call=spec.call,
                                      allow_pickle=allow_pickle)
    n_inputs = len(candidate.graph.input_names)
    if n_inputs != len(names):
        raise InputError(artifact, "policy.inputs",
                         f"the {fmt} artifact takes {n_inputs} input(s); policy.inputs declares "
                         f"{len(names)} ({names})")
    rows = {n: v[:2] for n, v in feeds.items()}
    if candidate.fixed_batch:
        rows = {n: np.repeat(v[:1], candidate.fixed_batch, axis=0) for n, v in feeds.items()}
    try:
        out = candidate.infer(rows)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise InputError(artifact, "policy.artifact",
                         f"the {fmt} artifact does not run on two probe rows: "
                         f"{type(exc).__name__}: {first}") from None
    policy = out.get(spec.output_names[0])
    if policy is None or policy.ndim == 0 or len(policy) != len(next(iter(rows.values()))):
        raise InputError(artifact, "policy.output_names",
                         f"the {fmt} artifact's first output is not a batch of policy outputs")
    candidate.graph.output_names = list(out)  # named by position: what it returns
    return candidate

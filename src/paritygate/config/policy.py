"""Config model of the torch-policy family: the ``policy:`` section of a gate config."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from paritygate.config_base import ConfigPath, StrictModel

EDGE_CASE_KINDS: tuple[str, ...] = ("missing", "extremes", "empty", "long")


class ProbeSpec(StrictModel):
    """Where probe observations come from: a generator callable or a .npy/.npz file."""

    generator: str | None = None
    """``module:callable(count, seed) -> np.ndarray`` of raw observations (N, ...)."""
    file: ConfigPath | None = None
    count: int = Field(64, ge=1)
    seed: int = 0
    edge_cases: bool | list[str] = True
    """Extra inputs preprocessing_parity feeds besides the probes: ``true`` (all kinds),
    ``false`` (none) or a list of kinds: ``missing`` (one NaN per feature, an all-NaN row),
    ``extremes`` (zeros, +-1e4), ``empty`` (a batch of 0 rows), ``long`` (~4096 rows)."""

    @field_validator("edge_cases", mode="before")
    @classmethod
    def _known_kinds(cls, value: Any) -> Any:
        if isinstance(value, list):
            unknown = [k for k in value if k not in EDGE_CASE_KINDS]
            if unknown:
                raise ValueError(
                    f"unknown edge-case kinds {unknown}; known: {', '.join(EDGE_CASE_KINDS)} "
                    "(or true / false)"
                )
        elif not isinstance(value, bool):
            kinds = ", ".join(EDGE_CASE_KINDS)
            raise ValueError(f"expected true, false or a list of kinds: {kinds}")
        return value

    @property
    def edge_case_kinds(self) -> tuple[str, ...]:
        """The edge-case kinds in use."""
        if self.edge_cases is True:
            return EDGE_CASE_KINDS
        if self.edge_cases is False:
            return ()
        return tuple(k for k in EDGE_CASE_KINDS if k in self.edge_cases)

    @model_validator(mode="after")
    def _one_source(self) -> ProbeSpec:
        if (self.generator is None) == (self.file is None):
            raise ValueError("give exactly one of 'generator' or 'file'")
        return self


class PreprocessingSpec(StrictModel):
    """The two preprocessing implementations: raw observation array in, model input out."""

    training: str
    """``module:callable(raw, **kwargs)`` used by the trainer (may return a torch tensor)."""
    serving: str
    """``module:callable(raw, **kwargs)`` used by the serving stack."""
    stats: ConfigPath | None = None
    """Normalisation statistics file, passed to both as ``stats_path`` (relative to the config)."""
    kwargs: dict[str, Any] = {}
    discrete_features: list[int] = []
    """Feature indices that must match exactly (categorical / integer-coded)."""


class InputSpec(StrictModel):
    """One named model input (a key of a Dict observation, or a recurrent state input)."""

    name: str
    shape: list[int] | None = None
    """Per-row shape without the batch axis (e.g. ``[3, 16, 16]``); checked against the
    probes and the artifact's input when given."""
    preprocessing: PreprocessingSpec | None = None
    """This key's two preprocessing implementations (several inputs: one per key)."""


class StateSpec(StrictModel):
    """One recurrent state: an artifact input the previous step's output is fed back into."""

    input: str
    output: str
    shape: list[int] = Field(min_length=1)
    """Per-row shape without the batch axis (the batch axis is axis 0 on both sides)."""
    initial: float | ConfigPath = 0.0
    """The state at an episode start: a constant, or a ``.npy`` file of ``shape``."""
    training_output: str | int | None = None
    """Element of the training forward's result holding the new state (dict key or tuple
    index); default: the position of ``output`` in ``output_names``."""


MAX_SERVING_LOG_RECORDS = 10_000_000
"""A serving log replays at most 10^7 records (a day of traffic at ~100 requests a second is
8.6 million); every line is read and checked before any model loads, at ~1 s per 10^5."""

MAX_RECURRENT_STEPS = 10_000
"""``recurrent.steps`` at most: sequences far past any training horizon (RecurrentPPO's
n_steps are 128-2048) only multiply the run time; 10^7 steps would run for hours."""

MAX_RECURRENT_SEQUENCES = 1_024
"""``recurrent.sequences`` at most: the batch of parallel episodes each step feeds."""

MAX_EPISODES = 1_000
"""``rollout.episodes`` and the length of ``rollout.seeds`` at most: a thousand seeded
episodes per path already bound a rate of unexcused divergence to ~0.1%."""

MAX_EPISODE_STEPS = 100_000
"""``rollout.max_steps`` at most: above Atari's 108,000-frame limit at frame skip 4 (27,000
steps), so an environment without a time limit cannot run a gate for hours."""


class RecurrentSpec(StrictModel):
    """A recurrent policy: state in, state out, checked over sequences (``recurrent_parity``)."""

    states: list[StateSpec] = Field(min_length=1)
    episode_start: str | None = None
    """Input name of the episode-start flag (float, (N,), 1.0 at an episode's first step) the
    model resets its state on (``(1 - start) * state``, as sb3-contrib's RecurrentPPO). Without
    one, the gate feeds the initial state at every episode start on both sides."""
    steps: int = Field(16, ge=2, le=MAX_RECURRENT_STEPS)
    """Sequence length T (at most :data:`MAX_RECURRENT_STEPS`)."""
    sequences: int = Field(8, ge=1, le=MAX_RECURRENT_SEQUENCES)
    """Parallel episodes in the batch (at most :data:`MAX_RECURRENT_SEQUENCES`)."""
    reset_every: int = Field(5, ge=2)
    """Episode length: sequence ``b`` starts an episode at the steps ``t`` where
    ``(t + b) % reset_every == 0`` (and at step 0), so resets fall on different rows."""


class RolloutSpec(StrictModel):
    """``rollout_parity``: seeded Gymnasium episodes, stepped by both paths."""

    env: str | None = None
    """A registered Gymnasium id (``CartPole-v1``): ``gymnasium.make(env, **env_kwargs)``."""
    factory: str | None = None
    """``module:callable(**env_kwargs) -> gymnasium.Env``: an environment of your own."""
    env_kwargs: dict[str, Any] = {}
    seeds: list[int] | None = Field(None, min_length=1, max_length=MAX_EPISODES)
    """The reset seed of each episode; omitted: ``episodes`` seeds from ``seed`` up (at most
    :data:`MAX_EPISODES` seeds)."""
    episodes: int = Field(5, ge=1, le=MAX_EPISODES)
    seed: int = 0
    max_steps: int = Field(500, ge=1, le=MAX_EPISODE_STEPS)
    """Steps per episode at most (the environment's own time limit may end it earlier;
    at most :data:`MAX_EPISODE_STEPS`)."""
    near_tie_margin: float = Field(1e-3, ge=0)
    """Discrete actions: a divergence is excused only where the training path's top-1 minus
    top-2 logit margin is below this (a near-tie); unset, a declared ``artifact_dtype``'s tier
    sets it."""
    action_tolerance: float = Field(1e-4, ge=0)
    """Continuous actions: a step agrees while the two actions differ by at most this; unset,
    a declared ``artifact_dtype``'s tier sets it."""
    return_tolerance: float = Field(1e-4, ge=0)
    """Episodes whose actions agree must have returns within this, relative to
    ``max(1, |return|)`` (fp32 noise of continuous actions compounds into ~1e-8)."""

    @model_validator(mode="after")
    def _one_env(self) -> RolloutSpec:
        if (self.env is None) == (self.factory is None):
            raise ValueError("give exactly one of 'env' or 'factory'")
        if self.seeds is not None and {"episodes", "seed"} & self.model_fields_set:
            raise ValueError("give either 'seeds' or 'episodes' and 'seed', not both")
        return self

    @property
    def episode_seeds(self) -> list[int]:
        """The reset seed of every episode, in order."""
        if self.seeds is not None:
            return list(self.seeds)
        return [self.seed + i for i in range(self.episodes)]


GAUSSIAN_ONLY_KEYS: tuple[str, ...] = ("log_std", "log_std_key", "log_std_clamp", "samples")
"""``policy.distribution`` keys that describe a Gaussian's spread: a deterministic actor has
none."""


class ServingLogSpec(StrictModel):
    """``serving_replay``: a log of what serving received and returned, replayed through the
    training path (schema: README, "Serving-log replay")."""

    path: ConfigPath
    """An ``.npz``, Parquet (``.parquet``) or JSON-lines (``.jsonl``) file, relative to the
    config."""
    served: Literal["output", "action"] = "output"
    """What each record's ``served`` holds: the artifact's first output (``output``: logits,
    or the action when ``distribution.serving_output: action``) or the env action taken
    (``action``: an index for discrete actions)."""
    max_records: int = Field(1_000_000, ge=1, le=MAX_SERVING_LOG_RECORDS)
    """The replay's bound: a log with more records is bad input (exit code 2); at most
    :data:`MAX_SERVING_LOG_RECORDS`."""
    chunk: int = Field(4096, ge=1)
    """Records read and replayed at a time (memory is bounded by this, not by the log)."""


class DistributionSpec(StrictModel):
    """A continuous policy's action distribution and its action transform. ``gaussian``: a
    diagonal Gaussian over the pre-squash action ``u``, whose mean is the policy output;
    ``deterministic``: the policy output is ``u`` itself (TD3, DDPG). Either way ``squash``,
    ``action_scale`` and ``action_bias`` turn ``u`` into the env action."""

    type: Literal["gaussian", "deterministic"] = "gaussian"
    """``gaussian`` (SAC, PPO on a Box) or ``deterministic`` (TD3/DDPG: no log-std; only the
    action transform is declared and judged)."""
    log_std: Literal["parameter", "output"] = "parameter"
    """``parameter``: a state-independent tensor of the checkpoint (SB3 PPO, CleanRL PPO);
    ``output``: an output of the training forward (SAC) and, when the artifact serves it, the
    artifact's second output."""
    log_std_key: str | int = "log_std"
    """``parameter``: the tensor's name in the checkpoint (``actor_logstd``); ``output``: the
    dict key or tuple index of log_std in the training forward's result."""
    log_std_clamp: list[float] | None = None
    """``[min, max]`` applied to log_std on both sides before use (SB3 SAC: ``[-20, 2]``);
    ``null``: none."""
    squash: Literal["tanh", "clip", "none"] = "none"
    """``tanh``: action = bias + scale * tanh(u) (SAC); ``clip``: action = clip(u, bias - scale,
    bias + scale), u already in action units (SB3 PPO on a Box); ``none``: action =
    bias + scale * u."""
    action_scale: float | list[float] = 1.0
    """Per dimension or one for all: SB3/CleanRL SAC use (high - low) / 2 of the Box."""
    action_bias: float | list[float] = 0.0
    """Per dimension or one for all: (high + low) / 2 of the Box."""
    serving_output: Literal["mean", "action"] = "mean"
    """What the artifact's first output (and the inference model's output) holds: the
    Gaussian's mean (a deterministic actor's pre-squash ``u``), like the training policy
    output, or the deterministic env action (bias + scale * squash(mean)); then the training
    side's output is compared as that action."""
    samples: int = Field(8, ge=1)
    """Actions sampled per probe for the behaviour log-prob delta."""

    @property
    def gaussian(self) -> bool:
        """A Gaussian (it has a log-std) rather than a deterministic actor."""
        return self.type == "gaussian"

    @model_validator(mode="after")
    def _deterministic_has_no_spread(self) -> DistributionSpec:
        given = [k for k in GAUSSIAN_ONLY_KEYS if k in self.model_fields_set]
        if self.type == "deterministic" and given:
            raise ValueError(f"{', '.join(given)}: a deterministic actor has no log-std "
                             "(type: deterministic takes squash, action_scale, action_bias and "
                             "serving_output)")
        return self

    @field_validator("log_std_clamp")
    @classmethod
    def _ordered(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and (len(value) != 2 or not value[0] < value[1]):
            raise ValueError(f"expected [min, max] with min < max (got {value})")
        return value

    @field_validator("action_scale")
    @classmethod
    def _nonzero_scale(cls, value: float | list[float]) -> float | list[float]:
        values = value if isinstance(value, list) else [value]
        if not values or any(v == 0 for v in values):
            raise ValueError(f"action_scale must be non-zero (got {value})")
        return value


class PolicySpec(StrictModel):
    """A torch policy network served through ONNX Runtime."""

    training_factory: str
    """``module:callable(**factory_kwargs) -> nn.Module``: the full training model, with heads."""
    inference_factory: str
    """``module:callable(**factory_kwargs) -> nn.Module``: the serving model, heads removed."""
    factory_kwargs: dict[str, Any] = {}
    factory_path_kwargs: list[str] = []
    """Names of ``factory_kwargs`` whose values are file paths: resolved relative to the
    config's folder, like ``checkpoint`` (absolute paths stay as they are). Other values
    are passed as written."""
    checkpoint: ConfigPath
    state_dict_key: str | None = Field(None, min_length=1)
    """Where the state dict sits inside a training checkpoint (``{"model": ..., "optimizer":
    ..., "step": N}``): a key, dotted when nested (``agent.actor``). Unset: a flat file is the
    state dict, and a training checkpoint's is found under a common name (``state_dict``,
    ``model_state_dict``, ``model``, ...); the key used is noted on ``weights_load``."""
    artifact: ConfigPath | None = None
    """The artifact to check (ONNX, TorchScript or a torch.export program: see
    ``artifact_format``); omitted: ``paritygate export`` runs on the fly."""
    artifact_format: Literal["onnx", "torchscript", "torch_export"] | None = None
    """The artifact's format; omitted: told by the file (``.onnx``: ONNX; a zip of
    ``torch.jit.save``: TorchScript; ``.pt2`` / a ``torch.export.save`` archive: torch.export,
    read only with ``allow_pickle: true``)."""
    manifest: ConfigPath | None = None
    """Defaults to ``manifest.json`` beside the artifact."""
    artifact_dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    """The precision the artifact stores its weights in. A float16/bfloat16 artifact (e.g.
    onnxconverter-common's ``convert_float_to_float16(keep_io_types=True)``) has its provenance
    proven against the checkpoint cast to that dtype and its outputs judged by the precision
    tier ``fp32/fp16`` or ``fp32/bf16``; a converted artifact this key does not declare fails
    ``export_integrity``."""
    require_manifest: bool = False
    """A missing manifest fails ``export_integrity`` (for pipelines that promise one); by
    default provenance is then proven numerically from the artifact."""
    training_heads: list[str] = []
    """What only the training model has: module-name prefixes (value / auxiliary heads) or
    parameter / buffer names (a bare ``log_std`` parameter the serving actor drops)."""
    policy_output: str | int = 0
    """Which element of the training forward's output is the policy: dict key or tuple index."""
    input_name: str = "obs"
    """The one model input of a single-input policy (``inputs`` declares several)."""
    inputs: list[InputSpec | str] | None = None
    """The model inputs in call order (names or mappings): the keys of a Dict observation,
    and the recurrent state inputs. Default: one input, ``input_name``."""
    call: Literal["positional", "keyword", "dict"] = "positional"
    """How the torch forwards take the inputs: ``positional`` ``forward(image, vector)``,
    ``keyword`` ``forward(image=..., vector=...)``, ``dict`` ``forward({"image": ...,
    "vector": ...})`` (SB3 ``MultiInputPolicy``)."""
    recurrent: RecurrentSpec | None = None
    output_names: list[str] = Field(["logits"], min_length=1)
    """Outputs the artifact must declare, in order; the first is the policy output."""
    action_space: Literal["discrete", "continuous"] = "discrete"
    distribution: DistributionSpec | None = None
    """A continuous policy's Gaussian or deterministic actor (``action_space: continuous``
    only): logits_agreement then measures the deterministic env action (and for a Gaussian KL,
    mean and std and the behaviour log-prob) and names a missing squash, scale or bias."""

    @property
    def gaussian(self) -> DistributionSpec | None:
        """``distribution`` when it is a Gaussian (``type: gaussian``), else ``None``."""
        dist = self.distribution
        return dist if dist is not None and dist.gaussian else None
    preprocessing: PreprocessingSpec | None = None
    probes: ProbeSpec
    opset: int = Field(18, ge=13)
    batch_sizes: list[int] = Field([1, 2, 7], min_length=1)
    dropout_repeats: int = Field(5, ge=2)
    rollout: RolloutSpec | None = None
    """Closed-loop episodes for ``rollout_parity``; omitted: that check is skipped."""
    serving_log: ServingLogSpec | None = None
    """A log of served requests for ``serving_replay``; omitted: that check is skipped."""
    batch_invariant: bool = False
    """The serving stack is claimed batch invariant: ``batch_invariance`` then requires each
    probe's outputs in any batch to equal its outputs alone bit for bit (otherwise the
    artifact's precision tier bounds the difference)."""

    @model_validator(mode="after")
    def _inputs_consistent(self) -> PolicySpec:
        if self.inputs is not None and "input_name" in self.model_fields_set:
            raise ValueError("give either input_name (one input) or inputs, not both")
        names = [i.name for i in self.input_specs]
        if len(set(names)) != len(names):
            raise ValueError(f"input names must be unique (got {names})")
        if not self.observation_inputs:
            raise ValueError("no observation input: every declared input is a recurrent state")
        several = len(self.observation_inputs) > 1
        if several and self.preprocessing is not None:
            raise ValueError("with several observation inputs, give preprocessing per input "
                             "(policy.inputs[i].preprocessing), not policy.preprocessing")
        if self.preprocessing is not None and self.observation_inputs[0].preprocessing:
            raise ValueError("preprocessing given twice: policy.preprocessing and "
                             "policy.inputs[0].preprocessing")
        if self.distribution is not None and len(self.input_names) > 1:
            raise ValueError("policy.distribution (a continuous actor) takes one observation "
                             "input and no recurrent state")
        rec = self.recurrent
        if rec is not None:
            for state in rec.states:
                if state.output not in self.output_names:
                    raise ValueError(f"recurrent state output {state.output!r} is not in "
                                     f"output_names {self.output_names}")
                if state.output == self.output_names[0]:
                    raise ValueError(f"recurrent state output {state.output!r} is the policy "
                                     "output (output_names[0])")
        return self

    @property
    def input_specs(self) -> list[InputSpec]:
        """Every model input in call order; state and episode-start inputs ``inputs`` does not
        list are appended."""
        given = [InputSpec(name=i) if isinstance(i, str) else i
                 for i in (self.inputs or [self.input_name])]
        names = {i.name for i in given}
        extra = [] if self.recurrent is None else [
            *(s.input for s in self.recurrent.states),
            *([self.recurrent.episode_start] if self.recurrent.episode_start else [])]
        return given + [InputSpec(name=n) for n in extra if n not in names]

    @property
    def state_input_names(self) -> list[str]:
        """Recurrent inputs the gate fills (states and the episode-start flag)."""
        if self.recurrent is None:
            return []
        return [*(s.input for s in self.recurrent.states),
                *([self.recurrent.episode_start] if self.recurrent.episode_start else [])]

    @property
    def observation_inputs(self) -> list[InputSpec]:
        """The inputs probes feed (everything but recurrent state and episode start)."""
        state = set(self.state_input_names)
        return [i for i in self.input_specs if i.name not in state]

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.input_specs]

    @property
    def state_output_names(self) -> list[str]:
        return [] if self.recurrent is None else [s.output for s in self.recurrent.states]

    def input_preprocessing(self, name: str) -> PreprocessingSpec | None:
        """The preprocessing of observation input ``name``."""
        first = self.observation_inputs[0]
        for spec in self.observation_inputs:
            if spec.name == name:
                if spec.name == first.name and self.preprocessing is not None:
                    return self.preprocessing
                return spec.preprocessing
        return None

    def preprocessing_key(self, name: str) -> str:
        """The config key of input ``name``'s preprocessing section."""
        if self.inputs is None or (self.preprocessing is not None
                                    and name == self.observation_inputs[0].name):
            return "policy.preprocessing"
        index = [i.name if isinstance(i, InputSpec) else i for i in self.inputs].index(name)
        return f"policy.inputs[{index}].preprocessing"

    @model_validator(mode="after")
    def _path_kwargs_named(self) -> PolicySpec:
        for name in self.factory_path_kwargs:
            if not isinstance(self.factory_kwargs.get(name), str):
                raise ValueError(
                    f"factory_path_kwargs names {name!r}, which is not a string value of "
                    f"factory_kwargs (its keys: {sorted(self.factory_kwargs)})"
                )
        return self

    @model_validator(mode="after")
    def _distribution_is_continuous(self) -> PolicySpec:
        if self.distribution is not None and self.action_space != "continuous":
            raise ValueError("distribution is set but action_space is not continuous")
        return self

    @field_validator("batch_sizes")
    @classmethod
    def _positive_sizes(cls, value: list[int]) -> list[int]:
        if any(size < 1 for size in value):
            raise ValueError(f"batch sizes must be positive integers (got {value})")
        return value

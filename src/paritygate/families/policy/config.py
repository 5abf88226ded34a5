"""Config model of the torch-policy family: the ``policy:`` section of a gate config."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from paritygate.config_base import StrictModel

EDGE_CASE_KINDS: tuple[str, ...] = ("missing", "extremes", "empty", "long")


class ProbeSpec(StrictModel):
    """Where probe observations come from: a generator callable or a .npy/.npz file."""

    generator: str | None = None
    """``module:callable(count, seed) -> np.ndarray`` of raw observations (N, ...)."""
    file: str | None = None
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
    stats: str | None = None
    """Normalisation statistics file, passed to both as ``stats_path`` (relative to the config)."""
    kwargs: dict[str, Any] = {}
    discrete_features: list[int] = []
    """Feature indices that must match exactly (categorical / integer-coded)."""


class RolloutSpec(StrictModel):
    """``rollout_parity``: seeded Gymnasium episodes, stepped by both paths."""

    env: str | None = None
    """A registered Gymnasium id (``CartPole-v1``): ``gymnasium.make(env, **env_kwargs)``."""
    factory: str | None = None
    """``module:callable(**env_kwargs) -> gymnasium.Env``: an environment of your own."""
    env_kwargs: dict[str, Any] = {}
    seeds: list[int] | None = Field(None, min_length=1)
    """The reset seed of each episode; omitted: ``episodes`` seeds from ``seed`` up."""
    episodes: int = Field(5, ge=1)
    seed: int = 0
    max_steps: int = Field(500, ge=1)
    """Steps per episode at most (the environment's own time limit may end it earlier)."""
    near_tie_margin: float = Field(1e-3, ge=0)
    """Discrete actions: a divergence is excused only where the training path's top-1 minus
    top-2 logit margin is below this (a near-tie)."""
    action_tolerance: float = Field(1e-4, ge=0)
    """Continuous actions: a step agrees while the two actions differ by at most this."""
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
    checkpoint: str
    artifact: str | None = None
    """ONNX artifact to check; omitted: ``paritygate export`` runs on the fly."""
    manifest: str | None = None
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
    """Module-name prefixes present only in the training model (value / auxiliary heads)."""
    policy_output: str | int = 0
    """Which element of the training forward's output is the policy: dict key or tuple index."""
    input_name: str = "obs"
    output_names: list[str] = Field(["logits"], min_length=1)
    """Outputs the artifact must declare, in order; the first is the policy output."""
    action_space: Literal["discrete", "continuous"] = "discrete"
    preprocessing: PreprocessingSpec | None = None
    probes: ProbeSpec
    opset: int = Field(18, ge=13)
    batch_sizes: list[int] = Field([1, 2, 7], min_length=1)
    dropout_repeats: int = Field(5, ge=2)
    rollout: RolloutSpec | None = None
    """Closed-loop episodes for ``rollout_parity``; omitted: that check is skipped."""

    @model_validator(mode="after")
    def _path_kwargs_named(self) -> PolicySpec:
        for name in self.factory_path_kwargs:
            if not isinstance(self.factory_kwargs.get(name), str):
                raise ValueError(
                    f"factory_path_kwargs names {name!r}, which is not a string value of "
                    f"factory_kwargs (its keys: {sorted(self.factory_kwargs)})"
                )
        return self

    @field_validator("batch_sizes")
    @classmethod
    def _positive_sizes(cls, value: list[int]) -> list[int]:
        if any(size < 1 for size in value):
            raise ValueError(f"batch sizes must be positive integers (got {value})")
        return value

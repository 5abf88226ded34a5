"""``reward_parity``'s block: ``causal_lm.reward``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from paritygate.config_base import ConfigPath, Dtype, StrictModel
from paritygate.sections import Section


class RewardScoring(StrictModel):
    """How one side feeds the reward model: layout, length limit and what it is shown."""

    padding_side: Literal["left", "right"] | None = None
    """Default: the reward tokenizer's."""
    max_length: int | None = Field(None, ge=1)
    """Tokens kept per scored text (default: all)."""
    truncation_side: Literal["left", "right"] | None = None
    """Which end ``max_length`` cuts (default: the reward tokenizer's)."""
    scored_span: Literal["prompt_completion", "completion"] = "prompt_completion"
    """What the reward model is shown: the prompt and the completion, or the completion only."""
    chat_template: bool = False
    """Render ``[user: prompt, assistant: completion]`` with the reward tokenizer's template."""
    append_eos: bool = True
    """Append the EOS token to the text (TRL's ``RewardTrainer`` does)."""
    batch_size: int = Field(8, ge=1)


class RewardSpec(Section):
    """The reward of the RL loop (``reward_parity``): a reward model and/or a reward function."""

    FAMILY = "causal_lm"
    KEY = "reward"
    FIELD_DOC = "The reward model and/or function (``reward_parity``; skipped when absent)."

    model_dir: ConfigPath | None = None
    """HF ``AutoModelForSequenceClassification`` directory with one label (TRL ``RewardTrainer``
    output): the copy that scores at evaluation or serving."""
    trained_dir: ConfigPath | None = None
    """The reward model as training used it (default: ``model_dir``): the scoring copy's
    tensors must be its tensors."""
    tokenizer: ConfigPath | None = None
    """The reward model's tokenizer (default: ``model_dir``)."""
    dtype: Dtype | None = None
    """The dtype the scoring copy is stored and run in, when lower than the trained one's."""
    training: RewardScoring = RewardScoring()
    """How training scored its samples."""
    serving: RewardScoring | None = None
    """How evaluation or serving scores (default: as training)."""
    function: str | None = None
    """``module:callable(prompts, completions, **kwargs) -> list[float]``: a reward function
    as GRPO trainers take it (a custom scorer serving the reward model, or another reward)."""
    function_matches_model: bool = True
    """With ``function`` and a reward model both set: the function serves the trained reward
    model's scores, and its rewards on the same samples must equal them (score difference and
    pair rankings flipped). ``false``: the function is another reward by design (a format or
    rule reward), not compared."""
    completions: str | None = None
    """JSONL, one ``{"prompt", "completion"}`` per line, or a rollout dump (``paritygate dump``
    JSONL/Parquet: ``prompt_ids``, ``completion_ids``, decoded by the training tokenizer), or
    ``generated`` (the HF engine's greedy continuations of the probes, shared with the other
    LM checks); default: each text probe split in two at a word boundary."""
    length_slope_max: float | None = Field(None, ge=0)
    """Fail when the score grows faster than this per completion token on length variants
    (default: reported, not judged)."""

    @model_validator(mode="after")
    def _something_to_score(self) -> RewardSpec:
        if self.model_dir is None and self.function is None:
            raise ValueError("a reward block needs model_dir, function or both")
        return self


SECTION = RewardSpec

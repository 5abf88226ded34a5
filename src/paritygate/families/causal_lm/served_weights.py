"""The weights ``weights_load`` compares: the training side's tensors against the served ones.

A :class:`WeightsSetup` is built from the two sides and the training-only heads; it reads each
side's tensors on demand (no second copy held for the run) and compares them with
:mod:`.weights`. Both sides are read alike (:func:`side_state`): a side's safetensors files,
each holding its merged model's tensor where an adapter is merged onto them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from paritygate.families.causal_lm.sides import serves_training_files

if TYPE_CHECKING:
    from torch import Tensor

    from paritygate.families.causal_lm.sides import LMSide
    from paritygate.families.causal_lm.weights import AdapterServed, WeightsDiff


def side_state(side: LMSide) -> dict[str, Tensor]:
    """Every tensor of the side's safetensors files (read on each call, so the run does not
    hold a second copy of the weights). With an adapter, the base's files under their own
    names, each holding the merged model's tensor where it has one."""
    from paritygate.families.causal_lm.weights import read_state

    state = read_state(side.model_dir)
    if side.adapter is not None:
        merged = side.model().state_dict()
        state.update({k: merged[k].detach() for k in state if k in merged})
    return state


@dataclass(frozen=True, eq=False)
class WeightsSetup:
    """The training and the served weights of one gate run, read and compared on demand."""

    training: LMSide
    serving: LMSide
    training_only_heads: tuple[str, ...]
    """``causal_lm.training_only_heads``: keys the served copy drops by design."""

    def checkpoint_state(self) -> dict[str, Tensor]:
        """The training side's tensors (:func:`side_state`): the policy the trainer optimised."""
        return side_state(self.training)

    def serving_state(self) -> dict[str, Tensor]:
        """The served side's tensors (:func:`side_state`)."""
        return side_state(self.serving)

    def serves_training_files(self) -> bool:
        """The served weights are the training side's own (:func:`.sides.serves_training_files`)."""
        return serves_training_files(self.training, self.serving)

    def is_training_only(self, key: str) -> bool:
        """``key`` belongs to one of ``causal_lm.training_only_heads``."""
        from paritygate.families.causal_lm.weights import is_training_only

        return is_training_only(key, list(self.training_only_heads))

    def adapter_base_state(self) -> dict[str, Tensor]:
        """The base model's tensors the training adapter changes (its target weights), as
        stored in the training directory; empty without an adapter."""
        from paritygate.families.causal_lm.weights import read_keys

        adapter = self.training.adapter
        if adapter is None:
            return {}
        return read_keys(self.training.model_dir, adapter.target_weights())

    def adapter_served(self, training_state: Mapping[str, Tensor], differing: list[str],
                       ) -> AdapterServed | None:
        """How the served copy holds the declared adapter (:func:`.weights.how_served`)."""
        from paritygate.families.causal_lm.weights import how_served

        adapter = self.training.adapter
        if adapter is None or self.serves_training_files():
            return None
        return how_served(adapter, self.training.model_dir, self.adapter_base_state(),
                          training_state, self.serving_state(), differing)

    def diff(self, training_state: dict[str, Tensor] | None = None) -> WeightsDiff:
        """Tensor-by-tensor comparison of the training and the served weights
        (:class:`~paritygate.families.causal_lm.weights.WeightsDiff`)."""
        from paritygate.families.causal_lm.weights import compare_states, tied_groups

        train = self.checkpoint_state() if training_state is None else training_state
        serve = train if self.serves_training_files() else self.serving_state()
        tied = tied_groups(self.training.model()) if serve is not train else []
        return compare_states(train, serve, list(self.training_only_heads), tied)

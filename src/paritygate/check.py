"""The check contract: a measurement function plus the facts the verdict needs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from paritygate.result import Measurement, declare_kinds


@dataclass(frozen=True)
class Thresholds(Mapping[str, float]):
    """A check's thresholds: its ``defaults`` and the user's ``overrides`` kept apart.

    Reading a name gives the effective value (the override, else the default). An override of
    ``None`` (``null`` in the config) makes the metric informational: the check still reads the
    default for its own diagnostics, and the gate drops the metric's threshold after measuring
    (:attr:`informational`). A check that derives its limits elsewhere (a precision tier) asks
    :meth:`is_set` which of them the user chose.
    """

    defaults: Mapping[str, float]
    overrides: Mapping[str, float | None] = field(default_factory=dict)

    def __getitem__(self, name: str) -> float:
        value = self.overrides.get(name)
        return float(value) if value is not None else self.defaults[name]

    def __iter__(self) -> Iterator[str]:
        set_ = [k for k, v in self.overrides.items() if v is not None and k not in self.defaults]
        return iter([*self.defaults, *set_])

    def __len__(self) -> int:
        return len(list(iter(self)))

    def is_set(self, name: str) -> bool:
        """The config names this threshold (a number or ``null``)."""
        return name in self.overrides

    @property
    def informational(self) -> frozenset[str]:
        """Metrics the config set to ``null``: reported, never judged against a threshold."""
        return frozenset(k for k, v in self.overrides.items() if v is None)


def cause_limit(thresholds: Mapping[str, float], name: str) -> float:
    """The limit past which a check may name a cause from the metric ``name`` (a higher-is-bad
    one): the effective threshold, never below the check's calibrated default.

    A threshold the config tightened below its default fails the check by the verdict's plain
    breach (``threshold_breach``), never by a finding that asserts a cause: the causes a check
    names are calibrated against its defaults, not against a tighter limit that the model's own
    noise may cross."""
    value = float(thresholds[name])
    if isinstance(thresholds, Thresholds) and name in thresholds.defaults:
        return max(value, float(thresholds.defaults[name]))
    return value


NEEDS: Mapping[str, str] = {
    "models": "the family's loaded inputs: tokenizers, probes, models and engines (models and "
              "engines load as first used)",
    "reward": "the causal-LM reward setup: `causal_lm.reward` validated, its tokenizer loaded "
              "and its completions read",
    "kl_reference": "the causal-LM KL reference setup: `causal_lm.reference` validated against "
                    "the training model and tokenizer, its KL function imported",
    "behaviour": "behaviour_parity's setup: `causal_lm.behaviour`'s dumps scanned, its reward "
                 "function imported, a source (dump or sampler) per side",
}
"""What a check may need from its family (``CheckSpec.needs``), and what each one loads. Any
need builds the family's loaded context; the setups beyond ``models`` are built only for a
run whose selected checks need them."""


def needs_of(specs: Iterable[CheckSpec]) -> frozenset[str]:
    """What a run of ``specs`` needs the family to build: the union of their needs."""
    return frozenset(need for spec in specs for need in spec.needs)


Measure = Callable[[Any, Thresholds], Measurement]
"""One family's measurement, ``measure(ctx, thresholds)``. Each check types its function on
that family's context (``PolicyContext``, ``LMContext``, ``HFModelContext``); the gate hands
it the context built for the config's family."""


@dataclass(frozen=True)
class CheckSpec:
    """One checklist item.

    ``measures`` holds one measurement per family the check applies to: ``measure(ctx,
    thresholds)`` receives that family's context (a loaded policy or language model) and the
    effective thresholds (``defaults`` overridden by the config) and returns a
    :class:`~paritygate.result.Measurement`. It never asserts, prints, reads the golden file
    or asks which family it is measuring.
    """

    id: str
    summary: str
    measures: Mapping[str, Measure]
    defaults: Mapping[str, float] = field(default_factory=dict)
    marks: tuple[str, ...] = ("fast",)
    feeds_probes: bool = False
    """The check runs the models on the family's model-input probes: its record says how
    many probe rows the context left out of them (NaN/Inf observations) and why."""
    kinds: tuple[str, ...] = ()
    """The finding kinds the check records (``Measurement.fail(kind, ...)``); registering the
    spec declares them, and recording any other kind raises."""
    unasked: Callable[[Any], str | None] | None = None
    """For a check that starts an engine the config may not use (vLLM): ``unasked(ctx)`` says
    why the config did not ask for it, or ``None`` when it did. The gate then skips the check
    with that reason unless the run names it (``--check``, ``checks:``) or selects it by its
    own marks (``-m vllm``): see :meth:`~paritygate.gate.Gate.asked_for`."""

    needs: tuple[str, ...] = ("models",)
    """What the check needs the family to load and validate for it (:data:`NEEDS` names them):
    the gate builds the context for the union of its selected checks' needs, so a setup
    (a reward model, a KL reference) is read only when a check that uses it runs, and a
    bad block is refused before any model loads. ``()``: the check reads only config files
    (:attr:`config_only`)."""
    downstream: bool = False
    """The check measures what the models compute (outputs, log-probs, generations): a fault
    in the weights they load fails it too. Root-cause edges on the weights explain these
    checks by this declaration (:attr:`paritygate.causes.Explanation.downstream`), not by a
    list of ids."""

    def __post_init__(self) -> None:
        unknown = [n for n in self.needs if n not in NEEDS]
        if unknown:
            raise ValueError(f"check {self.id!r} needs {', '.join(unknown)}: not one of "
                             f"{', '.join(NEEDS)}")
        declare_kinds(self.id, self.kinds)

    @property
    def config_only(self) -> bool:
        """The check needs nothing that loads: it reads only config files (sampling configs,
        ``config.json``), never a tokenizer, model or engine. A run of such checks alone
        builds the family's config-only context, which imports no torch or transformers
        (see :meth:`paritygate.gate.Gate.context`)."""
        return not self.needs

    @property
    def families(self) -> tuple[str, ...]:
        """The families the check applies to, in declaration order."""
        return tuple(self.measures)


def selects_by_marks(markexpr: str | None, marks: tuple[str, ...]) -> bool:
    """True when the ``-m`` expression selects an item because it carries ``marks``: it
    matches an item with those marks and not an item with none (``vllm``, ``fast or vllm``;
    not ``not fast``, which selects everything unmarked too). No or a malformed expression
    selects nothing by mark."""
    if not markexpr:
        return False
    try:
        from _pytest.mark.expression import Expression

        expression = Expression.compile(markexpr)
        with_marks = expression.evaluate(lambda name, /, **kw: not kw and name in marks)
        without = expression.evaluate(lambda name, /, **kw: False)
    except Exception:  # pytest moved it (ImportError), ParseError, an unsupported matcher
        return False
    return bool(with_marks and not without)

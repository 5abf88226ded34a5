"""What an artifact's weight initializers say about where it came from, named for
``export_integrity``: how many match the checkpoint's tensors, another checkpoint of this model,
a target network served, and a weight precision the config does not declare."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paritygate.causes import provenance_only
from paritygate.provenance import InitializerMatch
from paritygate.records import Record

if TYPE_CHECKING:
    from paritygate.result import CheckResult, Measurement


@dataclass(frozen=True)
class InitializerRecord(Record):
    """export_integrity's record of how the artifact's initializers match the checkpoint."""

    initializers: InitializerMatch


def _initializers(c: CheckResult) -> InitializerMatch | None:
    record = InitializerRecord.read(c.details)
    return None if record is None else record.initializers


# --- root-cause edges on export_integrity: do its initializers account for its failure? ---


def not_loaded_explains_provenance(root: CheckResult, c: CheckResult) -> bool:
    """The artifact carries the checkpoint's tensors; the inference model does not."""
    inits = _initializers(c)
    return provenance_only(c) and inits is not None and bool(inits.not_in_model)


def bn_stats_explain_provenance(root: CheckResult, c: CheckResult) -> bool:
    """Only BatchNorm statistics initializers differ from the checkpoint's."""
    inits = _initializers(c)
    unmatched = inits.unmatched if inits is not None else []
    return provenance_only(c) and not (inits is not None and inits.misplaced) and all(
        n.endswith((".running_mean", ".running_var")) for n in unmatched)


def same_output_gap(root: CheckResult, c: CheckResult) -> bool:
    """export_integrity measured the gap logits_agreement names (every initializer matches)."""
    inits = _initializers(c)
    gap, own = root.metrics.get("max_abs_diff"), c.metrics.get("provenance_max_abs_diff")
    return (provenance_only(c) and not (inits is not None and inits.unmatched)
            and isinstance(gap, float) and isinstance(own, float)
            and abs(gap - own) <= 1e-6 + 1e-3 * abs(gap))


def describe_matches(matches: InitializerMatch) -> str:
    n = matches.comparable
    if not n:
        return "no weight initializer to match against the checkpoint"
    text = f"{matches.matched}/{n} weight initializers match checkpoint tensors"
    if matches.folded:
        text += f", {matches.folded} more up to a per-channel scale (BatchNorm folded)"
    return text


def another_checkpoint(matches: InitializerMatch) -> bool:
    """Most initializers have their role tensor's shape and values a little off (relative
    drift at most 5%): the same graph exported from another checkpoint of this model."""
    drifted = matches.drifted
    return (not matches.misplaced and len(drifted) * 2 > matches.comparable
            and 0 < matches.max_rel_drift <= 0.05)


def why_differs(matches: InitializerMatch, match_text: str) -> str:
    """What the initializers say about outputs that differ although most weights match."""
    unmatched = matches.unmatched
    if unmatched and all(n.endswith((".running_mean", ".running_var")) for n in unmatched):
        return (f"{match_text}; those that do not: {unmatched[:4]} are BatchNorm statistics "
                "(see batchnorm_export)")
    if unmatched:
        return (f"{match_text}; those that do not hold other values than the checkpoint's "
                f"tensors of their name: {unmatched[:4]} (a layer exported from another "
                "checkpoint, or changed after export)")
    return f"{match_text} (the graph around them differs: see logits_agreement)"


def target_network_finding(m: Measurement, matches: InitializerMatch) -> dict[str, str]:
    """Name an artifact built from a target network: initializers whose values only a target
    network's tensors hold (``q_net_target``, ``actor_target``); its mapping, empty if none."""
    targets: dict[str, str] = dict(matches.target_network)
    if not targets:
        return targets
    nets = list(matches.target_networks)
    pairs = ", ".join(f"{k!r} = {v!r}" for k, v in list(targets.items())[:3])
    m.fail("target_network_served",
           f"the artifact was built from the target network {', '.join(nets)}: "
           f"{len(targets)}/{matches.comparable} of its weight initializers hold that "
           f"network's tensors, not the policy's ({pairs}); a target network is a "
           "training-only copy that lags behind the policy", metric="stale_checkpoint")
    return targets


def precision_finding(m: Measurement, precision: Any) -> bool:
    """Name the artifact's weight precision; a conversion the config does not declare (or a
    declared one the artifact does not have) is a finding. Returns whether it was one."""
    stored, declared = precision.stored, precision.declared
    cast = (f"{precision.share()} weight initializers are this checkpoint's tensors cast to "
            f"{stored}")
    if not precision.undeclared:
        if stored != "float32":
            m.note(f"precision conversion: the artifact stores {stored} weights, as "
                   f"policy.artifact_dtype declares ({cast})")
        return False
    if stored != "float32":
        m.fail("undeclared_precision",
               f"precision conversion: the artifact stores its weights in {stored} ({cast}, "
               f"provenance proven against the cast checkpoint), but policy.artifact_dtype is "
               f"{declared}: set policy.artifact_dtype: {stored} so the gate judges the "
               f"artifact by its precision tier, or export the artifact in {declared}",
               metric="undeclared_precision")
    else:
        m.fail("precision_not_stored",
               f"policy.artifact_dtype declares {declared}, but the artifact's weight "
               f"initializers are float32: set policy.artifact_dtype: float32 (the gate would "
               f"judge a float32 artifact by the looser {declared} tier)",
               metric="undeclared_precision")
    return True

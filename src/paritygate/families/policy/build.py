"""Build the policy context: load and validate every input of a policy gate (exit code 2 on
bad input, before any check runs)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from paritygate.errors import InputError, keyed
from paritygate.families.policy.context import PolicyContext
from paritygate.families.policy.distribution import check_distribution
from paritygate.families.policy.loading import load_into
from paritygate.families.policy.probes import (
    finite_rows,
    input_preprocessors,
    load_probes,
    reference_inputs,
)
from paritygate.families.policy.recurrent import initial_states, step_state
from paritygate.families.policy.sides import build_model
from paritygate.families.policy.validation import (
    check_files,
    check_forward_call,
    check_policy_output,
)

if TYPE_CHECKING:
    from paritygate.config import GateConfig


def build_policy_context(
    config: GateConfig, *, export_dir: Path | None = None, force_export: bool = False
) -> PolicyContext:
    """Load and validate every input of a policy gate."""
    spec = config.policy
    assert spec is not None
    check_files(config, spec)
    import torch

    from paritygate.checkpoints import load_checkpoint_state, read_checkpoint

    torch.manual_seed(config.seed)
    ckpt = spec.checkpoint
    with keyed("policy.checkpoint"):
        data, sha = read_checkpoint(ckpt)  # one read: the digest and the tensors
        stat_before = stamp(ckpt)
        state, source = load_checkpoint_state(ckpt, allow_pickle=config.allow_pickle, data=data,
                                              state_dict_key=spec.state_dict_key)
        del data
    reference = build_model(spec.training_factory, "policy.training_factory", config, spec)
    heads_removed = build_model(spec.inference_factory, "policy.inference_factory", config, spec)
    check_forward_call(config, spec, reference, "training")
    check_forward_call(config, spec, heads_removed, "inference")
    reference_load = load_into(reference, state)
    heads_removed_load = load_into(heads_removed, state,
                                   ignore_prefixes=tuple(spec.training_heads))
    reference.eval()
    heads_removed.eval()

    raw = load_probes(config, spec)
    finite_raw, dropped = finite_rows(config, spec, raw)
    pres = input_preprocessors(config, spec)
    inputs: dict[str, np.ndarray] = {}
    for name, values in finite_raw.items():
        inputs.update(reference_inputs(config, spec, pres, {name: values}))
        if not np.all(np.isfinite(inputs[name])):
            raise InputError(
                config.path,
                f"{spec.preprocessing_key(name)}.training",
                "training preprocessing turns finite probes into NaN/Inf",
            )
    feeds = {**inputs, **step_state(spec, initial_states(config, spec),
                                    len(next(iter(inputs.values()))), start=False)}
    check_policy_output(config, spec, reference, feeds)

    given = None
    if spec.artifact is not None and not force_export:
        from paritygate.reading import check_input

        given = check_input(spec.artifact, "policy.artifact", what="artifact")
    if stamp(ckpt) != stat_before:
        raise InputError(ckpt, None, "checkpoint changed while the gate was reading it")
    ctx = PolicyContext(
        config=config,
        spec=spec,
        checkpoint_path=ckpt,
        checkpoint_sha256=sha,
        state=state,
        reference_model=reference,
        heads_removed_model=heads_removed,
        reference_load=reference_load,
        heads_removed_load=heads_removed_load,
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
    check_distribution(config.path, spec, state,
                       lambda: ctx.reference_results[ctx.output_name])
    if given is not None or force_export:
        ctx.candidate  # noqa: B018 - a configured artifact is validated before any check runs
    if given is not None:
        from paritygate.families.policy.export import read_manifest

        read_manifest(ctx.manifest_path)  # unreadable or not a mapping: bad input, up front
    return ctx


def stamp(path: Path) -> tuple[int, int, int]:
    """What changes when a file is rewritten: inode, size and modification time."""
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns

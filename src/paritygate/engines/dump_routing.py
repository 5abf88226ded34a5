"""The ``routed_experts`` field of a rollout dump record: the experts the engine routed each
token to, for a mixture-of-experts policy (what routing replay records).

Layout, as vLLM returns it (``CompletionOutput.routed_experts``, ``[seq_len, layers, top_k]``)
and verl / NeMo RL carry it: one entry per token position the engine ran, prompt tokens first,
then the completion's; the last completion token is never fed back, so an engine may report
``len(prompt_ids) + len(completion_ids) - 1`` positions or one more. Each position holds one
list per MoE layer (in layer order), each of ``top_k`` expert ids in ``[0, num_experts)``.
"""

from __future__ import annotations

from pathlib import Path

from paritygate.errors import InputError

ROUTED_EXPERTS_SCHEMA = {
    "type": ["array", "null"],
    "items": {"type": "array", "items": {"type": "array",
                                         "items": {"type": "integer", "minimum": 0}}},
}
"""JSON Schema of the field (``schemas/rollout_dump.schema.json``)."""


def validate_routed_experts(
    path: Path, where: str, value: object, positions: int, num_experts: int | None = None,
) -> list[list[list[int]]]:
    """The field as nested int lists, checked: ``positions - 1`` or ``positions`` entries (the
    record's prompt plus completion length), one shape ``(layers, top_k)`` throughout, ids in
    ``[0, num_experts)`` when the model's expert count is known. Bad input names the field."""
    key = f"{where}: routed_experts"
    if not isinstance(value, list) or not all(isinstance(p, list) for p in value):
        raise InputError(path, key, "must be a list (per token) of lists (per MoE layer) of "
                                    "expert ids")
    if len(value) not in (positions - 1, positions):
        raise InputError(path, key, f"{len(value)} positions; the record has {positions} "
                                    f"tokens (prompt + completion), so {positions - 1} or "
                                    f"{positions} are expected")
    shape: tuple[int, int] | None = None
    out: list[list[list[int]]] = []
    for t, layers in enumerate(value):
        rows = []
        for layer in layers:
            if not isinstance(layer, list) or not all(
                    isinstance(e, int) and not isinstance(e, bool) for e in layer):
                raise InputError(path, f"{key}[{t}]", "each layer's entry must be a list of "
                                                      "integer expert ids")
            bad = [e for e in layer if e < 0 or (num_experts is not None and e >= num_experts)]
            if bad:
                bound = f"[0, {num_experts})" if num_experts is not None else ">= 0"
                raise InputError(path, f"{key}[{t}]", f"expert id {bad[0]} out of range "
                                                      f"{bound} (the model's num_experts)")
            rows.append(list(layer))
        here = (len(rows), len(rows[0]) if rows else 0)
        if shape is None:
            shape = here
        elif here != shape or any(len(r) != here[1] for r in rows):
            raise InputError(path, f"{key}[{t}]", f"shape differs from position 0's "
                                                  f"{shape[0]} layers x top-{shape[1]}")
        out.append(rows)
    return out


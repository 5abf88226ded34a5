"""The ``serving`` section folded into the engine, tokenizer and sampling keys it shares.

The served model may be named in ``causal_lm.serving`` or in the older per-part keys
(``engine.model_dir``, ``tokenizer.serving``, ``sampling.serving``); two different values
for one part are bad input naming both keys. Absent, the training directory is served.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from paritygate.errors import InputError

if TYPE_CHECKING:
    from paritygate.config import GateConfig
    from paritygate.config.causal_lm import CausalLMSpec


_V = TypeVar("_V")


def _pick(
    cfg: Path, pairs: list[tuple[str, _V | None]], what: str
) -> tuple[str | None, _V | None]:
    """The one value set among ``(key, value)`` pairs; two different values are an error."""
    chosen = [(k, v) for k, v in pairs if v is not None]
    for key, value in chosen[1:]:
        if value != chosen[0][1]:
            raise InputError(
                cfg, key,
                f"{what} {str(value)!r} contradicts {chosen[0][0]} = {str(chosen[0][1])!r}"
            )
    return chosen[0] if chosen else (None, None)


def resolve_serving(
    config: GateConfig, spec: CausalLMSpec
) -> tuple[CausalLMSpec, str, dict[str, str]]:
    """Fold the ``serving`` section into the engine/tokenizer/sampling keys it shares; what the
    config leaves out comes from the served directory's own files
    (:mod:`~paritygate.families.causal_lm.served_files`).

    Returns the effective spec, the key the served directory came from, and where each
    serving input the config states came from (``tokenizer``, ``sampling``, ``dtype``: the
    config key, or for the dtype the served ``config.json``); absent parts are defaults.
    """
    from paritygate.families.causal_lm.served_files import served_dtype

    cfg = config.path
    srv = spec.serving
    dir_key, served = _pick(
        cfg,
        [("causal_lm.serving.model_dir", srv.model_dir),
         ("causal_lm.engine.model_dir", spec.engine.model_dir)],
        "serving model_dir",
    )
    served_from = dir_key or "causal_lm.model_dir"
    dtypes: list[tuple[str, str | None]] = [
        ("causal_lm.serving.dtype", srv.dtype),
        ("causal_lm.engine.dtype",
         spec.engine.dtype if "dtype" in spec.engine.model_fields_set else None)]
    dtype_key, dtype = _pick(cfg, dtypes, "serving dtype")
    tok_key, tok = _pick(
        cfg,
        [("causal_lm.serving.tokenizer", srv.tokenizer),
         ("causal_lm.tokenizer.serving", spec.tokenizer.serving)],
        "serving tokenizer",
    )
    gen_key, gen = _pick(
        cfg,
        [("causal_lm.serving.generation_config", srv.generation_config),
         ("causal_lm.sampling.serving", spec.sampling.serving)],
        "serving sampling config",
    )
    served_dir = served if served else spec.model_dir
    if served and not served_dir.is_dir():  # before anything is looked for inside it
        raise InputError(cfg, dir_key, f"serving model directory not found: {served_dir}")
    if gen is None:
        candidate = served_dir / "generation_config.json"
        if not candidate.is_file():
            raise InputError(
                cfg,
                "causal_lm.sampling.serving",
                f"no serving sampling config: set it (or serving.generation_config); "
                f"{candidate} does not exist",
            )
        gen = str(candidate)
    if tok is None and served:
        tok = served
    sources = {part: key for part, key in
               (("tokenizer", tok_key), ("sampling", gen_key), ("dtype", dtype_key)) if key}
    own_dtype = served_dtype(served_dir) if dtype is None else None
    if own_dtype is not None and own_dtype != "float32":
        # the served directory's own config.json: the dtype vLLM (`auto`) and transformers
        # load it in; float32 is the engine default anyway
        dtype = own_dtype
        sources["dtype"] = f"{served_dir.name}/config.json dtype"
    engine = spec.engine.model_copy(
        update={"model_dir": served, "dtype": dtype or spec.engine.dtype}
    )
    update: dict[str, Any] = {
        "engine": engine,
        "tokenizer": spec.tokenizer.model_copy(update={"serving": tok}),
        "sampling": spec.sampling.model_copy(update={"serving": gen}),
    }
    if srv.engine is not None and "engines" not in spec.model_fields_set:
        update["engines"] = [srv.engine]
    return spec.model_copy(update=update), served_from, sources


def declared_serving_dtype(spec: CausalLMSpec) -> tuple[str, str] | None:
    """``(config key, dtype)`` where the config itself states the serving dtype, else ``None``
    (the engine's default dtype)."""
    if spec.serving.dtype is not None:
        return "causal_lm.serving.dtype", spec.serving.dtype
    if "dtype" in spec.engine.model_fields_set:
        return "causal_lm.engine.dtype", spec.engine.dtype
    return None

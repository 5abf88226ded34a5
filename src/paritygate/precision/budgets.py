"""Error budgets derived from the number format, with per-layer glob overrides.

The unit roundoff of a binary format with ``p`` significand bits (the implicit
bit included) is ``u = 2^-p``: rounding a real number to the nearest
representable value changes it by a relative error of at most ``u`` and, for
values spread over many binades, by about ``u / sqrt(3)`` RMS. Hence:

* float16 (p = 11): u = 2^-11 ~ 4.9e-4;  bfloat16 (p = 8): u = 2^-8 ~ 3.9e-3;
  float32 (p = 24): u = 2^-24 ~ 6.0e-8.
* **Local budget** of a layer (its own relative L2 error when it runs in low
  precision on exact fp32 inputs): ``k_local * u``. Rounding the input, the
  weights and the output each contribute ~``u/sqrt(3)``; a whole transformer
  block measures 1-3 u; ``k_local = 16`` (the default) leaves a factor of ~5 for
  well-conditioned layers, so only a numerically fragile layer (overflow,
  cancellation, subnormal activations) breaches it.
* **Output budget** (relative L2 error of the model output, whole model in low
  precision): ``k_out * u * sqrt(D)``, ``D`` the number of parameterised layers
  executed. Independent rounding errors of ``D`` layers add in quadrature, so
  the expected output error grows like ``sqrt(D)`` times a per-layer error of a
  few u; ``k_out = 8`` by default.

Per-layer overrides are given in units of u (``{glob: k}``), so one value
means the same relative care for every dtype.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fnmatch import fnmatchcase

SIGNIFICAND_BITS: dict[str, int] = {"float16": 11, "bfloat16": 8, "float32": 24}
SHORT: dict[str, str] = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def unit_roundoff(dtype: str) -> float:
    """``u = 2^-p`` for a dtype name (``float16``, ``bfloat16``, ``float32``)."""
    try:
        return 2.0 ** -SIGNIFICAND_BITS[dtype]
    except KeyError:
        raise ValueError(f"no unit roundoff known for dtype {dtype!r}") from None


def local_budget_ulps(
    layer: str, dtype: str, default_k: float, overrides: Mapping[str, float]
) -> float:
    """The budget multiplier k for one layer: the last matching override, else ``default_k``."""
    k = default_k
    for pattern, value in overrides.items():
        if fnmatchcase(layer, pattern) or fnmatchcase(f"{dtype}/{layer}", pattern):
            k = float(value)
    return k


def local_budget(layer: str, dtype: str, default_k: float, overrides: Mapping[str, float]) -> float:
    """Relative L2 budget of a layer's local error: ``k * u(dtype)``."""
    return local_budget_ulps(layer, dtype, default_k, overrides) * unit_roundoff(dtype)


def output_budget(dtype: str, k_out: float, depth: int) -> float:
    """Relative L2 budget of the model output: ``k_out * u(dtype) * sqrt(max(depth, 1))``."""
    return k_out * unit_roundoff(dtype) * math.sqrt(max(depth, 1))


def short_name(dtype: str) -> str:
    """Metric prefix of a dtype: ``fp16``, ``bf16``, ``fp32``."""
    return SHORT.get(dtype, dtype)

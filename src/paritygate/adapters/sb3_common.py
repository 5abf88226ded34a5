"""What the Stable-Baselines3 adapters share: the optional imports and SB3's ``net_arch``."""

from __future__ import annotations

from types import ModuleType

from paritygate.errors import MissingExtra

NetArch = list[int] | dict[str, list[int]]
"""SB3's ``net_arch``: one list for both sides, or ``{pi: [...], vf: [...]}``."""


def gym() -> ModuleType:
    """``gymnasium``, or :class:`MissingExtra` naming the ``sb3`` extra."""
    try:
        import gymnasium
    except ImportError:
        raise MissingExtra("stable-baselines3", "sb3") from None
    return gymnasium


def arch(net_arch: NetArch | None, default: list[int]) -> NetArch:
    """``net_arch`` as SB3 takes it (a copy; ``default`` when unset)."""
    if net_arch is None:
        return list(default)
    if isinstance(net_arch, dict):
        return {side: [int(d) for d in layers] for side, layers in net_arch.items()}
    return [int(d) for d in net_arch]

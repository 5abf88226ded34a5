"""The KL reference of the RL loop (``causal_lm.reference``): its inputs, validated once.

PPO and GRPO hold the policy to a frozen *KL reference*, normally the initial policy. This
module reads and checks that block before any check runs: the reference directory (same
architecture, vocabulary and tokenizer as the policy), the initial policy it must equal (a
directory or a recorded sha256), the trainer's reference log-prob function and its KL
estimator (``k1``, ``k2``, ``k3`` or ``module:callable(logp, logp_ref, mask)``). It also holds
the pieces ``reference_parity`` measures with: the tensor digest and the estimator forms.

Vocabulary: elsewhere in the causal-LM family ``reference`` is the training path; here it is
always the *KL reference model*, and the context holds it as ``kl_reference``.
"""

from __future__ import annotations

import hashlib
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paritygate.errors import InputError, keyed
from paritygate.reading_text import read_json

if TYPE_CHECKING:
    from torch import Tensor

    from paritygate.config import GateConfig
    from paritygate.config.causal_lm import CausalLMSpec
    from paritygate.families.causal_lm.tokenizer import Tokenizer

KEY = "causal_lm.reference"
SHA256 = re.compile(r"^(sha256:)?[0-9a-fA-F]{64}$")
ARCHITECTURE_FIELDS = ("model_type", "architectures", "vocab_size", "hidden_size",
                       "num_hidden_layers", "num_attention_heads")
"""``config.json`` fields the reference must share with the policy: the KL is a per-token
comparison of two distributions over one vocabulary, computed by the same architecture."""


# -- KL estimators --------------------------------------------------------------------------
# Per token, with r = logp_ref - logp (the log-ratio pi_ref / pi on a token sampled from pi).
# J. Schulman, "Approximating KL Divergence" (2020): k1 = -r, k2 = r^2 / 2, k3 = e^r - 1 - r;
# k1 and k3 are unbiased for KL(pi || pi_ref), k3 is never negative; k2 is biased (second order).


def k1(logp: Tensor, logp_ref: Tensor, mask: Tensor | None = None) -> Tensor:
    """``logp - logp_ref``: unbiased, can be negative per token."""
    return logp - logp_ref


def k2(logp: Tensor, logp_ref: Tensor, mask: Tensor | None = None) -> Tensor:
    """``(logp - logp_ref)^2 / 2``: low variance, biased."""
    return 0.5 * (logp - logp_ref) ** 2


def k3(logp: Tensor, logp_ref: Tensor, mask: Tensor | None = None) -> Tensor:
    """``exp(logp_ref - logp) - (logp_ref - logp) - 1``: unbiased and non-negative (TRL GRPO's
    ``per_token_kl``)."""
    import torch

    r = logp_ref - logp
    return torch.exp(r) - r - 1


ESTIMATORS = {"k1": k1, "k2": k2, "k3": k3}


def estimator_forms(logp: Tensor, logp_ref: Tensor) -> dict[str, Tensor]:
    """Per-entry values of each known estimator form and its faulty twins (negated, k3 with
    its arguments swapped): what ``reference_parity`` recognises a trainer's estimator as."""
    return {
        "k3": k3(logp, logp_ref), "k1": k1(logp, logp_ref), "k2": k2(logp, logp_ref),
        "-k1": -k1(logp, logp_ref), "-k3": -k3(logp, logp_ref), "-k2": -k2(logp, logp_ref),
        "k3_swapped": k3(logp_ref, logp),
    }


def state_digest(state: dict[str, Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order: equal for two
    checkpoints holding the same tensors whatever their file layout or metadata."""
    import torch

    h = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        h.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
        h.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def digest_dir(directory: str | Path) -> str:
    """:func:`state_digest` of a model directory's safetensors tensors (what to record as
    ``reference.initial`` at the start of training)."""
    from paritygate.families.causal_lm.weights import read_state

    return state_digest(read_state(Path(directory)))


@dataclass
class ReferenceSetup:
    """The validated ``causal_lm.reference`` block."""

    model_dir: Path
    initial_dir: Path | None
    initial_sha256: str | None
    logprob_fn: Any
    logprob_fn_name: str
    kl_fn: Any
    kl_name: str
    files_sha256: str
    dtype: str | None
    """The declared stored dtype (``None``: the initial policy's)."""
    load_dtype: str
    trust_remote_code: bool = False
    kl_output: str = "token"
    """What the estimator returns: ``token`` (``(B, T)``, one term per entry) or ``sequence``
    (``(B,)``, its terms reduced over the mask)."""
    kl_reduction: str = "mean"
    """How a per-sequence estimator reduces over the mask (``mean`` or ``sum``)."""
    _model: Any = field(default=None, repr=False)

    @property
    def kl_is_named(self) -> bool:
        return self.kl_name in ESTIMATORS

    def kl_terms(self, logp: Tensor, logp_ref: Tensor) -> Tensor:
        """The estimator's term on every entry of ``logp`` (any shape): a per-sequence
        estimator is called with each entry as a sequence of one token (its mean and its
        sum are then the term itself)."""
        import torch

        with torch.inference_mode():
            if self.kl_output == "token":
                out: Tensor = self.kl_fn(logp, logp_ref, torch.ones_like(logp))
                return out
            flat = logp.reshape(-1, 1)  # (N, 1)
            seq: Tensor = self.kl_fn(flat, logp_ref.reshape(-1, 1), torch.ones_like(flat))
            return seq.reshape(logp.shape) if seq.numel() == logp.numel() else seq

    def state(self) -> dict[str, Tensor]:
        from paritygate.families.causal_lm.weights import read_state

        return read_state(self.model_dir)

    def initial_state(self) -> dict[str, Tensor] | None:
        from paritygate.families.causal_lm.weights import read_state

        return None if self.initial_dir is None else read_state(self.initial_dir)

    def digest(self, state: dict[str, Tensor]) -> str:
        """:func:`state_digest` of ``state``."""
        return state_digest(state)

    def compare_with_initial(
        self, state: dict[str, Tensor], training_only: list[str], tied_in: Any = None
    ) -> Any:
        """The reference's tensors against the initial policy's
        (:class:`~paritygate.families.causal_lm.weights.WeightsDiff`), ``None`` without an
        initial directory. ``tied_in``: a model of the architecture whose tied weights (an
        ``lm_head.weight`` stored separately by an export) are compared with the tensor they
        are tied to."""
        from paritygate.families.causal_lm.weights import compare_states, tied_groups

        initial = self.initial_state()
        if initial is None:
            return None
        tied = tied_groups(tied_in) if tied_in is not None else []
        return compare_states(initial, state, training_only, tied)

    @staticmethod
    def rl_layout(seqs: list[list[int]], pad: int, eos: int) -> tuple[Tensor, Tensor]:
        return rl_layout(seqs, pad, eos)

    @staticmethod
    def maskless_logprobs(logits: Tensor, ids: Tensor) -> Tensor:
        return maskless_logprobs(logits, ids)

    @staticmethod
    def estimator_forms(logp: Tensor, logp_ref: Tensor) -> dict[str, Tensor]:
        return estimator_forms(logp, logp_ref)

    def model(self) -> Any:
        """The reference model (eval mode), loaded once, in its stored dtype."""
        if self._model is None:
            from paritygate.engines.hf_loading import load_causal_lm

            with keyed(f"{KEY}.model_dir"):
                self._model = load_causal_lm(self.model_dir, self.load_dtype,
                                             trust_remote_code=self.trust_remote_code)[0]
        return self._model.eval()


def _architecture(directory: Path, key: str) -> dict[str, Any]:
    path = directory / "config.json"
    data = read_json(path, key, what="config.json")
    if not isinstance(data, dict):
        raise InputError(path, key, "config.json is not a mapping")
    return {f: data.get(f) for f in ARCHITECTURE_FIELDS}


def _same_architecture(config: GateConfig, directory: Path, policy_dir: Path, key: str) -> None:
    theirs, ours = _architecture(directory, key), _architecture(policy_dir, "causal_lm.model_dir")
    for name in ARCHITECTURE_FIELDS:
        if theirs[name] != ours[name]:
            raise InputError(
                config.path, key,
                f"{name} {theirs[name]!r} differs from the policy's {ours[name]!r} "
                f"({directory}): the KL reference must be the policy's architecture",
            )


def _model_dir(config: GateConfig, value: str | Path, key: str, policy_dir: Path) -> Path:
    from paritygate.engines.hf_loading import check_model_dir

    directory = config.resolve(value)
    if not (directory / "config.json").is_file():
        raise InputError(config.path, key, f"no HF model directory at {directory}")
    with keyed(key):
        check_model_dir(directory, trust_remote_code=config.trust_remote_code)
    _same_architecture(config, directory, policy_dir, key)
    return directory


def _same_tokenizer(config: GateConfig, directory: Path, training_tok: Tokenizer) -> None:
    """A reference saved with its own tokenizer must encode like the policy's."""
    if not any((directory / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
        return
    from paritygate.families.causal_lm.tokenizer import load_tokenizer

    key = f"{KEY}.model_dir"
    with keyed(key):
        tok = load_tokenizer(directory, trust_remote_code=config.trust_remote_code)
    if tok.get_vocab() != training_tok.get_vocab():
        raise InputError(config.path, key,
                         f"the tokenizer in {directory} has another vocabulary than the "
                         "policy's training tokenizer")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(tok, name, None) != getattr(training_tok, name, None):
            raise InputError(config.path, key,
                             f"the tokenizer in {directory} has {name} "
                             f"{getattr(tok, name, None)} vs the policy's "
                             f"{getattr(training_tok, name, None)}")


def _kl_fn(config: GateConfig, name: str) -> tuple[Any, str]:
    """The estimator and what it returns (``token`` or ``sequence``), probed once on a small
    batch: any other output shape, or an exception, is bad input naming the key."""
    from paritygate.imports import guard_user_code, import_callable

    key = f"{KEY}.kl_estimator"
    if name in ESTIMATORS:
        return ESTIMATORS[name], "token"
    if ":" not in name:
        raise InputError(config.path, key,
                         f"expected k1, k2, k3 or 'module:callable', got {name!r}")
    fn = import_callable(name, config.path, key)
    try:
        inspect.signature(fn).bind(None, None, None)
    except TypeError:
        raise InputError(config.path, key,
                         f"{name} takes {inspect.signature(fn)}; expected "
                         "(logp, logp_ref, mask)") from None
    except ValueError:
        pass  # a builtin without a signature: probed below
    guarded = guard_user_code(fn, config.path, key)
    return guarded, _kl_output(guarded, config, name, key)


def _kl_output(fn: Any, config: GateConfig, name: str, key: str) -> str:
    """``token`` when ``fn`` returns ``(B, T)`` for ``(B, T)`` log-probs, ``sequence`` when
    it returns ``(B,)``; else bad input naming ``key`` and the shapes it accepts."""
    import torch

    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(2, 5, generator=gen, dtype=torch.float64) - 0.1  # (B, T)
    logp_ref = logp - 0.1 * torch.randn(2, 5, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 0, 0]], dtype=torch.float64)
    with torch.inference_mode():
        out = fn(logp, logp_ref, mask)
    shape = tuple(out.shape) if hasattr(out, "shape") else type(out).__name__
    if shape == (2, 5):
        return "token"
    if shape == (2,):
        return "sequence"
    raise InputError(config.path, key,
                     f"{name} returns {shape} for (2, 5) log-probs and mask; expected (2, 5) "
                     "(the per-token KL term) or (2,) (one value per sequence, reduced over "
                     "the mask)")


def load_reference(
    config: GateConfig, spec: CausalLMSpec, policy_dir: Path, training_tok: Tokenizer
) -> ReferenceSetup | None:
    """Validate ``causal_lm.reference`` (``None`` when absent); raises :class:`InputError`
    naming the key of the first bad input."""
    from paritygate.engines.hf_loading import safetensors_files
    from paritygate.families.causal_lm.logprobs import as_model_level
    from paritygate.imports import guard_user_code, import_callable
    from paritygate.provenance import sha256_files
    from paritygate.sections.reference_parity import ReferenceSpec

    ref = ReferenceSpec.of(spec)
    if ref is None:
        return None
    model_dir = _model_dir(config, ref.model_dir, f"{KEY}.model_dir", policy_dir)
    _same_tokenizer(config, model_dir, training_tok)
    with keyed(f"{KEY}.model_dir"):
        files = safetensors_files(model_dir)
    initial_dir: Path | None = None
    initial_sha: str | None = None
    if SHA256.match(ref.initial.strip()):
        initial_sha = ref.initial.strip().removeprefix("sha256:").lower()
        if ref.dtype is not None:
            raise InputError(config.path, f"{KEY}.initial",
                             f"a sha256 proves a full-precision copy only; a reference declared "
                             f"{ref.dtype} is proven against the initial policy's directory")
    else:
        candidate = config.resolve(ref.initial)
        if not candidate.is_dir():
            raise InputError(config.path, f"{KEY}.initial",
                             f"neither a model directory nor a sha256: {ref.initial!r}")
        initial_dir = _model_dir(config, ref.initial, f"{KEY}.initial", policy_dir)
    fn_key = f"{KEY}.logprob_fn" if ref.logprob_fn else "causal_lm.training.logprob_fn"
    fn_name = ref.logprob_fn or spec.training.logprob_fn
    convention = ref.logprob_convention if ref.logprob_fn else spec.training.logprob_convention
    logprob_fn = guard_user_code(
        as_model_level(import_callable(fn_name, config.path, fn_key), convention),
        config.path, fn_key,
    )
    kl_fn, kl_output = _kl_fn(config, ref.kl_estimator)
    return ReferenceSetup(
        model_dir=model_dir,
        initial_dir=initial_dir,
        initial_sha256=initial_sha,
        logprob_fn=logprob_fn,
        logprob_fn_name=fn_name,
        kl_fn=kl_fn,
        kl_name=ref.kl_estimator,
        kl_output=kl_output,
        kl_reduction=ref.kl_reduction,
        files_sha256=sha256_files(files),
        dtype=ref.dtype,
        load_dtype=ref.dtype or spec.training.dtype,
        trust_remote_code=config.trust_remote_code,
    )


def rl_layout(seqs: list[list[int]], pad: int, eos: int) -> tuple[Tensor, Tensor]:
    """The trainer's batch layout: each probe split in half, the prompt left-padded and the
    completion (ending in EOS) right-padded with at least one pad: ``(ids, mask)`` ``(B, T)``."""
    import torch

    parts = [(s[: max(1, len(s) // 2)], [*s[max(1, len(s) // 2):], eos]) for s in seqs]
    pw = max(len(p) for p, _ in parts)
    cw = max(len(c) for _, c in parts) + 1
    ids = torch.full((len(parts), pw + cw), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(parts):
        ids[i, pw - len(p): pw] = torch.tensor(p)
        ids[i, pw: pw + len(c)] = torch.tensor(c)
        mask[i, pw - len(p): pw + len(c)] = 1
    return ids, mask


def maskless_logprobs(logits: Tensor, ids: Tensor) -> Tensor:
    """Token log-probs of a forward that ignored the attention mask: every position scored,
    ``(B, T-1)``; ``logits`` from ``model(input_ids)`` alone."""
    import torch

    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V)
    return logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)

"""The configs ``paritygate init`` writes for Stable-Baselines3 zips: each layout's factories
from :mod:`paritygate.adapters.sb3`, their arguments read from the zip
(:mod:`paritygate.init_sb3`), its training-only heads, and the artifact named with
``--artifact`` (or found beside the zip). Only the probes are left TODO where the zip says the
rest."""

from __future__ import annotations

from typing import TYPE_CHECKING

from paritygate.init_policy import (
    ArtifactInfo,
    Written,
    artifact,
    golden,
    header,
    io_names,
    probes,
)
from paritygate.init_sb3 import (
    ActionBox,
    CnnLayout,
    SacLayout,
    SB3Layout,
    action_box,
    cnn_layout,
    dqn_layout,
    image_keys,
    td3_layout,
)
from paritygate.init_yaml import todo_value

if TYPE_CHECKING:
    from torch import Tensor

    from paritygate.init_yaml import Block

_READ = "(read through policy.pth, weights_only)"


def _box(factory: Block, box: ActionBox, act_dim: int) -> None:
    """``action_low`` / ``action_high`` from the zip's action space, else TODO."""
    if box["low"] is not None:
        factory.set("action_low", box["low"], box["where"])
        factory.set("action_high", box["high"])
    else:
        for bound in ("low", "high"):
            factory.todo(f"action_{bound}", f"the action space's {bound} bound, one value per "
                         f"dimension ({act_dim})")


def _scale_bias(block: Block, box: ActionBox) -> None:
    """``action_scale`` and ``action_bias`` of a distribution block, from the box, else TODO."""
    low, high = box["low"], box["high"]
    if low is None or high is None:
        block.todo("action_scale", "(high - low) / 2 of the action space")
        block.todo("action_bias", "(high + low) / 2 of the action space")
        return
    scale = [(h - lo) / 2 for lo, h in zip(low, high, strict=True)]
    bias = [(h + lo) / 2 for lo, h in zip(low, high, strict=True)]
    block.set("action_scale", scale[0] if len(set(scale)) == 1 else scale, "(high - low) / 2")
    block.set("action_bias", bias[0] if len(set(bias)) == 1 else bias, "(high + low) / 2")


def _end(policy: Block, root: Block, written: Written, what: str) -> str:
    probes(policy, what)
    golden(root, written)
    return root.doc.dump()


def sb3_doc(written: Written, state: dict[str, Tensor], found: ArtifactInfo | None
            ) -> str | None:
    """The config of a DQN, TD3/DDPG or CnnPolicy zip, or ``None`` for another layout."""
    source = written.source
    n_keys = len(state)
    dqn = dqn_layout(source, state)
    if dqn is not None:
        root = header(written, "policy")
        policy = root.block("policy")
        policy.comment(f"Stable-Baselines3 DQNPolicy {_READ}: obs_dim,",
                       f"n_actions and net_arch read from the tensor shapes of {source.name}.")
        policy.set("training_factory", "paritygate.adapters.sb3:dqn_training_policy",
                   "-> {q_values, target_q}")
        policy.set("inference_factory", "paritygate.adapters.sb3:dqn_inference_policy",
                   "q_net only")
        policy.set("factory_kwargs", dict(dqn))
        policy.set("checkpoint", written.rel(source), f"{n_keys} tensors")
        policy.set("training_heads", ["q_net_target"], "the target network: training only "
                   "(q_net is the policy)")
        artifact(policy, written, found)
        policy.set("policy_output", "q_values", "the greedy action is the argmax of q_net's "
                   "Q-values")
        io_names(policy, found, ["q_values"])
        policy.set("action_space", "discrete")
        return _end(policy, root, written, "raw observations (N, obs_dim)")
    td3 = td3_layout(source, state)
    if td3 is not None:
        root = header(written, "policy")
        policy = root.block("policy")
        kind = "TD3" if td3["n_critics"] > 1 else "DDPG (one critic)"
        policy.comment(f"Stable-Baselines3 TD3Policy, {kind} {_READ}:",
                       f"obs_dim, net_arch and n_critics read from the tensor shapes of "
                       f"{source.name}.")
        policy.set("training_factory", "paritygate.adapters.sb3:td3_training_policy",
                   "-> {pre_tanh, q}")
        policy.set("inference_factory", "paritygate.adapters.sb3:td3_inference_policy",
                   "actor only -> pre_tanh")
        factory = policy.block("factory_kwargs")
        factory.set("obs_dim", td3["obs_dim"])
        factory.set("net_arch", td3["net_arch"])
        factory.set("n_critics", td3["n_critics"])
        box = action_box(source, td3["act_dim"])
        _box(factory, box, td3["act_dim"])
        policy.set("checkpoint", written.rel(source), f"{n_keys} tensors")
        policy.set("training_heads", ["actor_target", "critic", "critic_target"],
                   "target networks and critics: training only")
        artifact(policy, written, found)
        policy.set("policy_output", "pre_tanh", "the actor's output before its tanh")
        io_names(policy, found, ["pre_tanh"])
        policy.set("action_space", "continuous")
        dist = policy.block("distribution", "SB3 acts low + (tanh(u) + 1) / 2 * (high - low)")
        dist.set("type", "deterministic", "no log-std: only the action transform is judged")
        dist.set("squash", "tanh")
        _scale_bias(dist, box)
        dist.set("serving_output", "mean", "mean: the artifact serves u | action: the env action")
        return _end(policy, root, written, "raw observations (N, obs_dim)")
    cnn = cnn_layout(source, state)
    if cnn is not None:
        return _cnn_doc(written, cnn, state, found)
    return None


def _cnn_doc(written: Written, cnn: CnnLayout, state: dict[str, Tensor],
             found: ArtifactInfo | None) -> str:
    aliases = sorted({k.split(".")[0] for k in state if k.startswith(("pi_features_extractor.",
                                                                         "vf_features_extractor."))})
    heads = ["value_net"] + (["vf_features_extractor"] if not cnn["shared"] else [])
    if any(k.startswith("mlp_extractor.value_net.") for k in state):
        heads.insert(0, "mlp_extractor.value_net")
    dtype = cnn["dtype"] or "uint8"
    root = header(written, "policy")
    policy = root.block("policy")
    policy.comment("Stable-Baselines3 ActorCriticCnnPolicy (NatureCNN; read through policy.pth,",
                   f"weights_only): n_actions, features_dim and net_arch from "
                   f"{written.source.name}.")
    policy.set("training_factory", "paritygate.adapters.sb3:cnn_training_policy",
               "-> {logits, value}")
    policy.set("inference_factory", "paritygate.adapters.sb3:cnn_inference_policy",
               "actor path only")
    factory = policy.block("factory_kwargs")
    if cnn["obs_shape"]:
        factory.set("obs_shape", cnn["obs_shape"], "(C, H, W) from the zip's observation space")
    else:
        factory.todo("obs_shape", "the image shape [C, H, W] the policy takes")
    factory.set("n_actions", cnn["n_actions"])
    factory.set("features_dim", cnn["features_dim"])
    factory.set("net_arch", cnn["net_arch"])
    if not cnn["shared"]:
        factory.set("share_features_extractor", False, "the value side has its own extractor")
    policy.set("checkpoint", written.rel(written.source), f"{len(state)} tensors")
    if aliases and cnn["shared"]:
        policy.comment(f"{', '.join(aliases)}: the same tensors as features_extractor (one "
                       "module under several names, judged by identity): not heads")
    policy.set("training_heads", heads, "the value side: training only")
    artifact(policy, written, found)
    policy.set("policy_output", "logits")
    io_names(policy, found, ["logits"])
    policy.set("action_space", "discrete")
    policy.comment(f"probes: {dtype} images (N, C, H, W) as the environment gives them; the "
                   "policy scales pixels by 1/255 itself")
    return _end(policy, root, written, f"{dtype} images (N, C, H, W)")


def sac_doc(written: Written, sac: SacLayout, n_keys: int, found: ArtifactInfo | None) -> str:
    """The config of an SB3 SAC zip: the adapter's SAC factories and its Gaussian; the action
    box from the zip's action space, else TODO."""
    root = header(written, "policy")
    policy = root.block("policy")
    policy.comment(f"Stable-Baselines3 SACPolicy {_READ}: obs_dim and",
                   f"net_arch read from the tensor shapes of {written.source.name}.")
    policy.set("training_factory", "paritygate.adapters.sb3:sac_training_policy",
               "forward -> {mean, log_std, q}")
    policy.set("inference_factory", "paritygate.adapters.sb3:sac_inference_policy",
               "actor only -> (mean, log_std)")
    factory = policy.block("factory_kwargs")
    factory.set("obs_dim", sac["obs_dim"])
    factory.set("net_arch", sac["net_arch"])
    box = action_box(written.source, sac["act_dim"])
    _box(factory, box, sac["act_dim"])
    policy.set("checkpoint", written.rel(written.source), f"{n_keys} tensors")
    policy.set("training_heads", ["critic", "critic_target"], "the Q-networks: training only")
    artifact(policy, written, found)
    policy.set("policy_output", "mean")
    io_names(policy, found, ["mean", "log_std"])
    policy.set("action_space", "continuous")
    dist = policy.block("distribution", "SB3 acts low + (tanh(mean) + 1) / 2 * (high - low)")
    dist.set("log_std", "output")
    dist.set("log_std_key", "log_std")
    dist.set("log_std_clamp", [-20, 2], "SB3's LOG_STD_MIN, LOG_STD_MAX")
    dist.set("squash", "tanh")
    _scale_bias(dist, box)
    return _end(policy, root, written, "raw observations (N, obs_dim)")


def actor_critic(policy: Block, written: Written, sb3: SB3Layout,
                 spaces: dict[str, list[int] | None] | None, state: dict[str, Tensor]) -> None:
    """The factories of a PPO / A2C ``ActorCriticPolicy`` or ``MultiInputPolicy`` zip."""
    name = written.source.name
    a2c = "a2c_" if sb3["algorithm"] == "A2C" else ""
    if spaces is not None:
        policy.comment("Stable-Baselines3 MultiInputPolicy (read through policy.pth, "
                       "weights_only): the",
                       "Dict space's keys and shapes from the zip's data JSON (its readable "
                       "text; the",
                       f"pickled space is never loaded), n_actions and net_arch from {name}.")
        policy.set("training_factory", "paritygate.adapters.sb3:multi_input_training_policy",
                   "-> {logits, value}")
        policy.set("inference_factory", "paritygate.adapters.sb3:multi_input_inference_policy",
                   "actor path only")
        shapes = {k: v if v is not None else todo_value("this key's shape")
                  for k, v in spaces.items()}
        policy.set("factory_kwargs", {"spaces": shapes, "n_actions": sb3["n_actions"],
                                      "net_arch": sb3["net_arch"], **image_keys(state)})
        return
    what = "a Box action space" if sb3["continuous"] else "its action space"
    policy.comment(f"Stable-Baselines3 ActorCriticPolicy over {what} {_READ}:",
                   f"obs_dim, net_arch{'' if sb3['continuous'] else ' and n_actions'} read from "
                   f"the tensor shapes of {name}.")
    if a2c:
        policy.comment("A2C: the zip's data names RMSprop and no PPO clip_range")
    if sb3["continuous"]:
        policy.set("training_factory", "paritygate.adapters.sb3:gaussian_training_policy",
                   "forward -> {mean, value}")
        policy.set("inference_factory", "paritygate.adapters.sb3:gaussian_inference_policy",
                   "actor mean only")
        factory = policy.block("factory_kwargs")
        factory.set("obs_dim", sb3["obs_dim"])
        factory.set("net_arch", sb3["net_arch"])
        _box(factory, action_box(written.source, sb3["n_actions"]), sb3["n_actions"])
        return
    policy.set("training_factory", f"paritygate.adapters.sb3:{a2c}training_policy",
               "forward -> {logits, value}")
    policy.set("inference_factory", f"paritygate.adapters.sb3:{a2c}inference_policy",
               "actor path only")
    policy.set("factory_kwargs", {k: sb3[k] for k in ("obs_dim", "n_actions", "net_arch")})


def sb3_heads(sb3: SB3Layout, keys: list[str]) -> list[str]:
    """An actor-critic zip's training-only heads: the value network (and a Gaussian's bare
    log-std: the served actor returns the mean)."""
    heads = [h for h in ("mlp_extractor.value_net", "value_net")
             if any(k.startswith(h + ".") for k in keys)]
    return heads + (["log_std"] if sb3["continuous"] else [])


def sb3_action(policy: Block, written: Written, sb3: SB3Layout) -> None:
    """An actor-critic zip's action space and, over a Box, its clipped Gaussian."""
    policy.set("action_space", "continuous" if sb3["continuous"] else "discrete",
               "from the policy's tensors")
    if not sb3["continuous"]:
        return
    dist = policy.block("distribution", "SB3 acts the mean clipped to the action box")
    dist.set("log_std", "parameter", "'log_std' is a bare tensor of the checkpoint (a training "
             "head: the served actor returns the mean)")
    dist.set("log_std_key", "log_std")
    dist.set("squash", "clip")
    _scale_bias(dist, action_box(written.source, sb3["n_actions"]))

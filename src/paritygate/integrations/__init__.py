"""Where checkpoints are born: trainer callbacks that gate each saved checkpoint.

``paritygate.integrations.trl.ParityGateCallback`` (a transformers ``TrainerCallback``) and
``paritygate.integrations.sb3.ParityGateCallback`` (a Stable-Baselines3 ``BaseCallback``) run
:func:`paritygate.integrations.common.gate_checkpoint` after a save: ``paritygate run`` in a
subprocess, so the trainer's process and device memory are untouched, its report beside the
checkpoint and its numbers in the trainer's own logger. Each module imports its library; this
package imports neither.
"""

"""The ``paritygate`` command line's arguments (:func:`build_parser`); :mod:`paritygate.cli`
runs them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from paritygate.families import FAMILIES

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The ``paritygate`` argument parser: one subcommand per command."""
    parser = argparse.ArgumentParser(
        prog="paritygate",
        description="Release gate for RL policy checkpoints: proves the inference path "
        "computes the policy the trainer optimised.",
    )
    from paritygate import __version__

    parser.add_argument(
        "--version", action="version", version=f"paritygate {__version__}",
        help="print the version and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_commands(sub)
    _add_init(sub)
    history = sub.add_parser(
        "history", help="a training run's gate history as a page: each check across steps",
        description="Read each checkpoint's report.json under a run's output (the callbacks' "
        "OUTPUT_DIR/paritygate/, or the report folder of paritygate run --all) and write "
        "history.html beside them, with one PNG per check in history/: each check's key metric "
        "across steps against its threshold, the first failing step and its root cause marked, "
        "each step linked to its report.html.")
    history.add_argument("output_dir", type=Path,
                         help="the training run's output_dir (or SB3 save_path), or a report "
                         "folder of checkpoint-N/report.json")
    history.add_argument("--out", type=Path, default=None,
                         help="the page to write (default: history.html beside the reports)")
    checks = sub.add_parser("checks", help="list the check ids, their families and marks")
    checks.add_argument(
        "--family", choices=FAMILIES, default=None, help="one family only"
    )
    return parser


def _add_run(sub: Subparsers) -> None:
    """``paritygate run CONFIG``."""
    run = sub.add_parser("run", help="run the gate on a config (exit 0 pass, 1 fail, 2 bad input)")
    run.add_argument("config", type=Path, help="gate config YAML")
    run.add_argument(
        "--report-dir",
        type=Path,
        default=None,
        help="where report.json/.md/.html and junit.xml go (default: report_dir of the config, "
        "else ./reports/<name>)",
    )
    run.add_argument(
        "--update-golden",
        action="store_true",
        help="bless the obtained metrics as golden baselines (atomic)",
    )
    run.add_argument(
        "--report-format",
        dest="report_formats",
        default=None,
        metavar="LIST",
        help="report files to write, comma-separated from json,md,html,junit (default: the "
        "config's report_formats, else json,md,junit); report.json is always written, figures "
        "only with html",
    )
    run.add_argument(
        "-m",
        dest="markexpr",
        default=None,
        help="pytest mark expression selecting checks, e.g. 'fast' or 'not vllm'",
    )
    run.add_argument(
        "-n",
        dest="workers",
        default=None,
        help="pytest-xdist workers (e.g. 2 or auto); same verdict as serial. Each worker "
        "loads every input again, so the checks run serially (saying so) unless the last "
        "report's durations and idle cores show the workers finish sooner",
    )
    run.add_argument(
        "--force-workers",
        action="store_true",
        help="start the -n workers even where they are estimated not to shorten the run",
    )
    run.add_argument(
        "--check",
        dest="check_ids",
        action="append",
        default=None,
        metavar="ID",
        help="run only this check (repeatable); ids: paritygate checks",
    )
    run.add_argument(
        "--allow-skips",
        action="store_true",
        help="pass a run in which every selected check skipped (default: exit 3)",
    )
    run.add_argument(
        "--checkpoint",
        default=None,
        metavar="N|PATH",
        help="gate another checkpoint of the same policy with this config (same name, same "
        "baselines): a step N of the trainer output_dir the config names, latest, final, or "
        "a path (a checkpoint-N folder, an output_dir, a policy checkpoint file)",
    )
    run.add_argument(
        "--all",
        dest="all_checkpoints",
        action="store_true",
        help="gate every checkpoint-N of the config's trainer output_dir, one run each, "
        "reports in <report-dir>/checkpoint-N; exit with the worst code",
    )
    run.add_argument(
        "--bless-first",
        action="store_true",
        help="bless this checkpoint as the first baseline of a run (with --all: the first "
        "checkpoint-N, then gate the others against it); bad input (exit 2) when a baseline "
        "exists: it never re-blesses",
    )
    run.add_argument(
        "--step",
        type=int,
        default=None,
        metavar="N",
        help="the training step of the checkpoint (recorded with --bless-first; default: "
        "trainer_state.json's global_step)",
    )



def _add_commands(sub: Subparsers) -> None:
    """``export``, ``demo``, ``dump`` and ``precision``."""
    export = sub.add_parser("export", help="build the inference artifact and manifest.json")
    export.add_argument("config", type=Path, help="gate config YAML")
    export.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: export/<name>/ beside the current folder)",
    )

    demo = sub.add_parser("demo", help="build the bundled demo checkpoints (no network needed)")
    demo.add_argument(
        "--out",
        type=Path,
        default=Path("demo"),
        help="folder for the checkpoints, configs/ and golden/ (default: ./demo)",
    )
    demo.add_argument(
        "--only", choices=("policy", "lm", "rollout"), default=None,
        help="build one demo only (rollout: a CartPole policy for rollout_parity)"
    )

    dump = sub.add_parser(
        "dump", help="causal LM: write the serving engine's rollouts as a dump to audit"
    )
    dump.add_argument("config", type=Path, help="gate config YAML (causal-LM family)")
    dump.add_argument("--out", type=Path, required=True, help="FILE.jsonl or FILE.parquet")
    dump.add_argument(
        "--engine", default="hf", choices=["hf", "vllm"], help="engine that generates"
    )
    prec = sub.add_parser("precision", help="per-layer fp16/bf16 precision report only")
    prec.add_argument("config", type=Path, help="gate config YAML")
    prec.add_argument(
        "--report-dir", type=Path, default=None, help="report folder (default as for run)"
    )
    prec.add_argument(
        "--update-golden", action="store_true", help="bless its baseline (as run does)"
    )



def _add_init(sub: Subparsers) -> None:
    """``paritygate init SOURCE``."""
    init = sub.add_parser(
        "init",
        help="write a commented gate config for a checkpoint or HF model directory",
        description="Inspect a checkpoint (tensor keys, training-only heads), an ONNX artifact "
        "beside it and an HF directory's tokenizer and generation config, and write a gate config "
        "to edit. Every value it cannot infer is a TODO; paritygate run refuses the config "
        "(exit 2, naming the key) until each is filled.",
    )
    init.add_argument(
        "source",
        type=Path,
        help="checkpoint file (.safetensors, .pt/.pth, SB3 .zip), HF model directory, or a "
        "trainer output_dir of checkpoint-N folders",
    )
    init.add_argument(
        "--out",
        type=Path,
        default=None,
        help="config file to write (default: ./configs/<name>.yaml); never overwritten",
    )
    init.add_argument(
        "--artifact",
        type=Path,
        default=None,
        help="ONNX artifact to inspect (default: the only .onnx file beside the checkpoint)",
    )
    init.add_argument(
        "--serving",
        type=Path,
        default=None,
        help="HF causal LM: the served copy (causal_lm.serving.model_dir); its own "
        "generation_config.json, tokenizer, chat template and config.json dtype are the serving "
        "defaults (default: a TODO)",
    )
    init.add_argument(
        "--checkpoint",
        default=None,
        metavar="N",
        help="with a trainer output_dir: the step of the checkpoint-N to inspect (default: the "
        "latest); the config keeps the output_dir and pins this step",
    )
    init.add_argument(
        "--name",
        default=None,
        help="gate name, naming golden/<name>/ (default: the --out file's name, else the "
        "checkpoint's file or folder that names the policy, not a step such as step_300, "
        "else the repository)",
    )

    init.add_argument(
        "--reward-model", type=Path, default=None,
        help="causal LM: the reward model directory (default: reward_model/, reward/ or rm/ "
        "beside the model directory)",
    )
    init.add_argument(
        "--reference", type=Path, default=None,
        help="causal LM: the KL reference directory (default: ref_model/, reference/ or ref/ "
        "beside the model directory)",
    )

"""Command line: ``paritygate run | export | demo | precision | init | history | checks``.

Exit codes: 0 every check passed, 1 a check failed or ended in ``error``, 2 bad input
or a report/golden file that cannot be written (one line naming the file and key, no
traceback), 3 nothing was verified (every selected check skipped, or none selected;
``--allow-skips`` makes that a pass), 130 interrupted (SIGINT), 143 terminated (SIGTERM);
an interrupted run writes no report and leaves golden unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from paritygate.cli_parser import build_parser
from paritygate.cli_signals import Signals, Terminated
from paritygate.errors import InputError

if TYPE_CHECKING:
    from paritygate.gate import Gate
    from paritygate.session import Outcome

from paritygate.exit_codes import (
    EXIT_FAIL,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_NOTHING_VERIFIED,
    EXIT_PASS,
    EXIT_TERMINATED,
)

__all__ = ["EXIT_FAIL", "EXIT_INPUT", "EXIT_INTERRUPTED", "EXIT_NOTHING_VERIFIED", "EXIT_PASS",
           "EXIT_TERMINATED", "main", "text_table"]




def _select_checks(gate: object, check_ids: list[str]) -> list[str]:
    """pytest node ids of the ``--check`` selection; bad ids are input errors (exit 2)."""
    import paritygate_gates

    from paritygate.checks import CHECK_IDS

    config = gate.config  # type: ignore[attr-defined]
    applicable = [c.id for c in gate.checks()]  # type: ignore[attr-defined]
    folder = Path(paritygate_gates.__file__).parent
    nodes = []
    for cid in dict.fromkeys(check_ids):
        if cid not in CHECK_IDS:
            raise InputError(None, "--check", f"unknown check id {cid!r}; see: paritygate checks")
        if cid not in applicable:
            raise InputError(
                config.path, "--check", f"{cid} is not a check this {config.family} gate runs"
            )
        nodes.append(f"{folder / f'test_{cid}.py'}::test_{cid}")
    return nodes


def _cmd_run(args: argparse.Namespace) -> int:
    from paritygate.trainer_output import BLESS_FIRST_ENV, CHECKPOINT_ENV

    if args.all_checkpoints:
        from paritygate.cli_series import run_all

        return run_all(args, refuse_existing_baseline=_refuse_existing_baseline, entry=main)
    previous = os.environ.get(CHECKPOINT_ENV)
    if args.checkpoint is not None:
        os.environ[CHECKPOINT_ENV] = args.checkpoint  # the pytest session and its workers
    else:
        os.environ.pop(CHECKPOINT_ENV, None)
    os.environ.pop(BLESS_FIRST_ENV, None)  # set by --bless-first for this run only
    try:
        return _run_one(args)
    finally:
        os.environ.pop(BLESS_FIRST_ENV, None)
        if previous is None:
            os.environ.pop(CHECKPOINT_ENV, None)
        else:
            os.environ[CHECKPOINT_ENV] = previous


def _refuse_existing_baseline(args: argparse.Namespace, gate: Gate | None = None) -> None:
    """``--bless-first`` blesses a run's first baseline and never replaces one: a baseline
    file of a selected check that exists is bad input naming it."""
    from paritygate.gate import Gate

    gate = gate or Gate.from_path(args.config)
    wanted = set(args.check_ids or []) or {c.id for c in gate.checks()}
    for spec in gate.checks():
        path = gate.golden.path(spec.id)
        if spec.id in wanted and path.exists():
            raise InputError(path, "--bless-first", "a golden baseline exists; --bless-first "
                             "never re-blesses (gate against it without --bless-first, or "
                             "replace it with --update-golden)")


def _bless_first(args: argparse.Namespace, gate: Gate) -> None:
    """Refuse an existing baseline, then bless this run, recording its step and checkpoint."""
    from paritygate.trainer_output import BLESS_FIRST_ENV

    _refuse_existing_baseline(args, gate)
    record = gate.config.trainer_checkpoint
    step = args.step if args.step is not None else (record.step if record else None)
    os.environ[BLESS_FIRST_ENV] = json.dumps({"step": step})
    gate.update_golden = args.update_golden = True


def _run_one(args: argparse.Namespace) -> int:
    from paritygate.gate import Gate

    gate = Gate.from_path(
        args.config, update_golden=args.update_golden, report_dir=args.report_dir
    )
    if args.report_formats is not None:  # refused before any model loads
        gate.config.set_report_formats(args.report_formats)
    if args.bless_first:
        _bless_first(args, gate)
    gate.check_writable(args.report_dir)
    selected = _select_checks(gate, args.check_ids) if args.check_ids else None
    gate.named = frozenset(args.check_ids or ())  # config-only checks alone: no model imports
    if args.markexpr:
        _check_markexpr(args.markexpr)
    gate.begin_bless()  # a second blesser of this baseline is refused before any work
    try:
        print(f"paritygate: {gate.config.name} ({gate.config.family}) — loading inputs",
              flush=True)
        if gate.config.trainer_checkpoint is not None:
            print(f"paritygate: trainer checkpoint {gate.config.trainer_checkpoint.describe()}",
                  flush=True)
        gate.context  # noqa: B018 - validate every input before any check runs
        if args.markexpr or args.workers or args.force_workers:
            outcome, code = _run_pytest(gate, args, selected)
        else:  # nothing asks for pytest: the same checks and reports without its session
            from paritygate.runner import run_checks

            gate.allow_skips = args.allow_skips
            out = args.report_dir.resolve() if args.report_dir else None
            outcome = run_checks(gate, out or gate.config.default_report_dir())
            code = EXIT_INPUT
            if outcome.written is not None and getattr(args, "fresh_process", False):
                import gc

                # this command owns the process, which ends next: no exit-time gc walk of the
                # models (an in-process caller goes on, and its objects must stay collectable)
                gc.freeze()
    finally:
        gate.discard_golden()  # a no-op after the run committed; unlocks on every other exit
    if outcome is None:  # pytest stopped before the session (its own usage error)
        return EXIT_INPUT
    if outcome.kind == "input_error":
        raise InputError(None, None, outcome.line or "the run stopped on bad input")
    if outcome.kind == "nothing_verified":
        print(f"paritygate: {outcome.line or 'nothing was verified'}", file=sys.stderr)
        return EXIT_NOTHING_VERIFIED
    if outcome.kind == "pass":
        return EXIT_PASS
    if outcome.kind == "fail":
        return EXIT_FAIL
    return EXIT_INPUT if code not in (EXIT_PASS, EXIT_FAIL) else code


def _run_pytest(gate: Gate, args: argparse.Namespace,
                selected: list[str] | None) -> tuple[Outcome | None, int]:
    """The run as a pytest session of the gate files (``-m`` and workers are pytest's): its
    outcome and pytest's exit code."""
    import pytest

    from paritygate.plugin import GateRun

    run = GateRun(gate, owns_stderr=True)
    pytest_args = _pytest_args(gate, args, selected)
    autoload = os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # xdist workers inherit it
    try:
        code = int(pytest.main(pytest_args, plugins=[run]))
    except Exception:
        if run.interrupted:  # a plugin failed on the interrupt: still an interrupt
            raise KeyboardInterrupt from None
        raise
    finally:
        if autoload is None:
            os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
        else:
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = autoload
    outcome = run.outcome
    if run.interrupted or (outcome is not None and outcome.kind == "interrupted"):
        raise KeyboardInterrupt  # also before the session started (pytest's own setup)
    return outcome, code


def _check_markexpr(expr: str) -> None:
    """A malformed ``-m`` expression is bad input (exit 2), said before any model loads."""
    try:
        from _pytest.mark.expression import Expression
    except ImportError:  # pragma: no cover - pytest moved it; pytest then says it itself
        return
    try:
        Expression.compile(expr)
    except SyntaxError as exc:  # pytest's ParseError
        raise InputError(None, "-m", f"malformed mark expression {expr!r}: {exc}") from None


def _pytest_args(gate: Gate, args: argparse.Namespace, selected: list[str] | None) -> list[str]:
    import paritygate_gates

    targets = selected or [str(Path(paritygate_gates.__file__).parent)]
    pytest_args = [
        *targets,
        # Plugins are named, not discovered: installed pytest plugins (anyio's, say) would
        # cost an import each and could change how the gate's tests run.
        "-p",
        "paritygate.plugin",
        "--gate-config",
        str(gate.config.path),
        "-p",
        "no:cacheprovider",
        "-q",
        "--no-header",
        "-rN",
        "--tb=no",
        "-o",
        "console_output_style=classic",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        "--rootdir",
        str(Path(paritygate_gates.__file__).parent),
    ]
    if args.report_dir is not None:
        pytest_args += ["--report-dir", str(args.report_dir.resolve())]
    if args.report_formats is not None:
        pytest_args += ["--report-format", args.report_formats]
    if args.update_golden:
        pytest_args.append("--update-golden")
    if args.markexpr:
        pytest_args += ["-m", args.markexpr]
    if args.workers:
        import importlib.util

        if importlib.util.find_spec("xdist") is None:
            raise InputError(None, "-n", "workers need pytest-xdist: pip install 'paritygate[all]'")
        pytest_args += ["-p", "xdist.plugin", "-n", str(args.workers)]
    if args.force_workers:
        pytest_args.append("--force-workers")
    if args.allow_skips:
        pytest_args.append("--allow-skips")
    return pytest_args


def _cmd_export(args: argparse.Namespace) -> int:
    from paritygate.families import export
    from paritygate.load import load_config
    from paritygate.progress import stage

    config = load_config(args.config)
    out = args.out or Path("export") / config.name
    with stage(f"paritygate export: {config.name} into {out}"):
        manifest = export(config, out)
    from paritygate.reading_text import read_json

    artifact = read_json(manifest, None, what="manifest")["artifact"]
    print(f"paritygate: wrote {manifest.parent / artifact} and {manifest}")
    return EXIT_PASS


def _cmd_dump(args: argparse.Namespace) -> int:
    from paritygate.families.causal_lm.dump import dump_rollouts
    from paritygate.load import load_config

    path = dump_rollouts(load_config(args.config), args.out, engine=args.engine)
    print(f"paritygate: wrote rollout dump {path}")
    return EXIT_PASS


def _cmd_demo(args: argparse.Namespace) -> int:
    from paritygate.demo import write_bundle

    out: Path = args.out
    if args.only in (None, "policy"):
        from paritygate.demo import policy

        print(f"paritygate demo: building the demo policy in {out / 'policy'}", flush=True)
        policy.build(out / "policy")
    if args.only in (None, "lm"):
        from paritygate.demo import causal_lm

        print(f"paritygate demo: building the demo causal LM in {out / 'lm'}", flush=True)
        causal_lm.build(out / "lm")
    if args.only in (None, "rollout"):
        from paritygate.demo import rollout

        print(f"paritygate demo: building the rollout demo policy in {out / 'rollout'}",
              flush=True)
        rollout.build(out / "rollout")
    parts = [p for p in ("policy", "lm", "rollout") if args.only in (None, p)]
    configs = write_bundle(out, parts)
    print(f"paritygate demo: wrote {', '.join(str(p) for p in configs.values())} and golden "
          f"baselines in {out / 'golden'}")
    first = next(iter(configs.values())).resolve()
    print(f"paritygate demo: done. Next: paritygate run {first}")
    return EXIT_PASS


def _cmd_init(args: argparse.Namespace) -> int:
    from paritygate.init import write_config

    step = args.checkpoint
    if step is not None and step.isdigit():
        step = int(step)
    written = write_config(args.source, out=args.out, artifact=args.artifact, name=args.name,
                           serving=args.serving, checkpoint=step,
                           reward_model=args.reward_model, reference=args.reference)
    print(f"paritygate init: wrote {written.path}")
    for note in written.notes:
        print(f"paritygate init: {note}")
    if written.todos:
        print(f"paritygate init: fill in {len(written.todos)} TODO(s) before running: "
              + ", ".join(written.todos))
    print(f"paritygate init: then bless with: paritygate run {written.path} --update-golden")
    return EXIT_PASS


def _cmd_history(args: argparse.Namespace) -> int:
    from paritygate.report.history import write_history

    page = write_history(args.output_dir, args.out)
    print(f"paritygate history: wrote {page}")
    return EXIT_PASS


def _cmd_checks(args: argparse.Namespace) -> int:
    from paritygate.checks import CHECK_IDS, get_check

    specs = [spec for spec in map(get_check, CHECK_IDS)
             if not args.family or args.family in spec.families]
    rows = [(spec.id, ",".join(spec.families), ",".join(spec.marks), spec.summary)
            for spec in specs]
    print("\n".join(text_table(rows)))
    return EXIT_PASS


def text_table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as aligned text: every column but the last as wide as its widest cell, so no
    value runs into the next column."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    padded = ([cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)] for row in rows)
    return [" ".join([*cells, row[-1]]).rstrip() for cells, row in zip(padded, rows, strict=True)]


def _cmd_precision(args: argparse.Namespace) -> int:
    from paritygate.gate import Gate
    from paritygate.report import summary_table, write_reports
    from paritygate.verdict import Notes

    gate = Gate.from_path(args.config, update_golden=args.update_golden)
    gate.command = "precision"  # its own blessing: paritygate precision CONFIG --update-golden
    out = args.report_dir or gate.config.default_report_dir()
    gate.check_writable(out)
    gate.begin_bless()
    try:
        result = gate.evaluate("precision_per_layer")
        gate.commit_golden()
    finally:
        gate.discard_golden()
    written = write_reports(gate, [result], out)
    print("\n".join(summary_table([result])))
    notes = Notes.read(result.details)
    for note in notes.notes if notes is not None else []:
        print(f"note: {note}")
    print(f"reports: {written.directory} ({', '.join(written.files)})")
    return EXIT_PASS if result.status in ("pass", "skip") else EXIT_FAIL


def main(argv: list[str] | None = None) -> int:
    import threading
    import warnings

    args = build_parser().parse_args(argv)
    args.fresh_process = "torch" not in sys.modules and threading.active_count() == 1
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch(\.|$)")
    handlers = {
        "run": _cmd_run,
        "export": _cmd_export,
        "demo": _cmd_demo,
        "precision": _cmd_precision,
        "dump": _cmd_dump,
        "init": _cmd_init,
        "checks": _cmd_checks,
        "history": _cmd_history,
    }
    signals = Signals()
    try:
        try:
            return handlers[args.command](args)
        except Exception:
            if signals.received:  # an interrupt that a library turned into another exception
                raise KeyboardInterrupt from None
            raise
    except InputError as exc:
        print(f"paritygate: error: {exc.line()}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated) or signals.last == "SIGTERM"
        code = EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
        from paritygate.session import INTERRUPTED_LINE

        signame = "SIGTERM" if code == EXIT_TERMINATED else "SIGINT"
        line = INTERRUPTED_LINE.replace("interrupted", f"interrupted ({signame})", 1)
        print(f"paritygate: {line}", file=sys.stderr)
        return code
    except BrokenPipeError:  # output piped into a reader that stopped early (e.g. head)
        sys.stderr.close()
        return EXIT_PASS
    finally:
        signals.restore()


_parser = build_parser
"""Kept under its old name for callers of the parser."""


if __name__ == "__main__":
    sys.exit(main())

"""Generated bad inputs through the real CLI (a subprocess each, two at a time).

Every case must end with exit 2 and exactly one stderr line ``paritygate: error: FILE: KEY:
cause`` naming the file and the key, no traceback on either stream, and every input file
unchanged. The cases here are refused before any model is loaded, so they need no demo build.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "configs" / "demo-policy.yaml"
LM = ROOT / "configs" / "demo-lm.yaml"


def _set(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    node = data
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return data


def _cases() -> list[tuple[str, str, str, Any]]:
    """(case id, base config, dotted key, value); the key is what the error line must name."""
    out: list[tuple[str, str, str, Any]] = []
    for base, section in (("policy", "policy"), ("lm", "causal_lm")):
        for key, value in [
            ("name", "bad name!"),
            ("family", "vision"),
            ("seed", "zero"),
            ("allow_pickle", "yes"),
            ("checks", ["no_such_check"]),
            ("skip_checks", ["nope"]),
            ("golden.rel_margin", -1.0),
            ("golden.threshold_fraction", "x"),
            ("golden.colour", 1),
            ("thresholds.no_such_check", {"x": 1.0}),
            ("thresholds.logits_agreement.no_such_metric", 1.0),
            ("thresholds.logits_agreement.max_abs_diff", float("nan")),
            ("thresholds.logits_agreement.max_abs_diff", float("inf")),
            ("thresholds.logits_agreement.kl_max", float("-inf")),
            ("thresholds.logits_agreement.tv_max", "small"),
            ("precision.colour", 1),
            (f"{section}.colour", 1),
            ("report_dir", 3),
            ("trust_remote_code", "maybe"),
            ("golden.dir", ["a"]),
        ]:
            out.append((f"{base}-{key}-{value!r}", base, key, value))
    for key, value in [
        ("policy.output_names", []),
        ("policy.batch_sizes", []),
        ("policy.batch_sizes", [0, -3]),
        ("policy.opset", 3),
        ("policy.dropout_repeats", 1),
        ("policy.action_space", "hybrid"),
        ("policy.probes.count", 0),
        ("policy.probes.count", "many"),
        ("policy.probes.file", "x.npy"),
        ("policy.checkpoint", 7),
        ("policy.training_heads", "value_head"),
        ("policy.preprocessing.discrete_features", ["a"]),
        ("policy.factory_kwargs", [1]),
        ("thresholds.head_removal.policy_max_abs_diff", float("nan")),
        ("thresholds.dropout_off.repeat_max_abs_diff", float("inf")),
    ]:
        out.append((f"policy-{key}-{value!r}", "policy", key, value))
    for key, value in [
        ("causal_lm.model_dir", 5),
        ("causal_lm.engines", "hf"),
        ("causal_lm.ratio_eps", "wide"),
        ("causal_lm.training.dtype", "float8"),
        ("causal_lm.engine.dtype", 16),
        ("causal_lm.sampling.colour", 1),
        ("causal_lm.tokenizer.colour", 1),
        ("causal_lm.max_prompt_tokens", "long"),
    ]:
        out.append((f"lm-{key}-{value!r}", "lm", key, value))
    return out


CASES = _cases()


def _run(config: Path, *extra: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG")}
    proc = subprocess.run([sys.executable, "-m", "paritygate", "run", str(config), *extra],
                          cwd=config.parent, capture_output=True, text=True, timeout=300, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def _check(code: int, out: str, err: str, file: str, key: str | None) -> str | None:
    """None when the output keeps the contract, else what broke it."""
    lines = [line for line in err.splitlines() if line.strip()]
    if code != 2:
        return f"exit {code}: {err[-400:]}"
    if "Traceback" in out + err:
        return "traceback"
    if len(lines) != 1 or not lines[0].startswith("paritygate: error: "):
        return f"stderr is not one error line: {err!r}"
    if file not in lines[0]:
        return f"{file} not named: {lines[0]}"
    if key is not None and key not in lines[0]:
        return f"key {key} not named: {lines[0]}"
    return None


def test_fuzz_config_cases(tmp_path: Path) -> None:
    assert len(CASES) >= 60
    jobs = []
    for n, (case_id, base, key, value) in enumerate(CASES):
        data = yaml.safe_load((POLICY if base == "policy" else LM).read_text(encoding="utf-8"))
        folder = tmp_path / f"case{n}"
        folder.mkdir()
        cfg = folder / "gate.yaml"
        cfg.write_text(yaml.safe_dump(_set(data, key, value)), encoding="utf-8")
        jobs.append((case_id, cfg, key))
    extra = [(tmp_path / "notutf8", b"name: \xff\xfe\n", "byte")]
    for name, payload, key in extra:
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_bytes(payload)
        jobs.append((name, cfg, key))
    digests = {cfg: hashlib.sha256(cfg.read_bytes()).hexdigest() for _, cfg, _ in jobs}
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda job: _run(job[1]), jobs))
    broken = {}
    for (case_id, cfg, key), (code, out, err) in zip(jobs, outcomes, strict=True):
        problem = _check(code, out, err, str(cfg.name), key.split(".")[0])
        if problem:
            broken[case_id] = problem
        assert hashlib.sha256(cfg.read_bytes()).hexdigest() == digests[cfg]
    assert not broken, broken


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_unwritable_golden_dir_is_refused_before_any_check(tmp_path: Path, where: str) -> None:
    data = yaml.safe_load(POLICY.read_text(encoding="utf-8"))
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    data["golden"]["dir"] = str(blocker if where == "under-file" else tmp_path)
    if where == "file":
        (tmp_path / data["name"]).write_text("x")
    cfg = tmp_path / "gate.yaml"
    cfg.write_text(yaml.safe_dump(data), encoding="utf-8")
    code, out, err = _run(cfg)
    assert _check(code, out, err, "", "golden.dir") is None, (code, out, err)
    assert "loading inputs" not in out


def _alias_levels(levels: int, width: int = 10) -> tuple[str, str]:
    """YAML anchors ``l0 .. l<levels-1>``, each a list of ``width`` aliases of the one
    before: the last expands to ``width ** levels`` values from a few hundred bytes."""
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    for n in range(1, levels):
        lines.append(f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * width)}]")
    return "\n".join(lines) + "\n", f"*l{levels - 1}"


@pytest.mark.parametrize(("levels", "key"), [(9, "policy.colour"), (4, "seed")],
                         ids=["bomb-9-levels", "wrong-type-4-levels"])
def test_yaml_aliases_are_bounded_and_echoed_values_short(
    tmp_path: Path, levels: int, key: str
) -> None:
    """A 9-level alias bomb (10^9 values) is refused before any scan of the expanded tree;
    a wrong-typed key holding 10^4 aliased values is named with its value cut short."""
    anchors, alias = _alias_levels(levels)
    text = POLICY.read_text(encoding="utf-8")
    if key == "seed":
        text = text.replace("seed: 0", f"seed: {alias}")
    else:
        text = text.replace("policy:\n", f"policy:\n  colour: {alias}\n", 1)
    cfg = tmp_path / "gate.yaml"
    cfg.write_text("x-anchors:\n" + "".join(f"  {line}\n" for line in anchors.splitlines())
                   + text, encoding="utf-8")
    from measured_run import run_measured

    run = run_measured(["run", str(cfg)], cfg.parent)
    code, out, err = run.code, run.out, run.err
    assert run.cpu_s < 60, f"bounded work on hostile YAML: {run.cpu_s:.1f} CPU s"
    assert _check(code, out, err, "gate.yaml", None) is None, (code, out, err[:2000])
    line = err.strip()
    assert len(line) < 1000, len(line)
    assert ("aliases expand" in line) if levels == 9 else ("seed" in line), line

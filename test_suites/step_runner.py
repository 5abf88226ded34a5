"""Run GitHub Actions steps on this machine: a composite action's or a workflow job's, in order.

What a step gets is what GitHub's runner gives it: the runner's environment plus the job's, the
calling step's and the step's own `env:` with `${{ }}` expressions evaluated (never interpolated
into the script), fresh GITHUB_OUTPUT / GITHUB_ENV / GITHUB_PATH files read back after the step, one
GITHUB_STEP_SUMMARY, `if:` conditions with the implicit `success()`, `bash --noprofile --norc -eo
pipefail` for `shell: bash`, and step outputs under `steps.<id>.outputs`. A local action
(`uses: ./path`) runs its own steps with GITHUB_ACTION_PATH set; every other `uses:` goes to a
handler the test supplies (setup-python, checkout, download/upload-artifact). The expression
evaluator covers what workflows here use: literals, context paths, `! == != < > && ||`, and the
functions `always success failure cancelled toJSON format contains startsWith endsWith`.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# --- expressions ------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>\d+(?:\.\d+)?)|(?P<op>==|!=|<=|>=|&&|\|\||[!<>(),.\[\]*])"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_-]*))"
)
_STATUS_FUNCTIONS = ("always", "success", "failure", "cancelled")


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise ValueError(f"cannot parse expression {text!r} at {text[pos:]!r}")
        kind = match.lastgroup
        assert kind is not None
        out.append((kind, match.group(kind)))
        pos = match.end()
    return out


def _number(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        if value.strip() == "":
            return 0.0
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def _equal(left: Any, right: Any) -> bool:
    """GitHub's loose equality: strings compare case-insensitively, mixed types as numbers."""
    if isinstance(left, str) and isinstance(right, str):
        return left.lower() == right.lower()
    if type(left) is type(right) and not isinstance(left, (int, float)):
        return bool(left == right)
    if isinstance(left, (dict, list)) or isinstance(right, (dict, list)):
        return left is right
    return _number(left) == _number(right)


def truthy(value: Any) -> bool:
    if value is None or value is False or value == "":
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value != 0 and not math.isnan(value)
    return True


def to_string(value: Any) -> str:
    """How GitHub writes a value into a string: '' for null, lower-case booleans, JSON objects."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (dict, list)):
        return json.dumps(value, indent=2)
    return str(value)


def _format(template: str, *args: Any) -> str:
    out = re.sub(r"\{(\d+)\}", lambda m: to_string(args[int(m.group(1))]), template)
    return out.replace("{{", "{").replace("}}", "}")


class _Parser:
    def __init__(self, text: str, contexts: Mapping[str, Any], status: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0
        self.contexts = contexts
        self.status = status

    def peek(self) -> str | None:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        token = self.tokens[self.pos]
        if expected is not None and token[1] != expected:
            raise ValueError(f"expected {expected!r}, got {token[1]!r}")
        self.pos += 1
        return token

    def parse(self) -> Any:
        value = self.or_expr()
        if self.pos != len(self.tokens):
            raise ValueError(f"trailing tokens: {self.tokens[self.pos:]}")
        return value

    def or_expr(self) -> Any:
        value = self.and_expr()
        while self.peek() == "||":
            self.take()
            right = self.and_expr()
            value = value if truthy(value) else right
        return value

    def and_expr(self) -> Any:
        value = self.comparison()
        while self.peek() == "&&":
            self.take()
            right = self.comparison()
            value = right if truthy(value) else value
        return value

    def comparison(self) -> Any:
        left = self.unary()
        op = self.peek()
        if op in ("==", "!=", "<", ">", "<=", ">="):
            self.take()
            right = self.unary()
            if op == "==":
                return _equal(left, right)
            if op == "!=":
                return not _equal(left, right)
            a, b = _number(left), _number(right)
            return {"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
        return left

    def unary(self) -> Any:
        if self.peek() == "!":
            self.take()
            return not truthy(self.unary())
        return self.primary()

    def primary(self) -> Any:
        kind, text = self.take()
        if text == "(":
            value = self.or_expr()
            self.take(")")
            return value
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if kind == "num":
            return float(text)
        if kind != "name":
            raise ValueError(f"unexpected token {text!r}")
        if text in ("true", "false"):
            return text == "true"
        if text == "null":
            return None
        if self.peek() == "(":
            return self.call(text)
        value: Any = self.contexts.get(text)
        while self.peek() in (".", "["):
            if self.take()[1] == ".":
                key: Any = self.take()[1]
            else:
                key = self.or_expr()
                self.take("]")
            value = value.get(key) if isinstance(value, dict) else None
        return value

    def call(self, name: str) -> Any:
        self.take("(")
        args = []
        while self.peek() != ")":
            args.append(self.or_expr())
            if self.peek() == ",":
                self.take()
        self.take(")")
        lowered = name.lower()
        if lowered == "always":
            return True
        if lowered == "success":
            return self.status == "success"
        if lowered == "failure":
            return self.status == "failure"
        if lowered == "cancelled":
            return False
        if lowered == "tojson":
            return json.dumps(args[0], indent=2)
        if lowered == "format":
            return _format(to_string(args[0]), *args[1:])
        if lowered == "contains":
            haystack, needle = args
            if isinstance(haystack, list):
                return any(_equal(item, needle) for item in haystack)
            return to_string(needle).lower() in to_string(haystack).lower()
        if lowered == "startswith":
            return to_string(args[0]).lower().startswith(to_string(args[1]).lower())
        if lowered == "endswith":
            return to_string(args[0]).lower().endswith(to_string(args[1]).lower())
        raise ValueError(f"function {name}() is not emulated")


def evaluate(text: str, contexts: Mapping[str, Any], status: str = "success") -> Any:
    """Value of one expression (the inside of `${{ }}`)."""
    return _Parser(text, contexts, status).parse()


def interpolate(value: Any, contexts: Mapping[str, Any], status: str = "success") -> Any:
    """A YAML value with every `${{ }}` evaluated; a lone expression keeps its type."""
    if not isinstance(value, str):
        return value
    whole = re.fullmatch(r"\$\{\{(.*?)\}\}", value.strip(), re.S)
    if whole and value.count("${{") == 1:
        return evaluate(whole.group(1), contexts, status)
    return re.sub(
        r"\$\{\{(.*?)\}\}", lambda m: to_string(evaluate(m.group(1), contexts, status)), value
    )


def condition(text: Any, contexts: Mapping[str, Any], status: str) -> bool:
    """An `if:`: without a status function it means `success() && (...)`."""
    if text is None:
        return status == "success"
    if isinstance(text, bool):
        return text and status == "success"
    expr = str(text).strip()
    whole = re.fullmatch(r"\$\{\{(.*)\}\}", expr, re.S)
    if whole:
        expr = whole.group(1)
    if not re.search(r"\b(" + "|".join(_STATUS_FUNCTIONS) + r")\s*\(", expr):
        expr = f"success() && ({expr})"
    return truthy(evaluate(expr, contexts, status))


# --- steps ------------------------------------------------------------------------------------


class StepFailed(Exception):
    """Raised by a `uses:` handler to fail its step, as an action does by exiting non-zero."""


@dataclass
class StepResult:
    name: str
    id: str | None
    outcome: str  # success | failure | skipped
    returncode: int | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    log: str = ""


@dataclass
class ActionResult:
    outcome: str
    outputs: dict[str, str]
    steps: list[StepResult]

    def step(self, step_id: str) -> StepResult:
        return next(s for s in self.steps if s.id == step_id)

    @property
    def log(self) -> str:
        return "\n".join(f"--- {s.name} ({s.outcome})\n{s.log}" for s in self.steps)


# handler(runner, with_, env) -> outputs
UsesHandler = Callable[["StepRunner", dict[str, str], dict[str, str]], dict[str, str]]


def read_output_file(path: Path) -> dict[str, str]:
    """`name=value` lines and `name<<DELIMITER` blocks, as GITHUB_OUTPUT and GITHUB_ENV have."""
    values: dict[str, str] = {}
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            end = lines.index(delimiter, i + 1)
            values[name] = "\n".join(lines[i + 1 : end])
            i = end + 1
            continue
        if line.strip():
            name, value = line.split("=", 1)
            values[name] = value
        i += 1
    return values


class StepRunner:
    """One job on one runner: a workspace, RUNNER_TEMP, a PATH and the env that GITHUB_ENV built."""

    def __init__(
        self,
        workspace: Path,
        temp: Path,
        *,
        base_env: Mapping[str, str],
        contexts: Mapping[str, Any],
        handlers: Mapping[str, UsesHandler],
        job_env: Mapping[str, str] | None = None,
    ) -> None:
        self.workspace = workspace
        self.temp = temp
        self.base_env = dict(base_env)
        self.contexts = dict(contexts)
        self.handlers = dict(handlers)
        self.job_env = dict(job_env or {})
        self.exported_env: dict[str, str] = {}
        self.path_prepend: list[str] = []
        self.summary = temp / "step_summary.md"
        self.summary.touch()
        self._files = 0

    def add_path(self, directory: Path | str) -> None:
        self.path_prepend.insert(0, str(directory))

    def _env(self, *layers: Mapping[str, str]) -> dict[str, str]:
        env = {**self.base_env, **self.job_env, **self.exported_env}
        for layer in layers:
            env.update(layer)
        if self.path_prepend:
            env["PATH"] = os.pathsep.join([*self.path_prepend, env.get("PATH", "")])
        github = self.contexts.get("github", {})
        env.update(
            GITHUB_ACTIONS="true",
            CI="true",
            GITHUB_WORKSPACE=str(self.workspace),
            RUNNER_TEMP=str(self.temp),
            GITHUB_STEP_SUMMARY=str(self.summary),
            GITHUB_JOB=to_string(github.get("job")),
            GITHUB_RUN_ID=to_string(github.get("run_id")),
            GITHUB_RUN_ATTEMPT=to_string(github.get("run_attempt")),
            GITHUB_REPOSITORY=to_string(github.get("repository")),
            GITHUB_WORKFLOW_REF=to_string(github.get("workflow_ref")),
        )
        return env

    def _fresh(self, stem: str) -> Path:
        self._files += 1
        path = self.temp / f"_{stem}_{self._files}"
        path.write_text("", encoding="utf-8")
        return path

    def _run_script(
        self, step: Mapping[str, Any], contexts: Mapping[str, Any], status: str, env: dict[str, str]
    ) -> StepResult:
        shell = step.get("shell", "bash")
        assert shell == "bash", f"only `shell: bash` is emulated, got {shell!r}"
        script = self._fresh("script.sh")
        script.write_text(interpolate(step["run"], contexts, status), encoding="utf-8")
        output, exported, path = self._fresh("output"), self._fresh("env"), self._fresh("path")
        env = {**env, "GITHUB_OUTPUT": str(output), "GITHUB_ENV": str(exported),
               "GITHUB_PATH": str(path)}
        cwd = self.workspace / interpolate(step.get("working-directory", "."), contexts, status)
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False,
        )
        self.exported_env.update(read_output_file(exported))
        for line in reversed(path.read_text(encoding="utf-8").splitlines()):
            if line.strip():
                self.add_path(line.strip())
        return StepResult(
            name=step.get("name", "run"), id=step.get("id"),
            outcome="success" if proc.returncode == 0 else "failure",
            returncode=proc.returncode, outputs=read_output_file(output),
            log=proc.stdout + proc.stderr,
        )

    def run_steps(
        self,
        steps: list[Mapping[str, Any]],
        contexts: Mapping[str, Any],
        *,
        env: Mapping[str, str] | None = None,
    ) -> tuple[str, list[StepResult]]:
        """Run `steps` in order; returns the overall outcome and one result per step.

        `contexts["steps"]`, when given, stands for steps that ran before these.
        """
        step_outputs: dict[str, Any] = dict(contexts.get("steps") or {})
        results: list[StepResult] = []
        status = "success"
        for step in steps:
            ctx = {**contexts, "steps": step_outputs, "env": self._env(env or {})}
            name = to_string(interpolate(step.get("name", step.get("uses", "run")), ctx, status))
            if not condition(step.get("if"), ctx, status):
                result = StepResult(name=name, id=step.get("id"), outcome="skipped")
            else:
                step_env = {k: to_string(interpolate(v, ctx, status))
                            for k, v in (step.get("env") or {}).items()}
                full_env = self._env(env or {}, step_env)
                if "run" in step:
                    result = self._run_script(step, ctx, status, full_env)
                    result.name = name
                else:
                    with_ = {k: to_string(interpolate(v, ctx, status))
                             for k, v in (step.get("with") or {}).items()}
                    result = self._run_uses(step, name, with_, {**(env or {}), **step_env})
            results.append(result)
            if result.id:
                step_outputs[result.id] = {
                    "outputs": result.outputs,
                    "outcome": result.outcome,
                    "conclusion": result.outcome,
                }
            if result.outcome == "failure":
                status = "failure"
        return status, results

    def _run_uses(
        self, step: Mapping[str, Any], name: str, with_: dict[str, str], env: dict[str, str]
    ) -> StepResult:
        uses = str(step["uses"])
        if uses.startswith("./"):
            action = self.run_action(self.workspace / uses, with_, env=env)
            return StepResult(name=name, id=step.get("id"), outcome=action.outcome,
                              outputs=action.outputs, log=action.log)
        handler = self.handlers.get(uses)
        assert handler is not None, f"no handler for `uses: {uses}`"
        try:
            outputs = handler(self, with_, self._env(env))
        except StepFailed as exc:
            return StepResult(name=name, id=step.get("id"), outcome="failure", log=str(exc))
        return StepResult(name=name, id=step.get("id"), outcome="success", outputs=outputs)

    def run_job(self, job: Mapping[str, Any]) -> tuple[str, list[StepResult], dict[str, str]]:
        """A workflow job's steps with its `env:`; returns outcome, step results and job outputs."""
        self.job_env = {k: to_string(interpolate(v, self.contexts))
                        for k, v in (job.get("env") or {}).items()}
        status, results = self.run_steps(job["steps"], self.contexts)
        return status, results, job_outputs(job, self.contexts, results)

    def run_action(
        self, action_dir: Path, with_: Mapping[str, str], *, env: Mapping[str, str] | None = None
    ) -> ActionResult:
        """Run the composite action in `action_dir` with inputs `with_`, as `uses:` would."""
        action = yaml.safe_load((action_dir / "action.yml").read_text(encoding="utf-8"))
        assert action["runs"]["using"] == "composite"
        declared = action.get("inputs") or {}
        unknown = set(with_) - set(declared)
        assert not unknown, f"inputs not declared by {action_dir}/action.yml: {sorted(unknown)}"
        inputs = {}
        for key, spec in declared.items():
            if key in with_:
                inputs[key] = with_[key]
            else:
                assert not spec.get("required") or "default" in spec, f"input {key} is required"
                inputs[key] = to_string(interpolate(spec.get("default", ""), self.contexts))
        contexts = {**self.contexts, "inputs": inputs}
        env = {**(env or {}), "GITHUB_ACTION_PATH": str(action_dir)}
        status, results = self.run_steps(action["runs"]["steps"], contexts, env=env)
        step_ctx = {r.id: {"outputs": r.outputs, "outcome": r.outcome} for r in results if r.id}
        out_ctx = {**contexts, "steps": step_ctx}
        outputs = {key: to_string(interpolate(spec.get("value", ""), out_ctx, status))
                   for key, spec in (action.get("outputs") or {}).items()}
        return ActionResult(outcome=status, outputs=outputs, steps=results)


def workflow_call_inputs(workflow: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The `inputs` context of a called workflow: given values over typed defaults."""
    triggers = workflow.get(True, workflow.get("on"))
    declared = triggers["workflow_call"]["inputs"]
    unknown = set(given) - set(declared)
    assert not unknown, f"inputs not declared by workflow_call: {sorted(unknown)}"
    inputs: dict[str, Any] = {}
    for key, spec in declared.items():
        missing = key not in given
        assert not (missing and spec.get("required")), f"workflow_call input {key} is required"
        value = given[key] if not missing else spec.get("default")
        kind = spec.get("type", "string")
        if value is None:
            value = {"boolean": False, "number": 0}.get(kind, "")
        assert isinstance(value, {"boolean": bool, "number": (int, float)}.get(kind, str)), key
        inputs[key] = value
    return inputs


def job_outputs(job: Mapping[str, Any], contexts: Mapping[str, Any],
                results: list[StepResult]) -> dict[str, str]:
    steps = {r.id: {"outputs": r.outputs, "outcome": r.outcome} for r in results if r.id}
    ctx = {**contexts, "steps": steps}
    return {k: to_string(interpolate(v, ctx)) for k, v in (job.get("outputs") or {}).items()}

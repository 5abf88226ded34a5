"""Errors that end the gate with exit code 2: the input, not the policy, is wrong."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

MAX_CAUSE_CHARS = 600
"""An error line echoes at most this much of a cause: a hostile value (a YAML alias expanded
to megabytes) must not become a megabyte stderr line."""


def shorten(text: str, limit: int = MAX_CAUSE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


class InputError(Exception):
    """Bad input: config, checkpoint, artifact or probes unreadable or invalid.

    Rendered as one line, ``FILE: KEY: cause``, so a CI log names exactly what to fix.
    """

    def __init__(self, file: str | Path | None, key: str | None, cause: str) -> None:
        self.file = str(file) if file is not None else None
        self.key = shorten(key, MAX_CAUSE_CHARS // 4) if key is not None else None
        text = str(cause)
        flat = " ".join(text[: 4 * MAX_CAUSE_CHARS].split())  # never split a huge text whole
        if len(text) > 4 * MAX_CAUSE_CHARS:
            flat = f"{flat[:MAX_CAUSE_CHARS]}... ({len(text) - MAX_CAUSE_CHARS} more characters)"
        self.cause = shorten(flat)
        super().__init__(self.line())

    def line(self) -> str:
        parts = [p for p in (self.file, self.key) if p]
        return ": ".join([*parts, self.cause])

    def under(self, key: str) -> InputError:
        """This error, naming the config key ``key`` whose path was being read.

        A key of the same config section (``hf_model.tokenizer`` under ``hf_model.model_dir``)
        already names what to fix and is kept; a key inside the file (``input_ids``,
        ``line 3.text``, ``architectures``) is kept after it: ``hf_model.probes: line 3.text``;
        a loader's whole-file key (:data:`WHOLE_FILE_KEYS`) gives way to ``key``.
        """
        if self.key is not None and self.key.split(".")[0] == key.split(".")[0]:
            return self
        inner = None if self.key in WHOLE_FILE_KEYS else self.key
        return InputError(self.file, key if inner is None else f"{key}: {inner}", self.cause)


WHOLE_FILE_KEYS = ("model", "tokenizer", "config.json")
"""Keys the HF loaders give a failure of the whole file or directory (nothing inside it to
point at): under a config key, that key alone names it."""


def name_config_key(error: InputError, named: Mapping[str, Path], config: Path) -> InputError:
    """``error`` naming the config key whose path it is about, wherever it was raised.

    ``named`` maps each config key to the path it names (resolved). A file named exactly, or
    one inside a named directory (``model_dir/config.json``), gets that key through
    :meth:`InputError.under`, the most specific path winning: an artifact's
    ``inputs.obs: axis 1 is 11 ...`` becomes ``policy.artifact: inputs.obs: ...``. Errors
    about the config itself, or about no file, are returned unchanged; a folder at or above
    the config's own is never taken to name what lies inside it."""
    if error.file is None or isinstance(error, MissingExtra):
        return error
    file = Path(error.file).expanduser().resolve()
    config = config.resolve()
    if file == config:
        return error
    best: tuple[int, str] | None = None
    for key, path in named.items():
        if file == path:
            rank = 2 ** 16
        elif path in file.parents and path not in (config.parent, *config.parent.parents):
            rank = len(path.parts)
        else:
            continue
        if best is None or rank > best[0]:
            best = (rank, key)
    return error if best is None else error.under(best[1])


class MissingExtra(InputError):
    """An optional dependency needed by the configured engine is not installed."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(
            None,
            None,
            f"{module} is not installed; install it with: pip install 'paritygate[{extra}]'",
        )


class NonFiniteOutput(Exception):
    """A model produced NaN/Inf where a measurement needs finite numbers (sampling from its
    distribution, scoring a token). Not bad input: the check that hit it fails by this cause
    (:meth:`paritygate.gate.Gate.measure` turns it into a named finding), never ``error``."""


def write_failed(exc: OSError, where: Path, key: str) -> InputError:
    """A file the gate writes (golden, report) could not be written: the path and the OS
    error, as one line; ended like bad input (exit 2), never as a verdict."""
    path = exc.filename or where
    return InputError(path, key, f"cannot write: {exc.strerror or exc}")


@contextmanager
def keyed(key: str) -> Iterator[None]:
    """Name the config key ``key`` in every :class:`InputError` raised inside the block.

    Wraps the reading of the path that ``key`` gives (a model directory, a probe file, a
    checkpoint), so an error found deep in a loader names the config entry that points at
    the file as well as the file itself."""
    try:
        yield
    except MissingExtra:
        raise  # about the environment, not the file
    except InputError as exc:
        raise exc.under(key) from None


def dotted_leaves(node: object, key: str = "") -> Iterator[tuple[str, object]]:
    """Every leaf of nested dicts and lists with the key an error names it by
    (``causal_lm.sampling.training``, ``layers[2]``): what a config or ``config.json``
    check walks to find the value it refuses."""
    if isinstance(node, dict):
        for name, value in node.items():
            yield from dotted_leaves(value, f"{key}.{name}" if key else str(name))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from dotted_leaves(value, f"{key}[{i}]")
    else:
        yield key, node

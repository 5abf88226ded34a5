"""The YAML ``paritygate init`` writes, rendered from the jinja2 templates of
``paritygate/init_templates`` (package data): what init infers is the templates' context, the
layout and comments of each config live in its template."""

from __future__ import annotations

import json
from functools import cache

import jinja2


def flow(value: object) -> str:
    """A YAML flow value: JSON for lists and scalars, ``{k: v}`` for a mapping (``net_arch:
    {pi: [64], vf: [32]}``)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("paritygate", "init_templates"),
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters["q"] = json.dumps  # a YAML scalar: JSON strings and numbers are valid YAML
    env.filters["flow"] = flow
    env.filters["inline_json"] = lambda d: "{" + ", ".join(
        f"{k}: {json.dumps(v)}" for k, v in d.items()) + "}"
    env.filters["pyrepr"] = repr
    return env


def render(template: str, **context: object) -> str:
    """``init_templates/<template>`` rendered with ``context``."""
    return _environment().get_template(template).render(**context)

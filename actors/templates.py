"""Prompt templates (Jinja2 in YAML, StrictUndefined) and the action protocol: parsing a turn's
bash block and detecting the submission. The one template loader: the agent's prompts, the PRM
judge's (actors/prm.py) and the systemd units (swarl/systemd.py) read and compile through
`template_file`, `read_template_mapping` and `strict_env`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from jinja2 import Environment, StrictUndefined, Template
from pydantic import BaseModel, ConfigDict, Field

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROMPTS = REPO_ROOT / "configs" / "prompts" / "swebench.yaml"


class TemplateError(ValueError):
    """A prompt file is missing, malformed, or a template failed to render (names the template)."""


def strict_env(**options: Any) -> Environment:
    """Jinja2 with StrictUndefined: a variable a template names but nobody passes fails loudly."""
    return Environment(undefined=StrictUndefined, **{"keep_trailing_newline": False, **options})


def template_file(path: str | Path | None, default: Path) -> Path:
    """`path` as given, else relative to the repository (e.g. configs/prompts/compact.yaml from
    any directory), else `default` when unset."""
    p = Path(path) if path else default
    if not p.is_absolute() and not p.exists() and (REPO_ROOT / p).exists():
        p = REPO_ROOT / p
    return p


def read_template_mapping(p: Path, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A YAML mapping of template names, with `required` present; TemplateError naming the file."""
    if not p.exists():
        raise TemplateError(f"{p} does not exist")
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise TemplateError(f"{p}: not valid YAML: {e}") from e
    if not isinstance(doc, dict):
        raise TemplateError(f"{p}: expected a mapping of template names")
    if missing := [k for k in required if k not in doc]:
        raise TemplateError(f"{p}: missing template(s) {', '.join(missing)}")
    return doc


class PromptTemplates(BaseModel):
    """One prompt file: the templates and the protocol constants they rely on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    system: str = Field(description="System message.")
    instance: str = Field(description="First user message (the task).")
    observation: str = Field(description="User message carrying a command's result.")
    format_error: str = Field(description="User message answering a turn without exactly one action.")
    context_marker: str = Field(description="The one user message standing for omitted turns.")
    action_regex: str = Field(r"```bash\s*\n(.*?)\n```", description="One match per action (dotall).")
    submit_marker: str = Field("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
                               description="First output line that submits the episode.")
    max_output_chars: int = Field(10_000, description="Longer outputs show only head and tail.")
    head_chars: int = Field(5_000, description="Characters of output kept at the head when eliding.")
    tail_chars: int = Field(5_000, description="Characters of output kept at the tail when eliding.")

    @cached_property
    def _compiled(self) -> dict[str, Template]:
        env = strict_env()
        return {name: env.from_string(getattr(self, name))
                for name in ("system", "instance", "observation", "format_error", "context_marker")}

    def render(self, name: str, **variables: Any) -> str:
        consts = {"max_output_chars": self.max_output_chars, "head_chars": self.head_chars,
                  "tail_chars": self.tail_chars}
        try:
            return self._compiled[name].render(**consts, **variables).strip("\n")
        except Exception as e:  # jinja2 raises several types; name the template
            raise TemplateError(f"template {name!r}: {e}") from e

    def parse_actions(self, text: str) -> list[str]:
        return [m.strip() for m in re.findall(self.action_regex, text, re.DOTALL)]


def load_templates(path: str | Path | None = None) -> PromptTemplates:
    p = template_file(path, DEFAULT_PROMPTS)
    doc = read_template_mapping(p)
    try:
        t = PromptTemplates.model_validate(doc)
        _ = t._compiled  # syntax errors surface at load time, not mid-episode
    except Exception as e:
        raise TemplateError(f"{p}: {e}") from e
    return t


@dataclass
class Submission:
    patch: str


def detect_submission(t: PromptTemplates, returncode: int, output: str) -> Submission | None:
    """Submitted when the first output line is the marker and the command succeeded; the
    rest of the output is the patch."""
    lines = output.lstrip().splitlines(keepends=True)
    if returncode == 0 and lines and lines[0].strip() == t.submit_marker:
        return Submission(patch="".join(lines[1:]))
    return None

"""Prompt templates (Jinja2 in YAML, StrictUndefined) and the action protocol: parsing a turn's
bash block and detecting the submission."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from jinja2 import Environment, StrictUndefined, Template
from pydantic import BaseModel, ConfigDict, Field

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "configs" / "prompts" / "swebench.yaml"


class TemplateError(ValueError):
    """A prompt file is missing, malformed, or a template failed to render (names the template)."""


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
        env = Environment(undefined=StrictUndefined, keep_trailing_newline=False)
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
    p = Path(path) if path else DEFAULT_PROMPTS
    if not p.is_absolute() and not p.exists() and (DEFAULT_PROMPTS.parents[2] / p).exists():
        p = DEFAULT_PROMPTS.parents[2] / p  # e.g. configs/prompts/compact.yaml from any directory
    if not p.exists():
        raise TemplateError(f"prompt file {p} does not exist")
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise TemplateError(f"{p}: not valid YAML: {e}") from e
    if not isinstance(doc, dict):
        raise TemplateError(f"{p}: expected a mapping of template names")
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

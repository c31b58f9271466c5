"""Parse `key = value` config text with [sections] and # comments."""

from __future__ import annotations


class ConfigSyntaxError(ValueError):
    """A line that is neither blank, a comment, a section header nor `key = value`."""


def parse(text: str) -> dict[str, dict[str, str]]:
    """Sections to {key: value}; keys before any header go to the "default" section."""
    config: dict[str, dict[str, str]] = {"default": {}}
    section = "default"
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            config.setdefault(section, {})
            continue
        if "=" not in line:
            raise ConfigSyntaxError(f"line {number}: expected `key = value`, got {raw!r}")
        key, value = line.split("=", 1)
        config[section][key.strip()] = value.strip()
    return config

"""Typed access to parsed config values."""

from __future__ import annotations

TRUE = frozenset({"1", "yes", "true", "on"})
FALSE = frozenset({"0", "no", "false", "off"})

Config = dict[str, dict[str, str]]


def get(config: Config, key: str, section: str = "default", default: str | None = None) -> str | None:
    return config.get(section, {}).get(key, default)


def get_int(config: Config, key: str, section: str = "default", default: int = 0) -> int:
    """The value as an int; `default` when the key is absent."""
    value = get(config, key, section)
    return int(value) if value is not None else default


def get_bool(config: Config, key: str, section: str = "default", default: bool = False) -> bool:
    value = get(config, key, section)
    if value is None:
        return default
    if value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
        return False
    raise ValueError(f"{section}.{key}: not a boolean: {value!r}")

"""Config sections and the layered loader every swarl process uses.

`Section` is the base of each component's own config section: unknown keys are errors, so a
typo names itself. `LayeredSettings` is the base of a whole-system config; `Model.load(path,
overrides, environ)` validates, lowest to highest precedence:

  defaults < YAML file < environment (PREFIX<SECTION>__<KEY>, plus short aliases) < --set K=V

The layers are pydantic-settings sources (YamlConfigSettingsSource, EnvSettingsSource and a
dict source for --set). Values from the environment and --set are YAML scalars (`3`, `1e-6`,
`true`, `null`, `[a, b]`, `{k: v}`). Any unknown or ill-typed key raises SettingsError naming
the dotted key and the layer it came from.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, Self

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)


class Section(BaseModel):
    """A config section: extra keys are rejected so a typo names itself."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SettingsError(ValueError):
    """A config problem; the message names the dotted key and where it came from."""


def parse_scalar(raw: str) -> Any:
    """A value from the environment or --set: a YAML scalar (pydantic then coerces it)."""
    try:
        return yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        return raw


def _nest(dotted: str, value: Any, tree: dict[str, Any], source: str) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise SettingsError(f"{source}: {dotted}: {p} is not a section")
        node = nxt
    node[parts[-1]] = value


class _Overrides(PydanticBaseSettingsSource):
    """`--set section.key=value` items as a settings source."""

    def __init__(self, settings_cls: type[BaseSettings], items: Iterable[str]) -> None:
        super().__init__(settings_cls)
        self.tree: dict[str, Any] = {}
        self.origin: dict[str, str] = {}
        for item in items:
            if "=" not in item:
                raise SettingsError(f"--set {item!r}: expected KEY=VALUE, e.g. learner.lr=1e-5")
            key, raw = (s.strip() for s in item.split("=", 1))
            _nest(key, parse_scalar(raw), self.tree, f"--set {key}")
            self.origin[key] = f"--set {key}"

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.tree.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self.tree


class _Environment(EnvSettingsSource):
    """The environment as pydantic-settings reads it, from a given mapping, with short aliases
    (SWARL_REDIS_URL = SWARL_REDIS__URL) and YAML-scalar values."""

    def __init__(self, settings_cls: type[LayeredSettings], environ: Mapping[str, str]) -> None:
        prefix = settings_cls.env_prefix
        self.origin: dict[str, str] = {}
        mapped: dict[str, str] = {}
        sections = set(settings_cls.model_fields)
        for name, raw in sorted(environ.items()):
            if name in settings_cls.env_aliases:
                dotted = settings_cls.env_aliases[name]
            elif name.startswith(prefix) and "__" in name:
                dotted = name[len(prefix):].lower().replace("__", ".")
            else:
                continue
            if dotted.split(".", 1)[0] not in sections:
                raise SettingsError(f"unknown config key {dotted!r} (from env {name})")
            mapped[prefix + dotted.upper().replace(".", "__")] = raw
            self.origin[dotted] = f"env {name}"
        self._mapped = mapped
        super().__init__(settings_cls, case_sensitive=False, env_prefix=prefix,
                         env_nested_delimiter="__")

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k.lower(): v for k, v in self._mapped.items()}

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        return value  # parsed once, as a YAML scalar, in prepare_field_value

    def prepare_field_value(self, field_name: str, field: FieldInfo, value: Any,
                            value_is_complex: bool) -> Any:
        return _scalars(super().prepare_field_value(field_name, field, value, value_is_complex))


def _scalars(value: Any) -> Any:
    if isinstance(value, str):
        return parse_scalar(value)
    if isinstance(value, dict):
        return {k: _scalars(v) for k, v in value.items()}
    return value


# The layers of the load() call in progress (a plain SwarlConfig() is defaults only).
_LAYERS: ContextVar[tuple[PydanticBaseSettingsSource, ...]] = ContextVar("swarl_layers", default=())


class LayeredSettings(BaseSettings):
    """A whole-system config made of Sections; build it with `load`."""

    model_config = SettingsConfigDict(extra="forbid", validate_assignment=True)
    env_prefix: ClassVar[str] = "SWARL_"
    env_aliases: ClassVar[dict[str, str]] = {}

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, *_LAYERS.get())

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None, overrides: Iterable[str] = (),
             environ: Mapping[str, str] | None = None) -> Self:
        """Validate defaults < `path` (YAML; None: none) < `environ` < `overrides`."""
        environ = os.environ if environ is None else environ
        layers: list[PydanticBaseSettingsSource] = [_Overrides(cls, overrides), _Environment(cls, environ)]
        origin = {**layers[1].origin, **layers[0].origin}  # type: ignore[attr-defined]
        if path is not None:
            layers.append(_yaml_source(cls, Path(path)))
        token = _LAYERS.set(tuple(layers))
        try:
            return cls()
        except ValidationError as e:
            raise SettingsError(format_errors(e, origin, path)) from None
        finally:
            _LAYERS.reset(token)


def _yaml_source(cls: type[BaseSettings], path: Path) -> YamlConfigSettingsSource:
    if not path.exists():
        raise SettingsError(f"config file {path} does not exist")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SettingsError(f"{path}: not valid YAML: {e}") from e
    if loaded is not None and not isinstance(loaded, dict):
        raise SettingsError(f"{path}: top level must be a mapping of sections")
    if bad := _non_string_key(loaded):
        raise SettingsError(f"{path}: keys must be strings, got {bad}")
    return YamlConfigSettingsSource(cls, yaml_file=path)


def _non_string_key(doc: object, where: str = "") -> str | None:
    """The first mapping key that is not a string (`~:` or `1:` in YAML), named with its path."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if not isinstance(k, str):
                return f"{k!r}" + (f" under {where!r}" if where else " at the top level")
            if bad := _non_string_key(v, f"{where}.{k}" if where else k):
                return bad
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            if bad := _non_string_key(v, f"{where}[{i}]"):
                return bad
    return None


def format_errors(err: ValidationError, origin: Mapping[str, str],
                  path: str | os.PathLike[str] | None = None) -> str:
    lines = []
    for e in err.errors():
        dotted = ".".join(str(p) for p in e["loc"])
        src = origin.get(dotted) or (f"file {path}" if path else None)
        where = f" (from {src})" if src else ""
        if e["type"] == "extra_forbidden":
            lines.append(f"unknown config key {dotted!r}{where}")
        else:
            lines.append(f"config key {dotted!r}{where}: {e['msg']} (got {e.get('input')!r})")
    return "; ".join(lines)


def load_section(model: type[BaseModel], path: str | os.PathLike[str], section: str) -> Any:
    """One section of a YAML config file (the rest of the file is not validated here)."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SettingsError(f"{p}: {e}") from e
    if not isinstance(doc, dict):
        raise SettingsError(f"{p}: top level must be a mapping of sections")
    try:
        return model.model_validate(doc.get(section) or {})
    except ValidationError as e:
        raise SettingsError(format_errors(e, {}, p).replace("'", f"'{section}.", 1)) from None

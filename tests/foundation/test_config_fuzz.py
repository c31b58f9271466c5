"""Fuzzed configs: any `--set key=value`, environment variable or YAML document either loads or
is refused with a SettingsError naming the key and where it came from, never another error."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fuzz_http import FUZZ_EXAMPLES, settings
from hypothesis import given
from hypothesis import strategies as st

from common.settings import SettingsError
from swarl.config import SwarlConfig, load_config

pytestmark = pytest.mark.fuzz
KEYS = sorted(f"{section}.{key}" for section, model in SwarlConfig.model_fields.items()
              for key in (getattr(model.annotation, "model_fields", None) or {}))
TEXT = st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=20)
SCALAR = st.one_of(TEXT, st.integers().map(str), st.floats().map(str), st.sampled_from(["true", "[]", "{}", "null", "-1"]))


@settings(FUZZ_EXAMPLES * 5)
@given(key=st.sampled_from(KEYS) | TEXT, value=SCALAR)
def test_set_overrides(key: str, value: str) -> None:
    try:
        load_config(None, [f"{key}={value}"], environ={})
    except SettingsError as e:
        assert str(e).strip()
        if key in KEYS:
            assert key in str(e) or key.split(".")[0] in str(e), str(e)


@settings(FUZZ_EXAMPLES * 5)
@given(key=st.sampled_from(KEYS), value=SCALAR)
def test_environment(key: str, value: str) -> None:
    section, name = key.split(".", 1)
    try:
        load_config(None, [], environ={f"SWARL_{section.upper()}__{name.upper()}": value})
    except SettingsError as e:
        assert key in str(e) or section in str(e), str(e)


@settings(FUZZ_EXAMPLES * 5)
@given(doc=st.recursive(st.none() | st.booleans() | st.integers() | TEXT,
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS[:40]) | TEXT, inner, max_size=3),
                        max_leaves=8),
       text=TEXT)
def test_yaml_documents(tmp_path_factory: pytest.TempPathFactory, doc: object, text: str) -> None:
    d = tmp_path_factory.mktemp("cfg")
    for i, body in enumerate((yaml.safe_dump(doc), text, "run: [unclosed")):
        path = Path(d) / f"c{i}.yaml"
        path.write_text(body)
        try:
            load_config(path, [], environ={})
        except SettingsError as e:
            assert str(e).strip()

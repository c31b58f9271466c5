import pytest

from swarl.config import DEFAULT_CONFIG, ConfigError, load_config


def test_defaults_and_local_yaml_load():
    cfg = load_config(DEFAULT_CONFIG, environ={})
    assert cfg.run.id == "local" and cfg.redis.url is None


def test_precedence_yaml_env_cli(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("run:\n  id: from-yaml\nadmission:\n  batch_size: 3\n")
    cfg = load_config(f, environ={})
    assert (cfg.run.id, cfg.admission.batch_size) == ("from-yaml", 3)
    env = {"SWARL_RUN_ID": "from-env", "SWARL_ADMISSION__BATCH_SIZE": "5",
           "SWARL_REDIS_URL": "redis://h:1/0", "UNRELATED": "x"}
    cfg = load_config(f, environ=env)
    assert (cfg.run.id, cfg.admission.batch_size, cfg.redis.url) == ("from-env", 5, "redis://h:1/0")
    cfg = load_config(f, ["admission.batch_size=7", "pool.exec_urls=[http://a, http://b]"], environ=env)
    assert cfg.admission.batch_size == 7 and cfg.pool.exec_urls == ["http://a", "http://b"]


@pytest.mark.parametrize(
    "yaml_text, sets, env, needle",
    [
        ("admission:\n  batch_sise: 3\n", [], {}, "unknown config key 'admission.batch_sise'"),
        ("nosuch:\n  x: 1\n", [], {}, "unknown config key 'nosuch'"),
        ("", ["admission.batch_size=many"], {}, "'admission.batch_size' (from --set admission.batch_size)"),
        ("", [], {"SWARL_ADMISSION__MAX_STALENESS": "x"}, "env SWARL_ADMISSION__MAX_STALENESS"),
        ("", [], {"SWARL_LEARNER__NOPE": "1"}, "unknown config key 'learner.nope'"),
        ("", ["admission"], {}, "expected KEY=VALUE"),
        ("- a\n- b\n", [], {}, "top level must be a mapping"),
        ("~: 1\n", [], {}, "keys must be strings, got None at the top level"),
        ("run:\n  yes: 2\n", [], {}, "keys must be strings, got True under 'run'"),
        ("a: [\n", [], {}, "not valid YAML"),
    ],
)
def test_errors_name_the_key(tmp_path, yaml_text, sets, env, needle):
    f = tmp_path / "c.yaml"
    f.write_text(yaml_text)
    with pytest.raises(ConfigError) as e:
        load_config(f, sets, environ=env)
    assert needle in str(e.value)


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml", environ={})

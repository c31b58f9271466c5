"""The whole-system config: one model composed of each component's own section.

Precedence (lowest to highest): defaults < YAML file < SWARL_* environment < CLI `--set`
(common.settings does the layering). Environment: `SWARL_<SECTION>__<KEY>=value` (nested with
`__`), plus the aliases below. An unknown or ill-typed key raises ConfigError naming the dotted
key and where it came from. Components never see this model: the commands hand each one its
own sections (and the run's Keys, built here once).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import Field

from actors.config import ActorConfig, EvalConfig
from broker.config import AdmissionConfig, QueueConfig, RedisConfig, ReplayConfig
from broker.keys import Keys
from common.settings import LayeredSettings, Section, SettingsError
from envd.config import EnvdConfig, PoolConfig
from inference.config import InferenceConfig
from learner.config import LearnerConfig
from swarl.plan import ClusterConfig
from weight_sync.config import WeightSyncConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "local.yaml"

# Short environment names operators expect, mapped to dotted keys.
ENV_ALIASES = {
    "SWARL_REDIS_URL": "redis.url",
    "SWARL_RUN_ID": "run.id",
    "SWARL_RUN_DIR": "run.dir",
    "SWARL_ENVD_TOKEN": "envd.token",
    "SWARL_POOL_URL": "pool.url",
    "SWARL_LOG_LEVEL": "run.log_level",
}

ConfigError = SettingsError


class RunConfig(Section):
    id: str = Field("local", description="Run id; every Redis key lives under <prefix>:{<id>}:.")
    dir: str = Field("runs/local", description="Run directory: logs, checkpoints, weights, trajectories.")
    seed: int = Field(0, description="Global seed.")
    log_level: str = Field("info", description="debug, info, warning or error.")
    log_format: str = Field("text", description="text (key=value) or json.")


class SwarlConfig(LayeredSettings):
    env_aliases: ClassVar[dict[str, str]] = ENV_ALIASES

    run: RunConfig = Field(default_factory=RunConfig)
    redis: RedisConfig = Field(default_factory=RedisConfig)
    queue: QueueConfig = Field(default_factory=QueueConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    envd: EnvdConfig = Field(default_factory=EnvdConfig)
    pool: PoolConfig = Field(default_factory=PoolConfig)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    weight_sync: WeightSyncConfig = Field(default_factory=WeightSyncConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)

    @property
    def keys(self) -> Keys:
        """The run's Redis key names: the one place they are built from the config."""
        return Keys(prefix=self.redis.prefix, run=self.run.id)

    def redis_at(self, url: str) -> RedisConfig:
        """The redis section pointed at `url` (a private server a command started)."""
        return self.redis.model_copy(update={"url": url})


def rollout_temperature_error(cfg: SwarlConfig) -> str | None:
    """Why a learner would train on logprobs of another distribution than the actors sample
    from, or None. Greedy actors (temperature 0) are not trained on: nothing to match."""
    sampled, assumed = cfg.actor.sampling.temperature, cfg.learner.rollout_temperature
    if sampled > 0 and sampled != assumed:
        return (f"learner.rollout_temperature={assumed:g} but actor.sampling.temperature={sampled:g}: "
                "the learner's logprobs are of softmax(logits / learner.rollout_temperature) and must "
                "be of the distribution the actors sample from; set both")
    return None


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> SwarlConfig:
    """Load YAML (default: $SWARL_CONFIG, else configs/local.yaml), then the environment, then
    `overrides` (`section.key=value`), and validate."""
    environ = os.environ if environ is None else environ
    cfg_path = Path(path) if path else Path(environ.get("SWARL_CONFIG", DEFAULT_CONFIG))
    if not path and not cfg_path.exists():
        return SwarlConfig.load(None, overrides, environ)
    return SwarlConfig.load(cfg_path, overrides, environ)


SECRET_KEY = re.compile(r"(^|_)(token|api_key|password|secret)$")
MASK = "***"


def redact(value: object, key: str = "") -> object:
    """`value` with secrets masked: any key named *token / *api_key / *password / *secret, and
    the password of any URL (redis://user:PASSWORD@host)."""
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if value is not None and SECRET_KEY.search(key):
        return MASK
    if isinstance(value, str) and "://" in value and "@" in value:
        u = urlsplit(value)
        if u.password:
            netloc = u.netloc.replace(f":{u.password}@", f":{MASK}@", 1)
            return urlunsplit(u._replace(netloc=netloc))
    return value


def dump_config(cfg: SwarlConfig, secrets: bool = False) -> str:
    """The config as YAML, secrets masked unless `secrets`."""
    doc = cfg.model_dump(mode="json")
    return yaml.safe_dump(doc if secrets else redact(doc), sort_keys=False)

"""Config section owned by actors: the rollout worker and the agent loop."""

from __future__ import annotations

from pydantic import Field

from common.settings import Section

DEFAULT_EXEC_ENV = {
    "PAGER": "cat",
    "MANPAGER": "cat",
    "LESS": "-R",
    "PIP_PROGRESS_BAR": "off",
    "TQDM_DISABLE": "1",
}


class SamplingConfig(Section):
    temperature: float = Field(default=1.0, description="Sampling temperature sent to /generate (0 = greedy).")
    top_p: float = Field(default=1.0, description="Nucleus sampling threshold.")
    top_k: int = Field(default=-1, description="Top-k (-1 = off).")
    max_new_tokens: int = Field(default=512, description="Longest answer per turn (tokens); also the "
                                "reserve subtracted from max_context_len for the prompt budget.")


class ActorConfig(Section):
    concurrency: int = Field(default=4, ge=1, description="Episodes one actor process runs at once.")
    prompts: str | None = Field(
        default=None, description="YAML file of Jinja2 templates (system, instance, observation, "
        "format_error, ...). Unset: configs/prompts/swebench.yaml (THOUGHT + one bash block per "
        "turn, submission by a marker line).")
    tokenizer: str | None = Field(
        default=None, description="HF tokenizer directory the actor encodes with. Unset: "
        "inference.model, else the server's /get_model_info tokenizer_path.")
    inference_api_key: str | None = Field(
        default=None, description="Bearer key for inference servers (or SWARL_INFERENCE_API_KEY).")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    step_limit: int = Field(default=30, ge=0, description="Model turns per episode before the step "
                            "limit ends it (0 = none).")
    exec_timeout_s: float = Field(default=60.0, description="Per-command timeout inside the container (seconds).")
    episode_timeout_s: float = Field(default=1800.0, description="Wall-clock limit of the agent loop (seconds).")
    eval_timeout_s: float = Field(default=600.0, description="Timeout of the evaluation of the final patch.")
    max_context_len: int = Field(default=4096, gt=0, description="Context window (prompt + answer tokens).")
    context_management: bool = Field(
        default=True, description="Head+tail truncation of the history when the prompt exceeds "
        "max_context_len - max_new_tokens; off: exceeding it ends the episode (context limit).")
    head_ratio: float = Field(default=0.3, ge=0.0, le=1.0, description="Share of the prompt budget "
                              "kept at the head of the history when truncating (the tail gets the rest).")
    dynamic_history: bool = Field(
        default=True, description="One training sample per step whose prompt is exactly the context "
        "the model saw. Off: one sample per episode (then truncation ends the episode instead).")
    reward_resolved: float = Field(default=1.0, description="Reward of a resolved instance.")
    reward_unresolved: float = Field(default=-1.0, description="Reward of an unresolved instance.")
    format_error_penalty: float = Field(default=0.0, description="Subtracted from the reward per format error.")
    compact_filtering: bool = Field(
        default=False, description="Mask (exclude from loss and group statistics) the samples of "
        "episodes that hit the step, context or time limit: a cut-off attempt is not judged.")
    cwd: str = Field(default="/testbed", description="Working directory of commands in the container.")
    exec_env: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_EXEC_ENV),
                                     description="Environment of every command.")
    pin_wait_s: float = Field(default=60.0, description="How long to wait for a ready inference server.")
    allocate_wait_s: float = Field(default=300.0, description="How long the pool may take to lease a container.")
    generate_timeout_s: float = Field(default=600.0, description="HTTP timeout of one /generate call.")
    heartbeat_s: float = Field(default=5.0, description="Interval of the actor registry heartbeat, "
                               "the pin renewal and the lease heartbeat.")
    save_trajectories: bool = Field(default=True, description="Write traj.json / patch.diff / "
                                    "meta.json per episode (also for a failed one, with its error).")
    traj_dir: str | None = Field(default=None, description="Trajectory directory. Unset: "
                                 "<run.dir>/trajectories (the slime plug-in then writes none).")
    shutdown_grace_s: float = Field(default=30.0, description="On SIGTERM, how long running episodes may "
                                    "finish before they are cancelled and handed back to the queue.")

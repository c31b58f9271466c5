"""Config section owned by actors: the rollout worker and the agent loop."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

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


class PrmConfig(Section):
    """Step rewards from a process reward model: every executed step is judged by m votes of a
    judge LLM (a server of role prm), sent while the agent goes on; reward = outcome +
    step_coef x mean(step scores), as the seed's --prm-enable."""

    enable: bool = Field(default=False, description="Judge every step with the PRM (off: outcome reward only).")
    m: int = Field(default=3, ge=1, le=16, description="Votes per step; a step's score is the mean of "
                   "its valid votes (+1 / -1); an unparseable vote is counted and left out.")
    step_coef: float = Field(default=1.0, description="reward = outcome + step_coef x mean step score.")
    temperature: float = Field(default=1.0, ge=0.0, description="Sampling temperature of the judge's votes.")
    max_tokens: int = Field(default=4096, ge=1, description="Longest judge answer (tokens).")
    timeout_s: float = Field(default=300.0, gt=0, description="Bound of one vote's HTTP call, and of the "
                             "wait for outstanding votes once the agent loop has ended; a vote not "
                             "back by then leaves its step unscored (never -1).")
    template: str | None = Field(default=None, description="YAML file of the judge's Jinja2 templates "
                                 "(system, user). Unset: configs/prompts/prm_judge.yaml.")
    reward_mode: Literal["episode", "step"] = Field(
        default="episode", description="episode: every sample of the episode gets outcome + "
        "step_coef x mean step score (the seed). step: sample k of dynamic history gets outcome + "
        "step_coef x score of step k (an unscored step: the outcome), so the learner's advantages "
        "are per step (needs dynamic_history).")
    urls: list[str] = Field(default_factory=list, description="Judge servers (their /v1/chat/completions). "
                            "Empty: the live ready servers of role prm in the server registry.")
    model: str = Field(default="default", description="The `model` field of the judge requests.")
    api_key: str | None = Field(default=None, description="Bearer key of the judge servers. Unset: the "
                                "actor's inference key.")
    history_tokens: int = Field(default=2048, ge=0, description="Token budget of the earlier steps shown "
                                "to the judge, kept by the head+tail rule (head_ratio).")
    problem_chars: int = Field(default=8000, ge=100, description="Longest issue text shown to the judge.")
    output_chars: int = Field(default=4000, ge=100, description="Longest command output of the current "
                              "step shown to the judge (head and tail kept).")
    history_output_chars: int = Field(default=1000, ge=0, description="Longest output of an earlier step.")


class ActorConfig(Section):
    concurrency: int = Field(default=4, ge=1, description="Episodes one actor process generates at "
                             "once (its slots: admission, a pinned server, the agent's turns).")
    grading_concurrency: int = Field(
        default=2, ge=0, description="Episodes past their last turn (grading the patch in a fresh "
        "container, writing samples) one actor runs on top of `concurrency`. An episode gives its "
        "slot to the next one once its last turn is generated, so grading overlaps generation; "
        "when this many are grading, the next finished episode keeps its slot until one is done. "
        "0: a slot is held until the samples are written.")
    environment: Literal["envd", "scored"] = Field(
        default="envd", description="Where episodes run. envd: the SWE agent loop in a container "
        "leased from the envd pool (pool.url), graded by the row's tests. scored: one answer per "
        "episode to the row's `prompt`, scored in the actor's process by `actor.scorer` (no Docker, "
        "no pool; any task a Python function can score).")
    scorer: str = Field(
        default="exact", description="environment scored: the function that scores an answer, "
        "by name (exact: the answer, stripped, equals the row's `answer`) or as module:function "
        "called with (row, answer text) and returning a bool (resolved: actor.reward_resolved / "
        "reward_unresolved) or a float (the reward itself; resolved when >= reward_resolved).")
    prompts: str | None = Field(
        default=None, description="YAML file of Jinja2 templates (system, instance, observation, "
        "format_error, ...). Unset: configs/prompts/swebench.yaml (THOUGHT + one bash block per "
        "turn, submission by a marker line), or configs/prompts/scored.yaml with environment scored.")
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
    sample_per: Literal["step", "auto"] = Field(
        default="step", description="With dynamic_history, the samples of an episode. step: one per "
        "step. auto: one per episode when no step's context was cut (it then holds exactly the steps' "
        "trained tokens and logprobs, each after the very context it was generated from, and the "
        "prompt once instead of once per step), one per step otherwise; per step as well with PRM "
        "judging (its scores and step rewards are per step). The learner's loss is the same up to "
        "its aggregation weights (learner.aggregation sequence weighs samples, so a step sample's "
        "turn and an episode sample's whole episode).")
    reward_resolved: float = Field(default=1.0, description="Reward of a resolved instance.")
    reward_unresolved: float = Field(default=-1.0, description="Reward of an unresolved instance.")
    format_error_penalty: float = Field(default=0.0, description="Subtracted from the reward per format error.")
    mask_format_errors: bool = Field(
        default=False, description="No gradient through a reply without exactly one action (its "
        "loss mask is zeroed; the episode's reward, penalty included, still trains its other "
        "turns and counts in its group). Pushing down the sampled tokens of garbled replies, "
        "which the policy gives low probability, makes the largest gradients of a batch and can "
        "raise entropy into more of them (as DAPO masks truncated replies).")
    compact_filtering: bool = Field(
        default=False, description="Mask (exclude from loss and group statistics) the samples of "
        "episodes that hit the step, context or time limit: a cut-off attempt is not judged.")
    slime_infra_tries: int = Field(
        default=3, ge=1, description="slime plug-in (actors.slime_entry): tries of one sample that "
        "fail for infrastructure. slime's fully-async rollout puts a group with an ABORTED sample "
        "back in its queue, so each failed try but the last answers ABORTED (slime runs it again); "
        "the last answers FAILED with remove_sample, which slime trains as nothing and does not "
        "requeue: a task that keeps failing cannot loop forever.")
    cwd: str = Field(default="/testbed", description="Working directory of commands in the container.")
    exec_env: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_EXEC_ENV),
                                     description="Environment of every command.")
    pin_wait_s: float = Field(default=60.0, description="How long to wait for a ready inference server.")
    allocate_wait_s: float = Field(default=300.0, description="How long the pool may take to lease a container.")
    setup_timeout_s: float = Field(default=300.0, gt=0, description="Bound on a row's setup script (its dataset "
                                   "adapter's: SWE-smith, R2E-Gym) run in the agent's container before the first command.")
    lease_ahead: bool = Field(
        default=True, description="Lease the episode's container while the policy writes its first "
        "turn (which needs only the issue): a container's create and start, seconds for a large "
        "SWE image, come off every episode's path. Off: the first turn waits for the lease.")
    generate_timeout_s: float = Field(default=600.0, description="HTTP timeout of one /generate call.")
    heartbeat_s: float = Field(default=5.0, description="Interval of the actor registry heartbeat, "
                               "the pin renewal and the lease heartbeat.")
    save_trajectories: bool = Field(default=True, description="Write traj.json / patch.diff / "
                                    "meta.json per episode (also for a failed one, with its error). Off: only "
                                    "reward-hack attempts are written (always kept for review).")
    traj_dir: str | None = Field(default=None, description="Trajectory directory. Unset: "
                                 "<run.dir>/trajectories (the slime plug-in then writes none).")
    abandon_stale: bool = Field(
        default=True, description="Stop an episode once the learner can no longer train it: the "
        "published policy version is more than admission.max_staleness past its own (reason stale), "
        "or the learner closed its group without it (reason group_closed: trained at its last chance "
        "without this straggler, or dropped; a member of such a group that has not started never "
        "starts). It ends as one masked sample (its group completes, nothing is trained from it) and "
        "its slot takes a fresh episode.")
    shutdown_grace_s: float = Field(default=30.0, description="On SIGTERM, how long running episodes may "
                                    "finish before they are cancelled and handed back to the queue.")
    prm: PrmConfig = Field(default_factory=PrmConfig)

    @model_validator(mode="after")
    def _step_rewards_need_steps(self) -> ActorConfig:
        if self.prm.enable and self.prm.reward_mode == "step" and not self.dynamic_history:
            raise ValueError("prm.reward_mode: 'step' needs dynamic_history (one sample per step); "
                             "set actor.dynamic_history=true or prm.reward_mode=episode")
        return self


class EvalConfig(Section):
    """Evaluation during training (`swarl eval-worker`, actors/eval_worker.py): every
    every_versions-th published policy version is evaluated on the eval set, on exactly that
    version, by eval servers (role eval) that no actor pins and weight sync never updates."""

    every_versions: int = Field(default=0, ge=0, description="Evaluate every N-th published policy "
                                "version (N, 2N, ...); 0: no evaluation during training.")
    rows: str | None = Field(default=None, description="The eval set: a prepared rows file (JSONL, as "
                             "`swarl data prepare` writes) or a bundled suite's split as "
                             "<suite>:<split> (bundled:heldout, generated:heldout_family, ...). "
                             "Required when every_versions > 0.")
    max_instances: int | None = Field(default=None, ge=1, description="Evaluate only the first N rows "
                                      "of the eval set (unset: all).")
    n_samples: int = Field(default=1, ge=1, description="Episodes per eval task and version.")
    max_concurrent: int = Field(default=2, ge=1, description="Episodes an eval worker runs at once (its "
                                "share of the envd pool; it never takes actor slots or policy servers).")
    seed: int | None = Field(default=0, description="Sampling seed of the eval episodes (one per task and "
                             "sample, the same for every version: versions meet the same draws); null: "
                             "fresh draws.")
    max_tries: int = Field(default=3, ge=1, description="Tries per version: a try that could not load "
                           "the version or ended with episodes not all on it (or with errors) is run "
                           "again; the last try's result stands (failed when the version could not be "
                           "loaded, or a turn ran on another version).")
    servers: list[str] = Field(default_factory=list, description="Ids of the eval servers to use; empty: "
                               "any live server registered with role eval that no other eval worker holds.")
    poll_interval_s: float = Field(default=5.0, gt=0, description="Seconds between looks for a due "
                                   "version or a free eval server.")
    load_timeout_s: float = Field(default=600.0, gt=0, description="Bound of one weight load "
                                  "(update_weights_from_disk) and its /model_info check.")
    out_dir: str | None = Field(default=None, description="Where each version's episodes go "
                                "(v<N>/results.jsonl, summary.json, trajectories); unset: <run.dir>/evals.")

    @model_validator(mode="after")
    def _needs_rows(self) -> EvalConfig:
        if self.every_versions > 0 and not self.rows:
            raise ValueError("eval.rows: required when eval.every_versions > 0 (a prepared rows file "
                             "or <suite>:<split>, e.g. bundled:heldout)")
        return self

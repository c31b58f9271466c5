"""Config section owned by the learner."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from common.settings import Section


class LearnerConfig(Section):
    # -- model and backend ----------------------------------------------------------------
    backend: Literal["torch", "megatron"] = Field(
        "torch", description="Training backend: torch (transformers + torch.optim, the CPU default) "
        "or megatron (megatron-core GPTModel, GPU).")
    model_dir: str | None = Field(
        None, description="HF model directory to start from (config + safetensors). Unset: "
        "<run.dir>/model/base (where `swarl model init` puts the tiny model).")
    dtype: Literal["fp32", "bf16"] = Field("fp32", description="Parameter/compute dtype of the policy.")
    threads: int = Field(2, description="torch.set_num_threads for the learner process (CPU).")
    tensor_parallel: int = Field(1, ge=1, description="megatron: tensor-parallel size.")
    pipeline_parallel: int = Field(1, ge=1, description="megatron: pipeline-parallel size.")
    use_distributed_optimizer: bool = Field(
        True, description="megatron: shard optimizer state (and the fp32 main weights) over the "
        "data-parallel ranks.")
    overlap_grad_reduce: bool = Field(
        True, description="megatron: reduce gradient buckets during the backward of the last "
        "micro-batch instead of after it.")
    recompute: Literal["none", "selective", "full"] = Field(
        "none", description="megatron: activation recomputation in the training forward, to fit "
        "longer micro-batches (selective: core attention, which with flash attention keeps only "
        "its softmax statistics; full: each layer keeps only its input and is re-run in the backward).")
    dist_timeout_s: float = Field(
        1800.0, gt=0, description="Under torchrun: bound on any collective between the learner's "
        "ranks (a dead rank ends the job sooner: its peers' sockets close).")
    # -- optimiser ------------------------------------------------------------------------
    lr: float = Field(1e-5, description="AdamW learning rate (after warm-up).")
    weight_decay: float = Field(0.0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    eps: float = Field(1e-8, description="AdamW epsilon.")
    warmup_steps: int = Field(0, description="Linear learning-rate warm-up from 0 over this many steps.")
    grad_clip: float = Field(1.0, description="Clip the global gradient norm to this (0 = off).")
    spike_clip: float | None = Field(
        None, gt=1.0, description="Also clip each update's gradient norm at this multiple of the "
        "running mean of the earlier updates' norms (from the 6th update; learner/spike_clip.py): "
        "one spike then cannot fill Adam's second moment and shrink every later update. Unset: off.")
    max_update_kl: float | None = Field(
        None, gt=0, description="Trust region on each optimizer update: the KL the step has moved "
        "the policy so far (k3 of KL(proximal || new) on the sampled tokens, weighted as the loss, "
        "over max_update_kl_scope) is measured after it, and above this bound the update is scaled "
        "back toward the weights before it (halved up to max_update_kl_tries times, undone if still "
        "above): Adam can move the policy far on a gradient of ordinary norm "
        "(learner/trust_region.py). Torch backend only. Unset: off.")
    max_update_kl_tries: int = Field(6, ge=1, description="Halvings of an update before it is undone "
                                     "(learner.max_update_kl).")
    max_update_kl_scope: Literal["batch", "minibatch"] = Field(
        "batch", description="Where learner.max_update_kl measures each update: batch = every "
        "minibatch of the step (one no-grad forward of the batch per update, and the last is the "
        "step's update_kl); minibatch = the update's own minibatch only (half the forward with 2 "
        "minibatches, but an update within the bound on its own minibatch can move the others far: "
        "the records before 2026-11-29 evening ran so).")
    # -- batching -------------------------------------------------------------------------
    max_tokens_per_microbatch: int = Field(
        4096, description="Token budget of one packed micro-batch; gradients accumulate over "
        "the micro-batches of one optimizer update.")
    minibatches: int = Field(
        4, ge=1, description="Optimizer updates per pass over a training batch: the batch is "
        "split into this many minibatches of whole groups (about equal in episodes), one optimizer "
        "step each, as verl's ppo_mini_batch_size. With more than one update (minibatches or "
        "epochs), the proximal logprobs come from the first update's own forward on its minibatch and "
        "a no-grad pass over the others before it, and the clip acts against them. One policy "
        "version is published per batch whatever the count.")
    epochs: int = Field(
        1, ge=1, description="Passes over each training batch (each pass takes `minibatches` "
        "optimizer updates).")
    packing: bool = Field(True, description="Pack variable-length samples into one row per "
                          "micro-batch (off: pad every sample to the longest in its micro-batch).")
    pad_to: Literal["microbatch", "batch"] = Field(
        "microbatch", description="packing off: pad each micro-batch to its longest sample, or "
        "every sample to the longest of the whole batch (fixed shapes).")
    attention: Literal["varlen", "mask"] = Field(
        "varlen", description="Packed rows: varlen = causal attention per sample (cost sum of "
        "len^2); mask = SDPA with a block-diagonal causal mask (cost (sum of len)^2).")
    # -- assembly -------------------------------------------------------------------------
    n_samples_per_prompt: int = Field(4, description="Episodes per group (must match `swarl enqueue`).")
    group_timeout_s: float = Field(
        600.0, description="A group not complete this long after its first sample follows "
        "`partial_groups`.")
    partial_groups: Literal["use", "drop"] = Field(
        "use", description="Timed-out groups: use their complete episodes, or drop them (counted).")
    min_group_episodes: int = Field(
        1, description="A group needs at least this many usable (unmasked, fresh) episodes to train.")
    salvage_groups: bool = Field(
        True, description="max_staleness > 0 with partial_groups use: at the last step that may "
        "train a group's version, train its finished episodes (two or more) instead of waiting for "
        "its slowest one and losing them all to staleness; the stragglers arrive late and are "
        "dropped (learner.assembly). Off: a group waits whole (or for group_timeout_s).")
    straggler_grace_s: float | None = Field(
        None, ge=0, description="Before a step that publishes a version, the learner holds it "
        "while the running episodes it would leave behind (stale, or in a group it trains "
        "without them) are worth more than the hold costs: their tokens, weighted by how likely "
        "each ends soon given the run's own episode durations, against the actor slots admission "
        "blocks meanwhile and, when more than this batch is ready, the learner's time "
        "(learner.hold). This caps one hold (s); unset: no cap; 0: never hold.")
    straggler_worth: float = Field(
        1.0, gt=0, description="What a token of an episode the hold would save is worth against "
        "a token a blocked actor slot could have generated (learner.hold). Above 1 buys fewer "
        "wasted tokens, and fewer long episodes lost, with actor idle time.")
    # -- objective ------------------------------------------------------------------------
    objective: Literal["decoupled", "tis", "ppo"] = Field(
        "decoupled", description="decoupled: decoupled PPO (clip against the proximal "
        "policy, weight by pi_prox/pi_behaviour); tis: truncated importance sampling, weight "
        "min(max(pi_old/pi_behaviour, tis_clip_low), tis_clip); ppo: naive PPO clipped "
        "against the behaviour logprobs.")
    clip_eps: float = Field(0.2, description="PPO clip range below 1 (ratio >= 1 - clip_eps).")
    clip_eps_high: float | None = Field(None, description="PPO clip range above 1; unset = clip_eps.")
    clip_ratio_c: float | None = Field(
        3.0, gt=1.0, description="Dual clip: with a negative advantage a token's loss is bounded at "
        "clip_ratio_c x |advantage| (no gradient beyond), as verl's clip_ratio_c; after earlier "
        "minibatches' updates a token's ratio can reach the 100s. Unset = off.")
    behav_imp_weight_cap: float | None = Field(
        5.0, description="decoupled: tokens with pi_prox/pi_behaviour above this are masked; "
        "unset = no cap.")
    tis_clip: float = Field(2.0, description="tis: upper truncation of pi_old/pi_behaviour.")
    tis_clip_low: float = Field(0.0, description="tis: lower truncation of pi_old/pi_behaviour.")
    aggregation: Literal["token", "sequence"] = Field(
        "token", description="token: mean over all loss tokens of the batch; sequence: mean over "
        "samples of each sample's token mean.")
    advantage_std_norm: bool = Field(False, description="GRPO: divide (reward - group mean) by group std.")
    reward_shuffle: bool = Field(
        False, description="Control run only: permute the episodes' rewards across each batch "
        "before the advantages (rewards unrelated to the episodes; the demo's shuffled-reward control).")
    kl_coef: float = Field(0.0, description="KL(pi || pi_ref) penalty (k3 estimator); 0 = off and "
                           "no reference model is loaded.")
    kl_clamp: float | None = Field(
        10.0, gt=0, description="Per-token k3 values above this are clamped (no gradient beyond), "
        "as verl's low_var_kl: k3's gradient grows as exp(ref - logp). Unset = no clamp.")
    entropy_coef: float = Field(0.0, description="Entropy bonus (entropy is always reported).")
    mismatch_kl_bound: float = Field(
        0.02, ge=0, description="Warn in the learner's log when the mismatch KL (the actors' "
        "logprobs against the learner's on the same tokens, before the step's first update) stays "
        "above this for `mismatch_kl_steps` steps in a row: a weight-sync, temperature or "
        "tokenisation bug, not an RL effect. 0: never warn.")
    mismatch_kl_steps: int = Field(3, ge=1, description="Consecutive steps above mismatch_kl_bound before the warning.")
    update_kl: bool = Field(
        True, description="Measure the KL the step's updates moved the policy (update_kl: a no-grad "
        "pass after the last update against the proximal logprobs: one forward of the batch a step; "
        "none under learner.max_update_kl, whose last measure is already at the final parameters: "
        "the whole batch, or with max_update_kl_scope minibatch the last minibatch).")
    rollout_temperature: float = Field(
        1.0, description="Sampling temperature of the actors; the learner's logprobs are of "
        "softmax(logits / T), the distribution the server reports.")
    # -- versions, checkpoints, logs --------------------------------------------------------
    publish: Literal["weight_sync", "none"] = Field(
        "weight_sync", description="weight_sync: hand each new version to weight_sync.make_publisher; "
        "none: only bump the version (learner-only tests and benchmarks).")
    update_every: int = Field(1, ge=1, description="Publish a new policy version every this many "
                              "steps (admission then lets batch_size x this many rollouts start per version).")
    checkpoint_every: int = Field(
        1, ge=1, description="Checkpoint (weights + optimizer state + consumed ids) every this many "
        "steps, on its own cadence: versions published in between are weights only. Entries are "
        "acknowledged only after the checkpoint that records them, so kill -9 + --resume trains "
        "each sample once (the steps since the last checkpoint are trained again).")
    keep_checkpoints: int = Field(2, description="Checkpoints kept on disk (oldest removed).")
    max_steps: int | None = Field(None, description="Stop after this many optimizer steps (unset: run on).")
    idle_exit_s: float | None = Field(
        None, description="Exit when no entry has arrived for this long since the last arrival "
        "or the end of the last step, whichever is later (tests, benchmarks).")
    heartbeat_s: float = Field(5.0, description="How often the learner state hash is refreshed.")
    log_trained_ids: bool = Field(
        True, description="Append every trained sample id to <run.dir>/learner/trained.jsonl.")
    tensorboard: bool = Field(True, description="Also write TensorBoard scalars to <run.dir>/tb.")

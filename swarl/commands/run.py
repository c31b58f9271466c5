"""`swarl demo` and `swarl eval`."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer

from swarl.cliutil import ConfigOpt, SetOpt, load


def demo(
    minutes: Annotated[float, typer.Option("--minutes", "-m", help="Training time budget (minutes): "
                                           "the bound on --steps on a slow or busy machine.")] = 15.0,
    steps: Annotated[int, typer.Option("--steps", help="Stop training at this many learner steps "
                                       "(learner.max_steps; 0: none, --minutes alone), --minutes bounding "
                                       "it: the same compute in every arm and seed, however busy the "
                                       "machine. 18 steps: about 12 minutes on 2 idle cores.")] = 18,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the tiny model, warm start and sampling.")] = 0,
    actors: Annotated[int, typer.Option("--actors", help="Actor processes.")] = 2,
    concurrency: Annotated[int, typer.Option("--concurrency", "-k", help="Episodes per actor at once.")] = 3,
    servers: Annotated[int, typer.Option("--servers", help="CPU inference servers (one batches every "
                                         "actor's requests: the most episodes a minute on 2 cores).")] = 1,
    eval_samples: Annotated[int, typer.Option("--eval-samples", help="Episodes per task when measuring resolve rates.")] = 2,
    eval_per_family: Annotated[int, typer.Option("--eval-per-family", help="Tasks per bug family evaluated in each split (0: all).")] = 8,
    train_per_family: Annotated[int, typer.Option("--train-per-family", help="Train tasks per bug family (0: the whole pool or train split).")] = 0,
    train_pool: Annotated[int, typer.Option("--train-pool", help="RL trains on this many fresh generated "
                                            "instances of the train families and combinations (their images "
                                            "built once, cached); 0: on the fixed train split (96).")] = 512,  # swarl.demo.run.TRAIN_POOL
    warm_seed: Annotated[int | None, typer.Option("--warm-seed", help="Seed of the tiny model and warm start "
                                                  "(default: --seed); fixed, seeds vary only the RL run.")] = None,
    sft_epochs: Annotated[int, typer.Option("--sft-epochs", help="Epochs of the supervised warm start.")] = 1,
    sft_on: Annotated[str, typer.Option("--sft-on", help="Warm start on --sft-demos new practice instances "
                                        "or on the train split (every plausible edit).")] = "practice",
    sft_demos: Annotated[int, typer.Option("--sft-demos", help="With --sft-on practice: instances demonstrated.")] = 9600,
    sft_lr: Annotated[float, typer.Option("--sft-lr", help="Learning rate of the supervised warm start.")] = 3e-3,
    practice_names: Annotated[str, typer.Option("--practice-names", help="Function names of the practice "
                                                "instances: train (the train split's numbers) or all (every "
                                                "two-digit number: copying a held-out name is shown too).")] = "train",
    reading_demos: Annotated[int, typer.Option("--reading-demos", help="Warm start: this many more "
                                               "demonstrations, on families RL never sees (other operators), "
                                               "each of the correct fix: reading shown where the copy decides "
                                               "(the learning proof's warm start; 0: none).")] = 3200,  # swarl.demo.run.READING_DEMOS
    run_dir: Annotated[str | None, typer.Option("--run-dir", help="Run directory (default runs/demo-<time>).")] = None,
    prm: Annotated[bool, typer.Option("--prm", help="Step rewards from a PRM: the tiny base model judges "
                                      "every step on its own server (role prm); actor.prm in the config.")] = False,
    arm: Annotated[str, typer.Option("--arm", help="rl, or shuffled: the shuffled-reward control "
                                     "(learner.reward_shuffle: rewards permuted across each batch).")] = "rl",
    sft_control: Annotated[bool, typer.Option("--sft-control/--no-sft-control", help="After training, continue "
                                              "the warm start's SFT for as many steps as the learner took and "
                                              "evaluate it (the SFT control).")] = True,
    handwritten: Annotated[bool, typer.Option("--handwritten/--no-handwritten", help="Also evaluate the "
                                              "hand-written suite (swe/tasks/tasks.jsonl) before and after (no goal: "
                                              "off by default, its three evaluations ~3 min on 2 cores).")] = False,
    recheck: Annotated[bool, typer.Option("--recheck", help="Evaluate the warm start again after training "
                                          "(determinism: must equal the first evaluation).")] = False,
    pair_forms: Annotated[bool, typer.Option("--pair-forms/--no-pair-forms", help="A learner group holds both "
                                             "forms of a symptom, half the group each (else one task).")] = True,
    seeds: Annotated[str | None, typer.Option("--seeds", help="Per seed (comma-separated, e.g. 0,1,2,3,4) the "
                                              "RL run and the shuffled-reward run, then the summary across seeds.")] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """The local CPU run: Redis, Docker, task images, tiny model, envd, pool, inference, actors,
    learner; trains for --minutes and prints resolve rates before and after with 95% intervals
    and the SFT control's (last line: JSON)."""
    from swarl.demo import kernels

    kernels.pin()  # before any tensor op here; the demo's processes inherit it (swarl/demo/kernels.py)
    from common.logs import setup_logging
    from swarl.config import ConfigError
    from swarl.demo.run import DemoOptions, run_demo, run_seeds

    setup_logging("warning")
    opts = DemoOptions(minutes=minutes, steps=steps or None, seed=seed, actors=actors, concurrency=concurrency, servers=servers,
                       eval_samples=eval_samples, eval_per_family=eval_per_family or None,
                       train_per_family=train_per_family or None, train_pool=train_pool, warm_seed=warm_seed, sft_epochs=sft_epochs, sft_lr=sft_lr, sft_on=sft_on, sft_demos=sft_demos,
                       practice_names=practice_names, reading_demos=reading_demos, run_dir=run_dir, config=config,
                       sets=tuple(sets or ()), prm=prm, arm=arm,
                       sft_control=sft_control, handwritten=handwritten, recheck=recheck, pair_forms=pair_forms)
    from common.procs import sigterm_interrupts

    sigterm_interrupts()  # `timeout`, systemd or CI stopping the demo stop its processes too
    try:
        if seeds:
            try:
                seed_list = [int(x) for x in seeds.split(",") if x.strip()]
            except ValueError:
                raise typer.BadParameter(f"--seeds: comma-separated integers, got {seeds!r}") from None
            result = run_seeds(opts, seed_list)
        else:
            result = run_demo(opts)
    except KeyboardInterrupt:
        typer.echo("swarl demo: interrupted; every process was stopped", err=True)
        raise typer.Exit(130) from None
    except ConfigError as e:
        typer.echo(f"swarl demo: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps(result))


def eval_(
    data: Annotated[str, typer.Option("--data", help="JSONL: prepared rows ({text, metadata: {instance, data_source}}) or raw SWE rows.")],
    server: Annotated[str, typer.Option("--server", help="Inference server URL (swarl CPU server or SGLang).")],
    out: Annotated[str, typer.Option("--out", help="Output directory (results.jsonl, summary.json, trajectories).")],
    pool_url: Annotated[str | None, typer.Option("--pool-url", help="Pool URL (default pool.url).")] = None,
    max_concurrent: Annotated[int, typer.Option("--max-concurrent", help="Episodes at once.")] = 8,
    max_instances: Annotated[int | None, typer.Option("--max-instances", help="Evaluate only the first N rows.")] = None,
    n_samples: Annotated[int, typer.Option("--n-samples", help="Episodes per instance.")] = 1,
    step_limit: Annotated[int | None, typer.Option("--step-limit", help="Model turns per episode.")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", help="Max new tokens per turn.")] = None,
    temperature: Annotated[float | None, typer.Option("--temperature", help="Sampling temperature.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed every episode's sampling (SGLang's sampling_seed, one per task and sample): two policies evaluated with one seed meet the same draws (common random numbers). Off: fresh draws.")] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", help="Server key (or SWARL_INFERENCE_API_KEY).", envvar="SWARL_INFERENCE_API_KEY")] = None,
    model_name: Annotated[str | None, typer.Option("--model-name", help="model_name_or_path in the SWE-bench predictions (preds.json). Default: the server's served model name (else its model path).")] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Evaluate a policy on SWE instances without training (resumable). Writes results.jsonl,
    summary.json (resolve rate, pass@k) and the SWE-bench predictions of each sample index
    (preds.json, preds-1.json, ...), which `python -m swebench.harness.run_evaluation` grades."""
    from actors.evaluate import EvalTarget, evaluate
    from swe.rows import RowError, read_rows

    if model_name is not None and not model_name.strip():
        typer.echo("swarl eval: --model-name: empty", err=True)
        raise typer.Exit(2)

    cfg = load(config, sets, extra={"actor.step_limit": step_limit, "actor.sampling.max_new_tokens": max_tokens,
                                     "actor.sampling.temperature": temperature, "pool.url": pool_url})
    if not cfg.pool.url:
        typer.echo("swarl eval: pool.url: not set (--pool-url or SWARL_POOL_URL)", err=True)
        raise typer.Exit(2)
    errors: list[RowError] = []
    try:
        parsed = list(read_rows(data, errors=errors))
    except FileNotFoundError as e:
        typer.echo(f"swarl eval: {e}", err=True)
        raise typer.Exit(2) from None
    for bad in errors:
        typer.echo(f"swarl eval: skipped {bad.brief()}", err=True)
    parsed = parsed[:max_instances] if max_instances else parsed
    rows = [r.instance for r in parsed]  # validated, image_name set
    target = EvalTarget(server, api_key or cfg.actor.inference_api_key, cfg.pool.url, cfg.envd.token,
                        cfg.actor.tokenizer)

    def progress(res: dict) -> None:  # the patch is in results.jsonl and the predictions
        typer.echo(json.dumps({k: v for k, v in res.items() if k != "model_patch"}), err=True)

    summary = asyncio.run(evaluate(rows, target, out, cfg.actor, max_concurrent, n_samples,
                                   on_result=progress, seed=seed, model_name=model_name))
    typer.echo(json.dumps(summary))


def learning_check(
    steps: Annotated[int, typer.Option("--steps", help="Learner steps to train (learner.max_steps).")] = 40,
    seconds: Annotated[float, typer.Option("--seconds", help="Wall-clock bound of the training.")] = 240.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the tiny model, warm start, tasks and run.")] = 0,
    arm: Annotated[str, typer.Option("--arm", help="rl, or shuffled: the control (rewards permuted across each batch).")] = "rl",
    concurrency: Annotated[int, typer.Option("--concurrency", "-k", help="Episodes the actor runs at once.")] = 16,
    run_dir: Annotated[str | None, typer.Option("--run-dir", help="Run directory (default runs/learning-check-<time>).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole result (with the curve) as JSON.")] = False,
    sets: SetOpt = None,
) -> None:
    """Does the loop learn? The real processes (Redis, a CPU inference server with weight sync, an
    actor, the learner) train the tiny model on a task only reading the prompt can solve (which
    operator a line of code contains; chance 0.5); prints the resolve rate of the first and last
    steps, the mismatch KL, and (--json) the curve."""
    import time as _time
    from pathlib import Path

    from common.logs import setup_logging
    from common.procs import sigterm_interrupts
    from swarl.config import REPO_ROOT
    from swarl.learning_check import CheckOptions, run_check

    setup_logging("warning")
    sigterm_interrupts()
    stamp = _time.strftime("%Y%m%d-%H%M%S", _time.gmtime())
    out = Path(run_dir or REPO_ROOT / "runs" / f"learning-check-{stamp}").resolve()
    res = run_check(CheckOptions(run_dir=out, steps=steps, seconds=seconds, seed=seed, arm=arm,
                                 concurrency=concurrency, sets=list(sets or []),
                                 say=lambda m: typer.echo(f"swarl learning-check {m}", err=True)))
    (out / "learning-check.json").write_text(json.dumps(res, indent=1))
    typer.echo(f"swarl learning-check ({res['arm']}, seed {res['seed']}): resolve rate "
               f"{res['first']:.3f} (first 5 steps) -> {res['last']:.3f} (last 5) over {res['steps']} steps, "
               f"chance {res['chance']:.2f}; mismatch KL max {res['mismatch_kl_max']:.2g}; "
               f"{res['train_s']:.0f}s training, {res['wall_s']:.0f}s in all; {out}")
    if as_json:
        typer.echo(json.dumps(res))

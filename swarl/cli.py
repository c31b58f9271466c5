"""`swarl`: one subcommand per process and per operator task. The command modules live in
swarl/commands/ (one per component); this module only mounts them and stays import-light:
heavy imports happen inside the commands."""

from __future__ import annotations

import typer

from swarl.commands import (
    actors,
    broker,
    doctor,
    envd,
    eval_worker,
    images,
    inference,
    learner,
    ops,
    run,
    weights,
)

app = typer.Typer(
    name="swarl",
    help="Asynchronous actor-learner RL for LLM software-engineering agents, over Redis.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# operator tasks on the broker
app.command("enqueue")(broker.enqueue)
app.command("status")(broker.status)
# processes
app.add_typer(envd.envd_app, name="envd")
app.add_typer(envd.pool_app, name="pool")
app.add_typer(images.images_app, name="images")
app.add_typer(inference.inference_app, name="inference")
app.add_typer(inference.model_app, name="model")
app.add_typer(inference.scripted_app, name="scripted-policy")
app.command("actor")(actors.actor)
app.command("learner")(learner.learner)
app.command("plot")(learner.plot)
app.command("eval-worker")(eval_worker.eval_worker)
app.add_typer(weights.app, name="weights")
# end-to-end and operations
app.command("demo")(run.demo)
app.command("eval")(run.eval_)
app.command("learning-check")(run.learning_check)
app.command("doctor")(doctor.doctor)
ops.register(app)


def main() -> None:
    app()


if __name__ == "__main__":  # python -m swarl.cli ... (the same as the console script)
    main()

"""The real mini-swe-agent package (its DefaultAgent, its litellm model, its own local
environment) driving swarl's servers through their OpenAI-style /v1/chat/completions, as the
seed's run_minisweagent_eval.sh drives SGLang: on a bundled task, with the scripted policy (a
submitted patch that resolves the task) and with the CPU server's tiny model (an episode that
runs to its limit)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from swe.tasks import get_task, task_files

TASK = "swarl-tasks__invoicekit-1"
SWARL_ACTION_REGEX = r"```bash\s*\n(.*?)\n```"  # swarl's protocol (configs/prompts/swebench.yaml)


@pytest.fixture
def minisweagent(monkeypatch, tmp_path):
    pytest.importorskip("litellm")
    # no network: litellm's bundled cost map; mini-swe-agent's config dir under the test's tmp
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    monkeypatch.setenv("MSWEA_GLOBAL_CONFIG_DIR", str(tmp_path / "mswea"))
    monkeypatch.setenv("MSWEA_COST_TRACKING", "ignore_errors")
    return pytest.importorskip("minisweagent")


def checkout(root: Path) -> Path:
    """The bundled task's repository at its base commit (the bug in), as a git work tree."""
    for rel, text in task_files(TASK).items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=root, check=True)
    return root


def resolves(root: Path, patch: str, row: dict) -> bool:
    """SWE-bench's rule on a fresh checkout: the patch and the test patch apply, FAIL_TO_PASS
    and PASS_TO_PASS pass."""
    fresh = checkout(root)
    for name, diff in (("fix.diff", patch), ("tests.diff", row["test_patch"])):
        (fresh / name).write_text(diff)
        if subprocess.run(["git", "apply", name], cwd=fresh).returncode:
            return False
    tests = json.loads(row["FAIL_TO_PASS"]) + json.loads(row["PASS_TO_PASS"])
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=fresh, capture_output=True).returncode == 0


def run_agent(url: str, key: str, repo: Path, row: dict, step_limit: int, **model_kwargs) -> tuple[dict, object]:
    import yaml
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    cfg = yaml.safe_load((Path(sys.modules["minisweagent"].__file__).parent / "config" / "mini_textbased.yaml")
                         .read_text())
    model = LitellmTextbasedModel(
        model_name="openai/swarl", action_regex=SWARL_ACTION_REGEX, cost_tracking="ignore_errors",
        model_kwargs={"api_base": f"{url}/v1", "api_key": key, "num_retries": 0, **model_kwargs})
    env = LocalEnvironment(cwd=str(repo), timeout=60)
    agent = DefaultAgent(model, env, **{**cfg["agent"], "step_limit": step_limit, "cost_limit": 0})
    return agent.run(row["problem_statement"]), agent


def test_minisweagent_resolves_a_bundled_task_with_the_scripted_policy(minisweagent, cpu_server_factory,
                                                                        tiny_model_dir, tmp_path):
    row = get_task(TASK)
    server = cpu_server_factory.start_scripted(tiny_model_dir, [row], mode="fix")
    result, agent = run_agent(server.url, server.api_key, checkout(tmp_path / "work"), row, step_limit=5,
                              temperature=0.0, max_tokens=256)
    assert result["exit_status"] == "Submitted", agent.messages[-3:]
    assert "if units else 0.0" in result["submission"]
    assert resolves(tmp_path / "eval", result["submission"], row)
    # two model calls over /v1/chat/completions: the fix, then the submission
    assert agent.n_calls == 2


def test_minisweagent_runs_an_episode_against_the_cpu_server(minisweagent, cpu_server, tmp_path):
    row = get_task(TASK)
    result, agent = run_agent(cpu_server.url, cpu_server.api_key, checkout(tmp_path / "work"), row,
                              step_limit=2, temperature=1.0, max_tokens=12)
    # a random tiny model writes no bash block: each turn is answered with the format-error
    # message, and the episode ends at its step limit, with the usage litellm read back
    assert result["exit_status"] in ("LimitsExceeded", "RepeatedFormatError"), agent.messages[-2:]
    assert agent.n_calls == 2
    # each answer came back through litellm and was judged a format error (the usage with it)
    errors = [m["extra"] for m in agent.messages if m.get("extra", {}).get("interrupt_type") == "FormatError"]
    assert len(errors) == 2 and all(isinstance(e["model_response"], str) for e in errors)
    usage = errors[0]["response"]["usage"]
    assert usage["prompt_tokens"] > 100 and 0 < usage["completion_tokens"] <= 12

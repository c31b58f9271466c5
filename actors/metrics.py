"""Per-episode agent metrics (the learner aggregates them as agent/<name>_mean...)."""

from __future__ import annotations


def episode_metrics(turns: int, tool_calls: int, total_time: float, model_times: list[float],
                    env_times: list[float], eval_time: float, **extra: float) -> dict[str, float]:
    model_sum, env_sum = sum(model_times), sum(env_times)
    overhead = max(0.0, total_time - model_sum - env_sum - eval_time)
    m = {
        "turns": float(turns),
        "tool_calls": float(tool_calls),
        "total_time": total_time,
        "model_query_time_sum": model_sum,
        "env_execution_time_sum": env_sum,
        "eval_time": eval_time,
        "overhead_time": overhead,
        "time_per_turn": total_time / turns if turns else 0.0,
        "model_query_time_avg": model_sum / turns if turns else 0.0,
        "env_execution_time_avg": env_sum / tool_calls if tool_calls else 0.0,
        "model_time_ratio": model_sum / total_time if total_time > 0 else 0.0,
        "env_time_ratio": env_sum / total_time if total_time > 0 else 0.0,
    }
    m.update({k: float(v) for k, v in extra.items()})
    return m

"""The run configuration as the CLI resolves it: the env section mirrors the env, dict-valued settings are JSON,
presets are names or files, and ``--dry-run`` prints the resolved configuration without doing any work."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from populora_env import parallel_env
from populora_env.config import EnvConfig
from selfplay.config import TrainConfig, load_preset, to_dict
from tests.selfplay.conftest import populora


def _dry(*args: str, cwd: Path | None = None) -> dict:
    p = populora("train", *args, "--dry-run", timeout=120, cwd=cwd)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def test_env_section_is_the_env_config() -> None:
    assert TrainConfig().env == EnvConfig()
    env = parallel_env(TrainConfig().env)
    assert env.config == EnvConfig()
    # the env's own defaults, not a drifting copy (the old run config had 4 vs 8 samples, 2 vs 3 references)
    assert (env.config.samples_per_task, env.config.references_k, env.config.require_think) == (8, 3, True)


def test_every_env_setting_is_a_flag() -> None:
    p = populora("train", "--help", timeout=120)
    assert p.returncode == 0
    flat = " ".join(p.stdout.split())
    for f in dataclasses.fields(EnvConfig):
        if f.name == "trueskill":
            for sub in ("mu", "sigma", "beta", "tau", "draw-probability"):
                assert f"--env.trueskill.{sub}" in flat, sub
        else:
            assert f"--env.{f.name.replace('_', '-')}" in flat, f.name


def test_dry_run_prints_the_resolved_config_and_does_nothing(tmp_path: Path) -> None:
    run = tmp_path / "never"
    cfg = _dry("--run-dir", str(run), "--env.induction-inputs", "10", "--env.no-reject-duplicates")
    assert not run.exists()
    assert cfg["env"]["induction_inputs"] == 10 and cfg["env"]["reject_duplicates"] is False
    expected = to_dict(load_preset("cpu-smoke"))
    for key in ("model", "steps", "rank", "generation", "trainer", "pbt"):
        assert cfg[key] == expected[key], key


def test_dict_settings_are_json_flags() -> None:
    cfg = _dry("--pbt.operators", '{"dare": 1.0}', "--env.reward-scheme", "azr",
               "--env.reward-kwargs", '{"extreme_reward": -0.5}', "--trainer.advantage", "reinforce_pp",
               "--trainer.advantage-kwargs", '{"gamma": 0.99}')
    assert cfg["pbt"]["operators"] == {"dare": 1.0}
    assert cfg["env"]["reward_kwargs"] == {"extreme_reward": -0.5}
    assert cfg["trainer"]["advantage_kwargs"] == {"gamma": 0.99}


def test_preset_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "mine.json").write_text(json.dumps({"_comment": "x", "steps": 3, "env": {"num_students": 3}}))
    cfg = _dry("--preset", "mine.json", cwd=tmp_path)
    assert cfg["steps"] == 3 and cfg["env"]["num_students"] == 3
    # fields the file does not set keep the dataclass defaults (not another preset's)
    assert cfg["env"]["num_teachers"] == EnvConfig().num_teachers


def test_bad_json_and_unknown_preset_file_exit_2(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{not json")
    p = populora("train", "--preset", str(tmp_path / "broken.json"), "--dry-run", timeout=120)
    assert p.returncode == 2 and "--preset" in p.stderr and "broken.json" in p.stderr
    p = populora("train", "--preset", str(tmp_path / "absent.json"), "--dry-run", timeout=120)
    assert p.returncode == 2 and "--preset" in p.stderr and "not found" in p.stderr
    (tmp_path / "typo.json").write_text(json.dumps({"env": {"samples_per_tsk": 2}}))
    p = populora("train", "--preset", str(tmp_path / "typo.json"), "--dry-run", timeout=120)
    assert p.returncode == 2 and "--env.samples-per-tsk" in p.stderr


def test_baseline_dry_run_is_the_transformed_config() -> None:
    p = populora("baseline", "--dry-run", timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    cfg = json.loads(p.stdout)
    assert (cfg["env"]["num_teachers"], cfg["env"]["num_students"]) == (1, 1)
    assert cfg["env"]["reward_scheme"] == "azr" and cfg["evolution"] is False
    assert cfg["name"] == "cpu-smoke-baseline-s0"


def test_generator_kwargs_carry_every_backend_setting() -> None:
    """The local loop and the Ray engines build their generator from GenerationConfig.generator_kwargs: the HF
    backend gets the engine and the fused-decode switch, vLLM its engine settings."""
    from selfplay.config import GenerationConfig

    hf = GenerationConfig(batch_size=7, hf_engine="generate", fused_decode=False).generator_kwargs("m")
    assert hf == {"batch_size": 7, "engine": "generate", "fused_decode": False}
    vllm = GenerationConfig(backend="vllm", vllm_gpu_memory_utilization=0.5, vllm_max_model_len=512)
    assert vllm.generator_kwargs("/models/x") == {"model_path": "/models/x", "gpu_memory_utilization": 0.5,
                                                  "max_model_len": 512}

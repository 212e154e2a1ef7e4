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


def test_generator_kwargs_carry_every_engine_setting() -> None:
    """The local loop and the Ray engines build their generator from GenerationConfig.generator_kwargs: the HF
    engine gets its decoding loop and the fused-decode switch, vLLM its engine settings."""
    from selfplay.config import GenerationConfig

    hf = GenerationConfig(batch_size=7, hf_engine="generate", fused_decode=False).generator_kwargs("m")
    assert hf == {"batch_size": 7, "engine": "generate", "fused_decode": False}
    vllm = GenerationConfig(engine="vllm", vllm_gpu_memory_utilization=0.5, vllm_max_model_len=512)
    assert vllm.generator_kwargs("/models/x") == {"model_path": "/models/x", "gpu_memory_utilization": 0.5,
                                                  "max_model_len": 512, "adapter_dir": None, "fallback_dir": None}
    # the adapter directory, its fallback in the run directory and the prompt-length rule reach both engines
    limited = GenerationConfig(engine="vllm", vllm_adapter_dir="/fast", max_prompt_tokens=300, vllm_max_model_len=512)
    assert limited.generator_kwargs("/m", Path("/runs/r")) == {
        "model_path": "/m", "gpu_memory_utilization": 0.6, "max_model_len": 512, "adapter_dir": "/fast",
        "fallback_dir": Path("/runs/r/vllm-adapters"), "max_prompt_tokens": 300}
    assert GenerationConfig(max_prompt_tokens=9).generator_kwargs("m")["max_prompt_tokens"] == 9


def _deprecations(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "deprecated" in ln]


def test_generation_backend_is_the_engine_for_one_release(tmp_path: Path, monkeypatch, caplog) -> None:
    """``generation.backend`` is the deprecated spelling of ``generation.engine`` (the run backend keeps the
    name ``backend``): as a flag, a preset key, a key of an old run's config.json or a keyword, it sets the
    engine and warns once, in one line naming the new spelling; the new spelling is quiet and is what a run
    records."""
    from populora_env import checks
    from selfplay.config import GenerationConfig, from_dict

    monkeypatch.setattr(checks, "_WARNED", set())
    with caplog.at_level("WARNING", logger="populora_env.checks"):
        assert GenerationConfig(backend="vllm").engine == "vllm"
        old = from_dict(TrainConfig, {"generation": {"backend": "vllm", "batch_size": 3}})  # a preset's keys
        assert old.generation.engine == "vllm" and to_dict(old)["generation"]["engine"] == "vllm"
        assert "backend" not in to_dict(old)["generation"]
    assert [r.getMessage() for r in caplog.records] == [
        "--generation.backend (generation.backend) is deprecated and will be removed in the next release: use "
        "--generation.engine (generation.engine)"]

    p = populora("train", "--generation.backend", "vllm", "--dry-run", timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout)["generation"]["engine"] == "vllm"
    assert len(_deprecations(p.stderr)) == 1 and "use --generation.engine" in p.stderr
    p = populora("train", "--generation.engine", "vllm", "--dry-run", timeout=120)
    assert p.returncode == 0 and json.loads(p.stdout)["generation"]["engine"] == "vllm"
    assert _deprecations(p.stderr) == []  # the shipped presets use the new names too
    run = tmp_path / "old-run"  # a run written before the rename resumes with its engine
    run.mkdir()
    saved = to_dict(dataclasses.replace(load_preset("cpu-smoke"), run_dir=run))
    saved["generation"]["backend"] = saved["generation"].pop("engine")
    (run / "config.json").write_text(json.dumps({"name": "old-run", "config": saved}))
    p = populora("train", "--resume", str(run), "--dry-run", timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout)["generation"]["engine"] == "hf" and len(_deprecations(p.stderr)) == 1

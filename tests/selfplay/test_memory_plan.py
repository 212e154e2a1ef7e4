"""``--dry-run --gpu-memory-gib N``: the GPU memory plan of a run before any work (selfplay.memory_plan,
populora_cli.gpu_memory), from the model's configuration alone."""

from __future__ import annotations

import dataclasses

import pytest

from selfplay.config import load_preset
from selfplay.memory_plan import memory_plan


def test_paper_preset_plan_fits_80_gib_and_names_its_parts(run_cli):
    p = run_cli("train", "--preset", "paper-4t4s", "--dry-run", "--gpu-memory-gib", "80", timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    for part in ("base model (trainer)", "LoRA adapters", "AdamW moments", "gradients (one member)",
                 "activations (with checkpointing)", "without checkpointing", "vLLM share (0.45 of the GPU)",
                 "KV cache", "peak", "fits:"):
        assert part in p.stdout, part
    assert "14.19 GiB" in p.stdout and "largest pass 16,384 tokens: row cap 16,384" in p.stdout


def test_a_plan_that_does_not_fit_exits_2_naming_what_to_change(run_cli):
    p = run_cli("train", "--preset", "paper-4t4s", "--dry-run", "--gpu-memory-gib", "16", timeout=300)
    assert p.returncode == 2 and "does not fit" in p.stdout
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("populora train: error: the run does not fit in 16 GiB") and "a GPU with at least" in line
    p = run_cli("baseline", "--preset", "azr-baseline", "--dry-run", "--gpu-memory-gib", "many", timeout=300)
    assert p.returncode == 2 and p.stderr.strip() == "populora baseline: error: --gpu-memory-gib: expected a number " \
        "of GiB, got 'many'"


def test_the_plan_reads_no_weights(cli):
    """The plan builds the model on the meta device: the model loader (which the fixture forbids) is never
    called, with --dry-run or as the gate of a run that does not fit."""
    assert cli("train", "--preset", "paper-4t4s", "--dry-run", "--gpu-memory-gib", "80")[0] == 0
    rc, err = cli("train", "--preset", "paper-4t4s", "--gpu-memory-gib", "40", "--run-dir", "/nonexistent/x")
    assert rc == 2 and "does not fit in 40 GiB" in err


def test_the_advice_is_each_change_that_fits():
    """Without the row cap paper-4t4s needs more than 80 GiB at a 0.6 vLLM share: the plan names the row cap and
    the vLLM share that fit, each of which does fit when applied."""
    cfg = load_preset("paper-4t4s")
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, max_tokens_per_row=None),
                              generation=dataclasses.replace(cfg.generation, vllm_gpu_memory_utilization=0.6))
    plan = memory_plan(cfg, 8, 80)
    assert not plan.fits and [a.split()[0] for a in plan.advice] == [
        "--trainer.max-tokens-per-row", "--generation.vllm-gpu-memory-utilization"]
    cap, share = int(plan.advice[0].split()[1]), float(plan.advice[1].split()[1])
    fixed = [dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, max_tokens_per_row=cap)),
             dataclasses.replace(cfg, generation=dataclasses.replace(cfg.generation, vllm_gpu_memory_utilization=share))]
    assert all(memory_plan(c, 8, 80).fits for c in fixed)
    assert not memory_plan(dataclasses.replace(cfg, trainer=dataclasses.replace(  # the largest cap that fits
        cfg.trainer, max_tokens_per_row=cap + 1024)), 8, 80).fits
    # without checkpointing nothing fits alone: the changes together, which fit
    off = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, gradient_checkpointing=False))
    (together,) = memory_plan(off, 8, 80).advice
    assert together.startswith("--trainer.gradient-checkpointing and --trainer.max-tokens-per-row ")
    both = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, gradient_checkpointing=True,
                                                               max_tokens_per_row=int(together.split()[-1])))
    assert memory_plan(both, 8, 80).fits


@pytest.mark.parametrize("gib,fits", [(80, True), (40, False)])
def test_compare_plans_both_arms(run_cli, tmp_path, gib, fits):
    p = run_cli("compare", "--preset", "paper-4t4s", "--baseline-preset", "azr-baseline", "--seeds", "1", "--out",
                str(tmp_path / "cmp"), "--dry-run", "--gpu-memory-gib", str(gib), timeout=600)
    assert p.returncode == (0 if fits else 2), p.stderr[-2000:]
    assert "[population] GPU memory plan" in p.stdout and "[baseline] GPU memory plan" in p.stdout
    assert not (tmp_path / "cmp").exists()  # nothing launched, nothing written


def test_compare_dry_run_prints_each_arms_configuration(capsys, tmp_path):
    """``compare --dry-run`` without a GPU size prints every arm's resolved configuration and launches nothing
    (named arms, ``--arm NAME=KIND``, included)."""
    from populora_cli.main import main

    out = tmp_path / "cmp"
    assert main(["compare", "--preset", "tiny", "--seeds", "1", "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("[population] {") and "\n[baseline] {" in text
    assert main(["compare", "--preset", "tiny", "--seeds", "1", "--out", str(out), "--dry-run",
                 "--arm", "async=population --pipeline.max-staleness 1", "--arm", "sync=population"]) == 0
    text = capsys.readouterr().out
    first, second = text.split("\n[sync] ")
    assert first.startswith("[async] ") and '"max_staleness": 1' in first and '"max_staleness": 0' in second
    assert not out.exists()

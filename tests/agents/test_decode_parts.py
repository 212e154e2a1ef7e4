"""benchmarks/decode_parts.py: the decode step's operations are sorted into the parts its table prints, and the
script runs end to end on the tiny model with the bytes it compares against the floor counted right."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("decode_parts", ROOT / "benchmarks" / "decode_parts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("name", "shapes", "part"), [
    ("aten::mm", [[6, 576], [576, 960]], "projections"),  # stacked q/k/v, MKL on the transposed weight
    ("mkldnn::_linear_pointwise", [[6, 576], [3072, 576], [], [], [], []], "projections"),  # gate/up, oneDNN
    ("aten::addmm", [[960], [6, 576], [576, 960]], "projections"),  # with a bias
    ("mkldnn::_linear_pointwise", [[6, 576], [49152, 576], [], [], [], []], "lm_head"),
    ("aten::mm", [[6, 576], [576, 49152]], "lm_head"),
    ("aten::mm", [[6, 576], [576, 48]], "lora"),  # h A^T of the q/k/v group
    ("aten::addmm_", [[6, 960], [6, 48], [48, 960], [], []], "lora"),  # += low B
    ("aten::mul_", [[6, 48], [6, 48]], "lora"),  # the rows' member mask
    ("aten::mul_", [[6, 576], [6, 576]], "other"),
    ("aten::baddbmm", [[18, 3, 351], [18, 3, 64], [18, 64, 351], [], []], "attention"),
    ("aten::softmax", [[18, 3, 351], [], []], "attention"),
    ("aten::bmm", [[18, 3, 351], [18, 351, 64]], "attention"),
    ("aten::rms_norm", [[6, 576], [], [576], []], "norms"),
    ("aten::roll", [[6, 1, 12, 64], [], []], "other"),
    ("aten::copy_", [[6, 3, 1, 64], [6, 3, 1, 64], []], "other"),
])
def test_each_operation_goes_to_its_part(bench, name, shapes, part):
    assert bench.part_of(name, shapes, lora_widths={16, 32, 48}, vocab=49152) == part


@pytest.fixture
def keep_threads():
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_tiny_model_end_to_end(bench, tmp_path, keep_threads):
    out = bench.main(["--model", "tiny-random", "--rows", "4", "--positions", "24", "--steps", "3", "--repeats", "1",
                      "--threads", "1", "--json", str(tmp_path / "parts.json")])
    assert json.loads((tmp_path / "parts.json").read_text()) == json.loads(json.dumps(out))
    parts = out["parts_s"]
    assert set(parts) == set(bench.PARTS)
    for part in ("projections", "lm_head", "lora", "attention", "norms", "other"):
        assert parts[part] > 0, part  # every part of a real step is found
    assert 0 < len(out["other_ops_s"]) <= 8
    assert sum(out["other_ops_s"].values()) <= parts["other"] * (1 + 1e-9)
    # top-level operations only: nested ones counted twice would add up to more than the profiled steps took
    operations = sum(v for k, v in parts.items() if k != "python")
    assert operations <= out["profiled_mean_s"] * 1.02
    assert sum(parts.values()) == pytest.approx(out["profiled_mean_s"])
    # the bytes compared with the floor: every layer's projections and the LM head, counted from the config
    from agents.models import load_base

    cfg = load_base("tiny-random", dtype="float32")[0].config
    d, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    head_dim = getattr(cfg, "head_dim", None) or d // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim
    per_layer = d * (q + 2 * kv) + q * d + d * 2 * inter + inter * d
    assert out["weights_bytes"] == 4 * (layers * per_layer + cfg.vocab_size * d)
    assert out["kv_bytes"] == 4 * 4 * layers * 2 * cfg.num_key_value_heads * (24 + 3 // 2) * head_dim
    assert out["step_over_floor"] == pytest.approx(out["step_s"] / out["floor_weights_s"])
    assert 0 < out["projections_alone_s"] and out["projections_alone_over_floor"] == pytest.approx(
        out["projections_alone_s"] / out["floor_weights_s"])


def test_bad_arguments_exit_before_loading_a_model(bench, capsys):
    for argv, message in ((["--rows", "0"], "--rows must be at least 1"),
                          (["--positions", "10"], "--positions must exceed")):
        with pytest.raises(SystemExit) as exc:
            bench.main(argv)
        assert exc.value.code == 2
        assert message in capsys.readouterr().err

"""The device chosen on the command line (`--device`, read as `args.device`): converted as an
Accelerate user would, `Accelerator(cpu=args.device == "cpu")`, or refused with the true reason."""

from __future__ import annotations

import accelify.core.pipeline as pipeline
from conftest import FIXTURES

SCRIPT = (FIXTURES / "device_option" / "before.py").read_text()


def convert(source: str):
    result = pipeline.convert_source(source, "train.py")
    assert result.error is None
    return result


def test_every_device_read_becomes_the_accelerators_and_the_option_keeps_the_cpu() -> None:
    out = convert(SCRIPT).output
    assert 'accelerator = Accelerator(cpu=args.device == "cpu")' in out
    assert "device=accelerator.device" in out and 'map_location="cpu"' in out
    assert ".to(args.device)" not in out and "device=args.device" not in out
    assert 'parser.add_argument("--device"' in out  # the option stays: `--device cpu` still means the CPU


def test_a_read_that_is_not_a_device_stays_the_option() -> None:
    source = SCRIPT.replace("    torch.manual_seed(0)\n", '    torch.manual_seed(0)\n    print("on", args.device)\n'
                            '    cuda = args.device.startswith("cuda")\n')
    out = convert(source).output
    assert 'print("on", args.device)' in out and 'cuda = args.device.startswith("cuda")' in out


def test_a_helper_every_call_hands_the_options_reads_the_accelerators_device() -> None:
    source = SCRIPT.replace("def evaluate(model, loader, device):", "def evaluate(model, loader, args):").replace(
        "            x, y = x.to(device), y.to(device)", "            x, y = x.to(args.device), y.to(args.device)"
    ).replace("evaluate(model, test, args.device)", "evaluate(model, test, args)")
    result = convert(source)
    assert 'accelerator = Accelerator(cpu=args.device == "cpu")' in result.output
    assert "def evaluate(accelerator, model, loader, args):" in result.output
    assert ".to(args.device)" not in result.output and not result.findings


def test_a_helper_handed_other_options_too_is_a_true_refusal() -> None:
    source = SCRIPT.replace("def evaluate(model, loader, device):", "def evaluate(model, loader, args):").replace(
        "            x, y = x.to(device), y.to(device)", "            x, y = x.to(args.device), y.to(args.device)"
    ).replace("evaluate(model, test, args.device)", "evaluate(model, test, args)\n"
              "    evaluate(model, test, argparse.Namespace(device=\"cpu\"))")
    result = convert(source)
    assert not result.changed
    assert [(f.code, f.line) for f in result.findings] == [("ACC108", 14)]
    assert "`evaluate` is handed the parsed options" in result.findings[0].message


def test_options_parsed_after_the_model_are_a_true_refusal() -> None:
    source = SCRIPT.replace("    args = parser.parse_args()\n", "").replace(
        "    optimizer = torch.optim.SGD(", "    args = parser.parse_args()\n    optimizer = torch.optim.SGD(")
    result = convert(source)
    assert not result.changed and {f.code for f in result.findings} == {"ACC108"}


def test_the_cpu_chosen_by_the_option_and_by_a_flag_is_a_true_refusal() -> None:
    source = SCRIPT.replace(
        '    parser.add_argument("--epochs"', '    parser.add_argument("--no-cuda", action="store_true")\n'
        '    parser.add_argument("--epochs"').replace(
        "    model = nn.Linear(8, 3).to(args.device)",
        '    device = torch.device("cuda" if not args.no_cuda else "cpu")\n'
        "    model = nn.Linear(8, 3).to(args.device)\n    shift2 = torch.ones(3).to(device)")
    result = convert(source)
    assert not result.changed
    assert [f.code for f in result.findings] == ["ACC102"] and "--device" in result.findings[0].message


def test_an_option_that_is_not_a_device_string_is_not_taken_for_one() -> None:
    for default in ("None", "0", '"gpu0"'):
        source = SCRIPT.replace('default="cuda" if torch.cuda.is_available() else "cpu"', f"default={default}")
        result = convert(source)
        assert not result.changed and "ACC108" in {f.code for f in result.findings}, default


def test_converted_code_converts_to_itself() -> None:
    once = convert(SCRIPT).output
    assert convert(once).output == once


def test_on_an_accelerator_the_converted_script_runs_with_the_gpu_rules(tmp_path) -> None:
    """The converted script with `--device cuda` under the GPU emulation of the checks: the
    Accelerator is on its device (`cpu=False`), and no tensor the script makes stays on the host
    (the shift made by hand, the batches, the reloaded state dict). With `--device cpu` it keeps
    the CPU. (The emulation has one accelerator device for every rank, so it cannot show a read
    left as `"cuda"`, which is `cuda:0` on every process: the conversion tests above do.)"""
    import sys

    import pytest

    pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    from e2e import WRAPPER, run, script_env

    (tmp_path / "converted.py").write_text(convert(SCRIPT).output)
    (tmp_path / "probe.py").write_text(
        "import runpy, sys\nimport accelerate\n"
        "seen = []\n_init = accelerate.Accelerator.__init__\n"
        "def init(self, *a, **k):\n    _init(self, *a, **k)\n    seen.append(str(self.device))\n"
        "accelerate.Accelerator.__init__ = init\n"
        "sys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\nprint('device', seen)\n"
    )
    for option, device in (("cuda", "cpu:0"), ("cpu", "cpu")):
        proc = run([sys.executable, str(WRAPPER), "probe.py", "converted.py", "--device", option, "--epochs", "1"],
                   tmp_path, script_env())
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "Test set:" in proc.stdout and f"device ['{device}']" in proc.stdout


def test_a_configurations_device_is_the_training_device() -> None:
    out = convert((FIXTURES / "config_device" / "before.py").read_text()).output
    assert 'accelerator = Accelerator(cpu=str(args.device) == "cpu")' in out  # a torch.device or a string
    assert "Noise(scale=0.01, device=accelerator.device)" in out and "    device = args.device\n" not in out


def test_a_tensors_device_is_no_configuration() -> None:
    """`device = src.device` in a helper is where that tensor is (the word language model's
    `batchify`): not taken for a device the user chose."""
    source = (FIXTURES / "config_device" / "before.py").read_text().replace(
        "class Noise:", "def on_its_device(src):\n    device = src.device\n    return src.to(device)\n\n\nclass Noise:")
    plain = convert((FIXTURES / "config_device" / "before.py").read_text())
    with_helper = convert(source)
    assert with_helper.changed and [f.code for f in with_helper.findings] == [f.code for f in plain.findings]
    assert "device = src.device" in with_helper.output

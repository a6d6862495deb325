"""ACC015: a script's helper that needs the Accelerator and has no device parameter gets one."""

from __future__ import annotations

from conftest import FIXTURES, convert

SOURCE = (FIXTURES / "helpers_without_device" / "before.py").read_text()


def test_every_call_passes_the_new_first_parameter() -> None:
    output = convert(SOURCE).output
    assert "def train_epoch(accelerator, model, loader, optimizer, epoch):" in output
    assert "train_epoch(accelerator, model, train_loader, optimizer, epoch)" in output
    compile(output, "converted.py", "exec")


def test_without_acc015_the_helper_keeps_its_backward_and_it_is_reported() -> None:
    result = convert(SOURCE, select=frozenset({"ACC001", "ACC004", "ACC005"}))
    assert "def train_epoch(model, loader, optimizer, epoch):" in result.output
    assert "loss.backward()" in result.output
    assert [f.code for f in result.findings] == ["ACC106"]


def test_a_call_from_code_without_the_accelerator_blocks_the_new_parameter() -> None:
    # `run_again` is a module-level function of its own: it cannot pass an accelerator along.
    source = SOURCE.replace(
        'if __name__ == "__main__":',
        "def run_again(model, loader, optimizer):\n    train_epoch(model, loader, optimizer, 0)\n\n\n"
        'if __name__ == "__main__":',
    )
    result = convert(source)
    assert "def train_epoch(model, loader, optimizer, epoch):" in result.output
    assert "ACC106" in [f.code for f in result.findings]


def test_a_module_others_import_keeps_its_signatures() -> None:
    source = SOURCE.split('if __name__ == "__main__":')[0]
    result = convert(source)
    assert "def train_epoch(model, loader, optimizer, epoch):" in result.output
    assert "ACC106" in [f.code for f in result.findings]

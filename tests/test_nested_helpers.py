"""Functions defined inside the function that trains, called there: the value flow follows their parameters as it
follows a module-level helper's (fixtures/nested_save_helper: CodeSearchNet's `save_model(model, path)`)."""

from __future__ import annotations

from conftest import FIXTURES, convert

BEFORE = (FIXTURES / "nested_save_helper" / "before.py").read_text(encoding="utf-8")


def test_a_nested_save_helper_handed_the_trained_model_saves_it_once_unwrapped() -> None:
    result = convert(BEFORE)
    assert "        accelerator.save(accelerator.unwrap_model(model).state_dict(), ckpt_path)\n" in result.output
    assert not result.findings


def test_a_nested_helper_handed_another_model_at_one_call_is_not_followed() -> None:
    """One call hands it a model that is not the one trained: its parameter is not that model (ACC128, as before)."""
    source = BEFORE.replace(
        "        save_model(model, os.path.join(out_dir, f\"epoch{epoch}.pt\"))\n",
        "        save_model(model, os.path.join(out_dir, f\"epoch{epoch}.pt\"))\n"
        "    save_model(torch.nn.Linear(8, 3), os.path.join(out_dir, \"fresh.pt\"))\n")
    result = convert(source)
    assert result.output == source
    assert [f.code for f in result.findings] == ["ACC128"]

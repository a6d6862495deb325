"""The hand migration in the Accelerate docs, reproduced exactly."""

from __future__ import annotations

from conftest import FIXTURES, assert_stable, convert

DOCS = FIXTURES / "docs"

# The one place where accelify goes beyond the docs' diff (issue 4): the progress bar is drawn by
# the local main process only, as the Accelerate examples do. Nothing else may differ.
DEVIATIONS = {
    "progress_bar = tqdm(range(num_training_steps))":
        "progress_bar = tqdm(range(num_training_steps), disable=not accelerator.is_local_main_process)",
}


def _docs_diff() -> tuple[list[str], list[str]]:
    """(lines of the rewritten script, removed lines) from the docs' own diff block."""
    kept, removed = [], []
    for line in (DOCS / "docs.diff").read_text().splitlines():
        prefix, text = line[:2], line[2:]
        if prefix == "- ":
            removed.append(text)
        elif prefix in ("+ ", "  "):
            kept.append(text)
        elif line.strip() == "":
            kept.append("")
    return kept, removed


def test_docs_diff_fixture_is_the_seed() -> None:
    kept, removed = _docs_diff()
    assert "+ from accelerate import Accelerator" in (DOCS / "docs.diff").read_text()
    assert len(removed) == 4 and "loss.backward()" in [r.strip() for r in removed]
    assert kept[0] == "from accelerate import Accelerator"


def test_output_contains_every_docs_line_in_order_and_none_removed(file_regression) -> None:
    output = convert((DOCS / "before.py").read_text()).output
    lines = output.splitlines()
    kept, removed = _docs_diff()
    position = 0
    for wanted in (DEVIATIONS.get(k, k) for k in kept if k.strip()):
        try:
            position = lines.index(wanted, position) + 1
        except ValueError:
            raise AssertionError(f"docs line missing or out of order: {wanted!r}") from None
    for gone in removed:
        assert gone not in lines, gone
    for original in DEVIATIONS:
        assert original not in lines
    # The blank-line layout around the inserted paragraphs is the docs' too.
    assert "\n\ntrain_dataloader, eval_dataloader, model, optimizer = accelerator.prepare(\n" in output
    assert "\n)\n\nnum_epochs = 3\n" in output
    assert "\nfrom transformers import AdamW, AutoModelForSequenceClassification, get_scheduler\n\naccelerator = Accelerator()\n\n" in output
    file_regression.check(output, fullpath=DOCS / "after.py")


def test_docs_golden_is_stable() -> None:
    assert_stable((DOCS / "after.py").read_text())


def test_readme_example_is_this_conversion(tmp_path) -> None:
    """README's example, `accelify convert train.py` on the docs' script, is what the command prints."""
    import subprocess
    import sys

    from conftest import ROOT

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shown = readme.split("```diff\n$ accelify convert train.py\n", 1)[1].split("```", 1)[0]
    (tmp_path / "train.py").write_text((DOCS / "before.py").read_text())
    proc = subprocess.run([sys.executable, "-m", "accelify", "convert", "train.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == shown

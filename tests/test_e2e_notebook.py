"""End-to-end: a notebook's code cells, run in order as one script (what a kernel runs, IPython
lines left out), before and after conversion: the same losses on one process; shards on two."""

from __future__ import annotations

import ast
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from e2e import FIXTURES, run_traced, script_env  # noqa: E402

from accelify.result import Options  # noqa: E402
from accelify.runner import convert_text  # noqa: E402

NOTEBOOK = FIXTURES / "notebook_runnable" / "before.ipynb"
EPOCHS, BATCHES = 3, 8  # the notebook's: 64 samples, batches of 8


def kernel_script(text: str) -> str:
    """The code cells as the kernel would run them, without IPython: a `%%time`/`%%capture` cell
    runs its body, another cell magic is not Python, `%`/`!` lines and `obj?` are IPython's."""
    out = []
    for cell in json.loads(text)["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        lines = source.splitlines()
        if lines and lines[0].startswith("%%"):
            if lines[0].split()[0] not in ("%%time", "%%capture"):
                continue
            lines = lines[1:]
        out += [line for line in lines
                if not line.lstrip().startswith(("%", "!", "?")) and not line.rstrip().endswith("?")]
        out.append("")
    return "\n".join(out)


def losses(stdout: str) -> list[float]:
    [line] = [line for line in stdout.splitlines() if line.startswith("LOSSES ")]
    return ast.literal_eval(line[len("LOSSES "):])


@pytest.fixture(scope="module")
def converted() -> str:
    result = convert_text(NOTEBOOK.read_text(encoding="utf-8"), str(NOTEBOOK), Options())
    assert result.error is None and result.changed
    return result.output


def test_converted_notebook_trains_like_the_original(converted: str, tmp_path) -> None:
    runs = {}
    for name, text in (("before", NOTEBOOK.read_text(encoding="utf-8")), ("after", converted)):
        script = tmp_path / f"{name}.py"
        script.write_text(kernel_script(text), encoding="utf-8")
        runs[name] = run_traced(script, script_env())
    assert "accelerator.backward(loss)" in (tmp_path / "after.py").read_text()
    before, after = (losses(runs[n].stdout[0]) for n in ("before", "after"))
    assert len(before) == EPOCHS * BATCHES
    assert after == before  # bit for bit: the same batches, the same steps
    [opt_before], [opt_after] = runs["before"].traces[0]["optimizers"], runs["after"].traces[0]["optimizers"]
    assert opt_after["steps"] == opt_before["steps"] == EPOCHS * BATCHES
    assert opt_after["checksum"] == opt_before["checksum"]


def test_converted_notebook_shards_its_data_on_two_processes(converted: str, tmp_path) -> None:
    script = tmp_path / "after.py"
    script.write_text(kernel_script(converted), encoding="utf-8")
    run = run_traced(script, script_env(), processes=2)
    assert "LOSSES" in run.stdout[0] and "LOSSES" not in run.stdout[1]  # accelerator.print: rank 0 only
    shards = []
    for trace in run.traces:
        [optimizer] = trace["optimizers"]
        assert optimizer["steps"] == EPOCHS * BATCHES // 2
        # the loader the training loop drew from (the peek cell drew one batch of the whole set first)
        epochs = [e for loader in trace["loaders"] for e in loader["epochs"] if len(e) == BATCHES // 2]
        assert len(epochs) == EPOCHS
        shards.append({i for batch in epochs[0] for i in batch})
    assert not shards[0] & shards[1] and len(shards[0] | shards[1]) == 64
    assert run.traces[0]["optimizers"][0]["checksum"] == run.traces[1]["optimizers"][0]["checksum"]

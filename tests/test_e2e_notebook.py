"""End-to-end: a notebook's code cells, run in order as one script (what a kernel runs, IPython
lines left out), before and after conversion: the same losses on one process; shards on two."""

from __future__ import annotations

import ast
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from e2e import FIXTURES, run_traced, script_env  # noqa: E402

from accelify.core.result import Options  # noqa: E402
from accelify.app.runner import convert_text  # noqa: E402

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


def test_notebook_launcher_trains_on_two_cpu_processes(tmp_path) -> None:
    """``--notebook-launcher 2``: the training function runs in two processes the launcher starts
    (CPU, gloo), each on its half of the data; the notebook's own process trains nothing."""
    from e2e import free_port, run_single_process

    data = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    for cell in data["cells"]:  # the training cell without its %%time (a cell magic stays out of the function)
        if cell["source"] and cell["source"][0] == "%%time\n":
            cell["source"] = cell["source"][1:]
    result = convert_text(json.dumps(data, indent=1), "train.ipynb", Options(notebook_launcher=2))
    assert result.error is None and result.changed
    [note] = result.notes
    assert note.startswith("training code of cells 4, 5, 6, 9, 10 wrapped in `def training_function():` in cell 4")
    script = kernel_script(result.output)
    assert "notebook_launcher(training_function, num_processes=2)" in script
    steps = tmp_path / "steps"
    steps.mkdir()
    # Each process counts its optimizer steps in its own file; the launcher gets a free port.
    prologue = (
        "import functools, os\nimport accelerate\n"
        "from torch.optim.optimizer import register_optimizer_step_post_hook\n"
        "def _count(optimizer, args, kwargs):\n"
        f"    with open(os.path.join({str(steps)!r}, 'rank' + os.environ.get('RANK', '-none')), 'a') as f:\n"
        "        f.write('1\\n')\n"
        "register_optimizer_step_post_hook(_count)\n"
        f"accelerate.notebook_launcher = functools.partial(accelerate.notebook_launcher, use_port={str(free_port())!r})\n"
    )
    path = tmp_path / "launched.py"
    path.write_text(prologue + script, encoding="utf-8")
    proc = run_single_process(path, script_env(ACCELERATE_USE_CPU="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Launching training on 2 " in proc.stdout  # (accelerate names the device type "CUDA" on a CPU too)
    counts = {p.name: len(p.read_text().split()) for p in steps.iterdir()}
    assert counts == {"rank0": EPOCHS * BATCHES // 2, "rank1": EPOCHS * BATCHES // 2}, counts
    assert proc.stdout.count("LOSSES ") == 1  # accelerator.print: rank 0

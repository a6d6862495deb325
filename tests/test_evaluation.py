"""Issue 13: evaluation and batch-inference scripts (no optimizer) convert; what is no model is not
prepared, what cannot be split is refused, what loads a state dict loads on the CPU."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source
from accelify.core.precheck import may_train

EVAL = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
{setup}
loader = DataLoader(TensorDataset(torch.randn(20, 4), torch.randint(0, 2, (20,))), batch_size=8)
correct = 0
with torch.no_grad():
    for x, y in loader:
        x, y = x.to(device), y.to(device)
{body}
print(correct)
"""


def convert(setup, body="        correct += (model(x).argmax(1) == y).sum().item()"):
    source = EVAL.format(setup=setup, body=body)
    return source, convert_source(source, "evaluate.py")


def test_a_model_run_over_a_dataloader_is_prepared_for_evaluation_only():
    source, result = convert("model = nn.Linear(4, 2).to(device)\nmodel.eval()")
    assert result.error is None and result.output != source
    assert "model = accelerator.prepare_model(model, evaluation_mode=True)" in result.output
    assert "loader = accelerator.prepare(loader)" in result.output
    assert "gather_for_metrics" in result.output and ".to(device)" not in result.output


def test_the_prepare_lines_come_after_the_checkpoint_is_loaded():
    source, result = convert('model = nn.Linear(4, 2)\nmodel.load_state_dict(torch.load("m.pt"))\nmodel.to(device)')
    lines = result.output.splitlines()
    load = lines.index('model.load_state_dict(torch.load("m.pt"))')
    assert lines.index("model = accelerator.prepare_model(model, evaluation_mode=True)") > load
    assert "unwrap_model" not in result.output  # nothing wraps a model prepared for evaluation


def test_a_loss_module_and_a_tokenizer_called_in_the_loop_are_no_models():
    source, result = convert(
        "model = nn.Linear(4, 2).to(device)\ncriterion = nn.CrossEntropyLoss()\ntokenizer = Tokenizer()",
        "        loss = criterion(model(x), y)\n        words = tokenizer(x)\n        correct += (model(x).argmax(1) == y).sum().item()",
    )
    assert result.output.count("prepare_model(") == 1
    assert "prepare_model(model," in result.output


def test_a_file_that_trains_keeps_the_training_conversion():
    source, result = convert("model = nn.Linear(4, 2).to(device)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)")
    assert "prepare_model" not in result.output
    assert "loader, model, optimizer = accelerator.prepare(loader, model, optimizer)" in result.output


def test_a_model_never_moved_evaluated_or_loaded_is_not_taken_for_one():
    """`encoder(x)` alone says nothing: a function object, a tokenizer, a metric are called too."""
    source, result = convert("model = build()")
    assert result.output == source and not result.findings


def test_a_whole_pickled_model_loads_on_the_cpu_and_prepare_model_places_it():
    source, result = convert('model = torch.load("model.pt", map_location=device)\nmodel.eval()')
    assert 'model = torch.load("model.pt", map_location="cpu")' in result.output
    assert "model = accelerator.prepare_model(model, evaluation_mode=True)" in result.output


def test_a_model_handed_to_a_helper_with_the_loader_is_followed():
    source = """\
import torch
from torch.utils.data import DataLoader


def evaluate(net, data, device):
    net.eval()
    total = 0
    for x, y in data:
        total += (net(x.to(device)).argmax(1) == y.to(device)).sum().item()
    return total


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Net().to(device)
    loader = DataLoader(dataset, batch_size=4)
    print(evaluate(model, loader, device))


if __name__ == "__main__":
    main()
"""
    output = convert_source(source, "evaluate.py").output
    assert "model = accelerator.prepare_model(model, evaluation_mode=True)" in output
    assert "def evaluate(net, data, accelerator):" in output
    assert "accelerator.gather_for_metrics(" in output and ".to(device)" not in output


@pytest.mark.parametrize("use, expected", [
    ('model.load_state_dict(torch.load("m.pt", map_location=device))', 'map_location="cpu"'),
    ('state = torch.load("m.pt", map_location=device)\nmodel.load_state_dict(state["model"])', 'map_location="cpu"'),
    # a tensor used as it is loaded must be where the model is
    ('table = torch.load("t.pt", map_location=device)\nmodel.weight.data += table', "map_location=accelerator.device"),
])
def test_a_state_dict_loads_on_the_cpu_and_a_tensor_on_the_device(use, expected):
    source, result = convert(f"model = nn.Linear(4, 2)\n{use}\nmodel.to(device)")
    assert expected in result.output, result.output


LIST = """\
import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(4, 2).to(device)
model.eval()
items = [torch.randn(4) for _ in range(5)]
results = []
{loop}
print(results)
"""


def test_inference_over_a_list_is_split_and_gathered_in_order():
    source = LIST.format(loop="for item in items:\n    results.append(model(item.to(device)).argmax().item())")
    output = convert_source(source, "infer.py").output
    assert "with accelerator.split_between_processes(items) as shard:\n    for item in shard:" in output
    assert "results = gather_object(results)" in output
    assert "from accelerate.utils import gather_object" in output
    assert convert_source(output, "infer.py").output == output


@pytest.mark.parametrize("loop, why", [
    ("for item in items:\n    results.append(model(item.to(device)))\n    if len(results) > 2:\n        break",
     "stops or leaves early"),
    ("for item in items:\n    results.append(model(item.to(device)))\nelse:\n    pass", "has an `else:`"),
    ("for item in items:\n    out = model(item.to(device))\n    results.append(out)\n    print(out)", "runs for its effect"),
    ("for item in items:\n    results.append(model(item.to(device)) + len(results))", "reads `results`"),
    ("for item in items:\n    last = model(item.to(device))\n    results.append(last)\nprint(last)", "`last` is read after the loop"),
    ("total = 0\nfor item in items:\n    results.append(model(item.to(device)))\n    total += 1", "adds up across the items"),
])
def test_a_list_loop_that_cannot_be_split_is_refused_with_the_reason(loop, why):
    source = LIST.format(loop=loop)
    result = convert_source(source, "infer.py")
    assert result.output == source
    assert [f.code for f in result.findings] == ["ACC132"]
    assert why in result.findings[0].message


def test_results_collected_in_a_list_from_before_the_loop_are_refused():
    source = LIST.format(loop="results.append(None)\nfor item in items:\n    results.append(model(item.to(device)))")
    result = convert_source(source, "infer.py")
    assert [f.code for f in result.findings] == ["ACC132"] and "made empty right before" in result.findings[0].message


def test_the_precheck_lets_evaluation_scripts_through_and_not_other_files():
    assert may_train(EVAL.format(setup="model = nn.Linear(4, 2).to(device)", body="        out = model(x)"))
    assert may_train(LIST.format(loop="for item in items:\n    results.append(model(item))"))
    # a library module: nothing runs at import, no model run in a loop of its own scope
    library = "import torch\nfrom torch.utils.data import DataLoader\n\n\ndef evaluate(loader, device):\n" \
              "    for batch in loader:\n        yield batch.to(device)\n"
    assert not may_train(library)
    assert not may_train("import torch\nx = torch.ones(3)\nprint(x.sum())\n")


def test_a_predictions_file_written_after_the_loop_is_written_by_the_main_process():
    source, result = convert("model = nn.Linear(4, 2).to(device)\nmodel.eval()",
                             "        correct += (model(x).argmax(1) == y).sum().item()")
    source = source.replace("print(correct)\n", 'with open("accuracy.txt", "w") as f:\n    f.write(f"{correct}\\n")\n')
    result = convert_source(source, "evaluate.py")
    assert 'if accelerator.is_main_process:\n    with open("accuracy.txt", "w") as f:' in result.output
    assert not result.findings  # no ACC127: the file is the gathered result, written once


def test_rows_written_batch_by_batch_to_a_file_opened_before_the_loop_are_refused():
    source, _ = convert("model = nn.Linear(4, 2).to(device)\nmodel.eval()\nout = open(\"preds.txt\", \"w\")",
                        "        out.write(f\"{model(x).argmax(1).tolist()}\\n\")")
    result = convert_source(source, "evaluate.py")
    assert result.output == source
    assert "ACC131" in [f.code for f in result.findings]


def test_an_optimizer_factory_of_the_model_class_never_called_does_not_make_a_training_script():
    """nanoGPT's `sample.py` pastes `model.py`, whose `GPT.configure_optimizers` builds an AdamW that
    nothing in the file calls: the script evaluates, it does not train (it was refused, ACC107)."""
    source = '''\
import torch
from torch import nn
from torch.utils.data import DataLoader


class Net(nn.Linear):
    def configure_optimizers(self, lr):
        optimizer = torch.optim.AdamW(self.parameters(), lr=lr)
        return optimizer


device = "cuda" if torch.cuda.is_available() else "cpu"
model = Net(4, 2).to(device)
model.eval()
loader = DataLoader(data, batch_size=8)
hits = 0
for x, y in loader:
    hits += (model(x.to(device)).argmax(1) == y.to(device)).sum().item()
print(hits)
'''
    result = convert_source(source, "sample.py")
    assert not result.findings and "model = accelerator.prepare_model(model, evaluation_mode=True)" in result.output
    called = source.replace("print(hits)", "optimizer = model.configure_optimizers(0.1)\nprint(hits)")
    result = convert_source(called, "sample.py")  # called here, the optimizer counts: a training script's refusal
    assert result.output == called and [f.code for f in result.findings] == ["ACC104"]
    assert "the loop over `loader` runs the model before the last training object is built" in result.findings[0].message


def test_a_results_table_written_with_pandas_after_the_loop_is_written_once():
    source, _ = convert("model = nn.Linear(4, 2).to(device)\nmodel.eval()")
    source = source.replace("print(correct)\n", 'table.to_csv("out.csv", index=False)\nprint(table.to_csv())\n')
    output = convert_source(source, "evaluate.py").output
    assert 'if accelerator.is_main_process:\n    table.to_csv("out.csv", index=False)' in output
    assert "accelerator.print(table.to_csv())" in output  # no path: it returns the text, writes nothing


def test_a_helper_s_device_used_only_to_load_a_state_dict_goes():
    """boostcamp's inference.py: `load_model(model_dir, num_classes, device)` loads with
    `map_location=device`; handed `accelerator.device` (`cpu:0` with several CPU processes) it failed."""
    source = '''\
import torch
from torch.utils.data import DataLoader


def load_model(path, device):
    model = Net()
    model.load_state_dict(torch.load(path, map_location=device))
    return model


if __name__ == "__main__":
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = load_model("model.pth", device).to(device)
    model.eval()
    loader = DataLoader(data, batch_size=8)
    preds = []
    for x in loader:
        preds.extend(model(x.to(device)).argmax(-1).cpu().numpy())
    print(preds)
'''
    output = convert_source(source, "inference.py").output
    assert "def load_model(path):" in output and 'map_location="cpu"' in output
    assert 'model = load_model("model.pth")\n' in output


@pytest.mark.parametrize("exit_, refused", [
    ("    if i >= 2:\n        break\n", True),  # each process would stop after 2 batches of its shard
    ("    if len(y) < 8:\n        break\n", True),  # decided by the batch: each process's own last one
    ("    if dry_run:\n        break\n", False),  # a mode every process is in alike (pytorch/examples' --dry-run)
])
def test_an_evaluation_loop_that_stops_after_some_batches_is_refused(exit_, refused):
    source = f"""\
import torch
from torch.utils.data import DataLoader

dry_run = False
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = Net().to(device)
model.eval()
loader = DataLoader(data, batch_size=8)
hits = 0
for i, (x, y) in enumerate(loader):
{exit_}    hits += (model(x.to(device)).argmax(1) == y.to(device)).sum().item()
print(hits)
"""
    result = convert_source(source, "evaluate.py")
    if refused:
        codes = [f.code for f in result.findings]  # (a test of the batch is also ACC119's per-process exit)
        assert result.output == source and "ACC114" in codes
        assert "stop before the end of the loader" in result.findings[codes.index("ACC114")].message
    else:
        assert "gather_for_metrics" in result.output and not result.findings


@pytest.mark.parametrize("setup, body, why", [
    ("features = torch.zeros(0, 2)", "        features = torch.cat((features, model(x)), 0)", "rebuilds `features`"),
    ("preds = {}", "        preds[len(preds)] = model(x).argmax(1)", "writes into an object from before the loop"),
    ("", '        torch.save(model(x), "batch.pt")', "writes a file batch by batch"),
])
def test_results_kept_where_no_gather_reaches_them_are_refused(setup, body, why):
    """Kept so, each process's results would be its own shard only, and what the main process
    writes or prints after the loop a part of the set (a wrong conversion, not a slow one)."""
    source, result = convert(f"model = nn.Linear(4, 2).to(device)\nmodel.eval()\n{setup}", body)
    assert result.output == source
    assert [f.code for f in result.findings] == ["ACC114"] and why in result.findings[0].message


def test_predictions_printed_batch_by_batch_are_refused_and_progress_is_not():
    progress = '        print(f"batch {i}: {len(x)} samples, {x.shape}")\n'

    def script(body):
        source = EVAL.format(setup="model = nn.Linear(4, 2).to(device)", body=body)
        return source.replace("    for x, y in loader:\n", "    for i, (x, y) in enumerate(loader):\n" + progress)

    counted = convert_source(script("        correct += (model(x).argmax(1) == y).sum().item()"), "evaluate.py")
    assert "gather_for_metrics" in counted.output and not counted.findings
    per_batch = script("        for label in model(x).argmax(1).tolist():\n            print(label)")
    result = convert_source(per_batch, "evaluate.py")
    assert result.output == per_batch and [f.code for f in result.findings] == ["ACC114"]
    assert "prints each batch's results" in result.findings[0].message

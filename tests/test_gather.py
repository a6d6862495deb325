"""ACC011: outputs are gathered together with every label the metrics read, or not at all."""

from __future__ import annotations

from conftest import assert_stable, convert

SCRIPT = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(make_dataset(), batch_size=8)
val_loader = DataLoader(make_dataset(), batch_size=8)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = model(x, y)
    loss.backward()
    optimizer.step()
total = 0
with torch.no_grad():
    for batch in val_loader:
        x, y = batch
        out = model(x)
        mse = criterion(out, y)
        total += mse.item()
"""


def _evaluated_whole(source: str) -> str:
    """A loop whose metrics no gather pairs: its loader (``val_loader``) is left whole and nothing is gathered
    (ACC146); the note's message, which names why."""
    result = convert(source)
    assert result.changed and "gather_for_metrics" not in result.output, result.findings
    assert "val_loader" not in result.output.split(".prepare(")[1].split(")")[0]
    assert_stable(result.output)
    return next(f for f in result.findings if f.code == "ACC146").message


def test_labels_read_through_an_intermediate_value_are_gathered_with_the_outputs() -> None:
    result = convert(SCRIPT)
    assert "        out, y = accelerator.gather_for_metrics((out, y))\n        mse = criterion(out, y)\n" in result.output
    assert_stable(result.output)


def test_labels_computed_from_the_batch_are_gathered_with_the_outputs() -> None:
    # `y` comes from a call on the batch: gathering `out` alone would pair every process's
    # outputs with this process's labels (a size mismatch with two processes).
    source = SCRIPT.replace("        x, y = batch\n", "        x, y = unpack(batch[0]), unpack(batch[1])\n")
    result = convert(source)
    assert "        out, y = accelerator.gather_for_metrics((out, y))\n        mse = criterion(out, y)\n" in result.output
    assert_stable(result.output)


def test_parts_of_an_output_object_are_gathered_not_the_object() -> None:
    # `out.logits`: gathering `out` would fail on a dataclass or namespace output; the part the
    # metric reads is gathered, right before the first statement that is no longer per sample.
    source = SCRIPT.replace("        out = model(x)\n", "        out = model(x)\n        logits = out.logits\n")
    source = source.replace("mse = criterion(out, y)", "mse = criterion(logits, y)")
    output = convert(source).output
    assert "        logits = out.logits\n        logits, y = accelerator.gather_for_metrics((logits, y))\n" in output
    assert "gather_for_metrics((out" not in output
    assert_stable(output)


def test_a_part_of_a_batch_dict_is_gathered_under_the_keyword_it_is_passed_as() -> None:
    # The Hugging Face course's loop, as the Accelerate docs convert it: never the whole batch dict.
    source = SCRIPT.replace(
        "        x, y = batch\n        out = model(x)\n        mse = criterion(out, y)\n        total += mse.item()\n",
        "        outputs = model(**batch)\n        logits = outputs.logits\n"
        "        predictions = torch.argmax(logits, dim=-1)\n"
        "        metric.add_batch(predictions=predictions, references=batch[\"labels\"])\n",
    )
    assert "add_batch" in source
    output = convert(source).output
    assert (
        "        predictions, references = accelerator.gather_for_metrics((predictions, batch[\"labels\"]))\n"
        "        metric.add_batch(predictions=predictions, references=references)\n"
    ) in output
    assert_stable(output)


def test_an_object_read_whole_and_in_parts_is_not_gathered() -> None:
    source = SCRIPT.replace("        total += mse.item()\n", "        total += mse.item()\n        seen.append(out)\n")
    source = source.replace("mse = criterion(out, y)", "mse = criterion(out.logits, y)")
    assert "`out` whole and a part of it (`out.logits`)" in _evaluated_whole(source)


def test_a_model_call_inside_the_metric_is_gathered_with_the_labels() -> None:
    source = SCRIPT.replace(
        "        out = model(x)\n        mse = criterion(out, y)\n        total += mse.item()\n",
        "        total += (model(x).argmax(1) == y).sum().item()\n",
    )
    output = convert(source).output
    assert (
        "        outputs, y = accelerator.gather_for_metrics((model(x), y))\n"
        "        total += (outputs.argmax(1) == y).sum().item()\n"
    ) in output
    assert_stable(output)


def test_a_metric_over_the_batch_before_the_model_runs_is_not_gathered() -> None:
    source = SCRIPT.replace("        out = model(x)\n", "        total += y.size(0)\n        out = model(x)\n")
    assert "before the model's outputs exist" in _evaluated_whole(source)


def test_metrics_with_no_model_output_to_gather_are_evaluated_whole_not_per_process() -> None:
    source = SCRIPT.replace(
        "        out = model(x)\n        mse = criterion(out, y)\n        total += mse.item()\n",
        "        total += score(model, x, y)\n",
    )
    assert "no `output = model(...)` line" in _evaluated_whole(source)


def test_an_output_taken_through_a_method_of_the_model_call_is_gathered() -> None:
    source = SCRIPT.replace("        out = model(x)\n", "        out = model(x).squeeze()\n")
    assert "        out, y = accelerator.gather_for_metrics((out, y))\n" in convert(source).output


def test_metrics_collected_with_extend_alone_are_gathered() -> None:
    source = SCRIPT.replace("        mse = criterion(out, y)\n        total += mse.item()\n",
                            "        predictions.extend(out.argmax(dim=1).tolist())\n")
    assert "total +=" not in source and ".append(" not in source
    assert "        out, y = accelerator.gather_for_metrics((out, y))\n" not in source
    output = convert(source).output
    assert "        out = accelerator.gather_for_metrics(out)\n" in output


def test_values_used_by_other_code_are_not_gathered() -> None:
    # ex_vae's test loop reshapes the outputs to `batch_size` rows to save a comparison image:
    # gathered, they would hold every process's rows there (a crash with two processes).
    source = SCRIPT.replace(
        "        total += mse.item()\n",
        "        total += mse.item()\n        if first:\n            save(out.view(8, 1, 28, 28))\n",
    )
    assert "(`out`) are also read by `if first:`, which accelify does not take for a metric" in _evaluated_whole(source)


def test_a_tensor_gather_in_the_loop_is_no_gather_across_processes() -> None:
    """`out.gather(1, idx)` is torch's gather along a dimension: the metrics still need
    gather_for_metrics (only the accelerator's gather, reduce or pad_across_processes mean the
    script collects across processes itself: fixtures/noop/already_gathers_itself.py)."""
    source = SCRIPT.replace("        mse = criterion(out, y)\n", "        out = out.gather(1, idx)\n        mse = criterion(out, y)\n")
    result = convert(source)
    assert "        out, y = accelerator.gather_for_metrics((out, y))\n" in result.output


def test_a_metric_that_ranks_the_samples_of_a_batch_against_each_other_is_not_gathered() -> None:
    """NCF: each batch is one user's candidates, `torch.topk(predictions, k)` ranks them and `torch.take`
    picks the items: gathered, the processes' batches would be ranked as one (a wrong hit rate)."""
    source = SCRIPT.replace(
        "        out = model(x)\n        mse = criterion(out, y)\n        total += mse.item()\n",
        "        out = model(x)\n        _, indices = torch.topk(out, 10)\n"
        "        recommends = torch.take(y, indices).tolist()\n        total += int(y[0].item() in recommends)\n")
    assert "torch.topk(out, 10)" in _evaluated_whole(source)


def test_a_ranking_along_a_dimension_of_each_sample_is_gathered() -> None:
    """`torch.topk(out, 3, dim=1)`: each sample's own top classes, one row per sample: gathered."""
    source = SCRIPT.replace(
        "        out = model(x)\n        mse = criterion(out, y)\n        total += mse.item()\n",
        "        out = model(x)\n        _, top = torch.topk(out, 3, dim=1)\n"
        "        total += (top == y.unsqueeze(1)).any(dim=1).sum().item()\n")
    result = convert(source)
    assert result.changed and "gather_for_metrics((top, y))" in result.output, result.output


def test_item_of_a_model_output_is_one_number_per_batch_and_is_not_gathered() -> None:
    """`total += model(x, y).item()` in an evaluation loop: the model computes one loss per batch; gathered, it
    held one per process and `.item()` of it raised on two processes (the conversion had gathered it)."""
    from accelify.core.pipeline import convert_source

    source = """\
import torch
from torch.utils.data import DataLoader


def evaluate(model, loader):
    total = 0.0
    for x, y in loader:
        total += model(x, y).item()
    return total / len(loader)


def main():
    loader = DataLoader(make_dataset(), batch_size=8)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = model(x, y)
        loss.backward()
        optimizer.step()
    print(evaluate(model, loader))


if __name__ == "__main__":
    main()
"""
    result = convert_source(source, "train.py")
    assert not result.changed
    finding = next(f for f in result.findings if f.code == "ACC114")
    assert "they read `model(x, y).item()`: one number per batch" in finding.message


def test_a_statement_over_several_lines_is_named_on_one() -> None:
    source = SCRIPT.replace(
        "        total += mse.item()\n",
        "        total += mse.item()\n        save(\n            out.view(8, 1, 28, 28))\n",
    )
    assert "also read by `save(out.view(8, 1, 28, 28))`, which accelify does not take for a metric" in _evaluated_whole(source)


def test_metrics_under_an_if_on_something_not_gathered_are_metrics() -> None:
    """DINO's linear evaluation: `if linear_classifier.module.num_labels >= 5: acc1, acc5 = accuracy(...)`
    `else: acc1, = accuracy(...)`, then the meters updated, one of them under the same test: the `if`
    holds only metrics and what they read, and its test reads nothing gathered. It was ACC114 ("also read
    by `if ...:`, which accelify does not take for a metric")."""
    source = SCRIPT.replace(
        "        mse = criterion(out, y)\n        total += mse.item()\n",
        "        if wide:\n            acc1, acc5 = accuracy(out, y, topk=(1, 5))\n        else:\n"
        "            acc1, = accuracy(out, y, topk=(1,))\n        top1 += acc1.item()\n"
        "        if wide:\n            top5 += acc5.item()\n",
    )
    result = convert(source)
    assert "        out, y = accelerator.gather_for_metrics((out, y))\n        if wide:\n" in result.output
    assert "ACC114" not in [f.code for f in result.findings]
    assert_stable(result.output)


def test_an_if_whose_test_reads_a_gathered_value_is_not_gathered() -> None:
    source = SCRIPT.replace("        total += mse.item()\n",
                            "        if out.shape[0] == 8:\n            total += mse.item()\n")
    assert "`if out.shape[0] == 8:`" in _evaluated_whole(source)


def test_outputs_made_in_an_if_or_else_are_gathered_with_the_labels() -> None:
    """DINO: `if "vit" in args.arch: output = ... else: output = model(inp)`, then `output =
    linear_classifier(output)`: the outputs come from the batch through the `if`. Before, they were not
    seen to, and only the labels were gathered: every process's labels against its own outputs."""
    source = SCRIPT.replace(
        "        out = model(x)\n",
        "        if vit:\n            feats = backbone.get_intermediate_layers(x)\n        else:\n"
        "            feats = backbone(x)\n        out = model(feats)\n",
    )
    result = convert(source)
    assert "        out, y = accelerator.gather_for_metrics((out, y))\n" in result.output, result.output
    assert_stable(result.output)

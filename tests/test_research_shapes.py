"""Shapes of research code the fourteenth session met: evaluation helpers decorated with `@torch.no_grad()`,
the torchvision references' `metric_logger.log_every(loader, ...)`, and a loader read through a wrapper
accelify does not see into (refused: prepared, it would be evaluated one shard per process, ungathered)."""
from __future__ import annotations

from textwrap import dedent

from conftest import assert_stable, convert

SCRIPT = dedent('''\
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    @torch.no_grad()
    def evaluate(model, loader):
        correct = 0
        for x, y in loader:
            x = x.cuda(non_blocking=True)
            y = y.cuda(non_blocking=True)
            correct += (model(x).argmax(1) == y).sum().item()
        return correct


    def main():
        model = torch.nn.Linear(4, 3).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        train = DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,))), batch_size=8)
        test = DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,))), batch_size=8)
        for x, y in train:
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            loss.backward()
            optimizer.step()
        print(evaluate(model, test))


    if __name__ == "__main__":
        main()
''')


def test_an_evaluation_helper_under_no_grad_is_handed_the_accelerator():
    out = convert(SCRIPT, "train.py").output
    assert "@torch.no_grad()\ndef evaluate(accelerator, model, loader):" in out
    assert "accelerator.gather_for_metrics(" in out and ".cuda()" not in out


def test_a_decorator_that_is_not_a_grad_mode_still_hides_the_call_sites():
    source = SCRIPT.replace("@torch.no_grad()\n", "@functools.lru_cache()\n").replace("import torch\n", "import functools\nimport torch\n", 1)
    out = convert(source, "train.py").output
    assert "def evaluate(accelerator" not in out


def test_the_metric_loggers_log_every_is_a_loop_over_its_loader():
    source = SCRIPT.replace("    for x, y in loader:", "    for x, y in metric_logger.log_every(loader, 10, 'Test:'):")
    out = convert(source, "train.py").output
    assert "accelerator.gather_for_metrics(" in out


def test_a_loader_read_through_an_unknown_wrapper_in_an_evaluation_is_refused():
    source = SCRIPT.replace("    for x, y in loader:", "    for x, y in wrap(loader):")
    result = convert(source, "train.py")
    assert result.output == source
    finding = next(f for f in result.findings if f.code == "ACC114")
    assert "`wrap(loader)`" in finding.message and finding.line == 8


def test_a_training_loop_through_a_wrapper_is_not_refused_for_it():
    source = SCRIPT.replace("for x, y in train:", "for x, y in prefetch(train):")
    assert not any("come through" in f.message for f in convert(source, "train.py").findings)


ODENET = SCRIPT.replace('''    for x, y in loader:
        x = x.cuda(non_blocking=True)
        y = y.cuda(non_blocking=True)
        correct += (model(x).argmax(1) == y).sum().item()''', '''    for x, y in loader:
        x = x.cuda(non_blocking=True)
        y = y.numpy()
        predicted = model(x).argmax(1).cpu().numpy()
        correct += (predicted == y).sum().item()''')


def test_the_model_run_inside_a_line_before_the_metric_is_gathered_where_the_batch_is():
    """ODE-Net's `accuracy`: the labels made NumPy first (`y = one_hot(np.array(y.numpy()), 10)`), then
    `np.argmax(model(x).cpu().detach().numpy(), axis=1)` in a line that is no metric: the outputs are taken right
    after the last line that binds what the model reads, gathered with the labels as the loop drew them."""
    assert ODENET != SCRIPT
    out = convert(ODENET, "train.py").output
    assert "        outputs, y = accelerator.gather_for_metrics((model(x), y))\n        y = y.cpu().numpy()\n" in out, out
    assert "predicted = outputs.argmax(1).cpu().numpy()" in out and "model(x).argmax" not in out


def test_the_gather_goes_after_the_last_line_that_binds_the_models_input():
    source = ODENET.replace("        y = y.numpy()\n", "        if x.shape[0] > 1:\n            x = x * 1\n        y = y.numpy()\n")
    out = convert(source, "train.py").output
    assert "            x = x * 1\n        outputs, y = accelerator.gather_for_metrics((model(x), y))\n" in out


def test_outputs_made_numpy_with_no_one_model_call_to_take_them_from_are_not_gathered():
    """Gathered after `y = y.numpy()`, the labels would be a NumPy array, which `gather_for_metrics` cannot gather
    on several processes (it was converted so, and failed there); two model calls leave no one place to take
    the outputs from: the test loader is left whole (ACC146)."""
    source = ODENET.replace("        predicted = model(x).argmax(1).cpu().numpy()\n",
                            "        if y.shape[0] > 1:\n            predicted = model(x).argmax(1).cpu().numpy()\n"
                            "        else:\n            predicted = model(x * 2).argmax(1).cpu().numpy()\n")
    result = convert(source, "train.py")
    assert result.changed and "gather_for_metrics" not in result.output
    assert "ACC146" in [f.code for f in result.findings] and "ACC114" not in [f.code for f in result.findings]


KWS = dedent('''\
    import argparse

    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda", action="store_true")
    args = parser.parse_args()

    train_loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,))), batch_size=4, shuffle=True)
    test_loader = DataLoader(TensorDataset(torch.randn(10, 4), torch.randint(0, 3, (10,))), batch_size=4)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LogSoftmax(dim=1))
    if args.cuda:
        model = torch.nn.DataParallel(model).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for data, target in train_loader:
        if args.cuda:
            data, target = data.cuda(), target.cuda()
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
    correct = 0
    for data, target in test_loader:
        if args.cuda:
            data, target = data.cuda(), target.cuda()
        output = model(data)
        pred = output.data.max(1, keepdim=True)[1]
        correct += pred.eq(target.data.view_as(pred)).cpu().sum()
    print(correct)
    state = {"net": model.module if args.cuda else model}
    torch.save(state, "ckpt.t7")
''')


def test_the_batch_is_not_gathered_for_an_attribute_that_shares_its_name():
    """GCommandsPytorch's `pred.eq(target.data.view_as(pred))`: `.data` is an attribute, not the batch `data`,
    which was gathered along with the outputs (every process's inputs sent for nothing)."""
    out = convert(KWS).output
    [gather] = [line for line in out.splitlines() if "gather_for_metrics" in line]
    assert "target" in gather and "data" not in gather.replace("target", ""), gather


def test_the_wrapper_condition_of_a_module_read_goes_with_unwrap_model():
    """`model.module if args.cuda else model` (wrapped in DataParallel only with --cuda): the prepared model may be
    wrapped whatever `--cuda` says, so only `unwrap_model` gives the plain model on every launch; the `else`
    branch would have saved the DistributedDataParallel wrapper on several CPU processes."""
    out = convert(KWS).output
    assert 'state = {"net": accelerator.unwrap_model(model)}' in out, out
    assert_stable(out)


def test_tqdm_write_prints_once():
    """tiny NeRF's `tqdm.write("Loss: " + str(loss.item()))`: a print that spares the progress bars, written by
    every process (the side-effect check saw it twice); `accelerator.print` writes it once."""
    source = KWS.replace("import argparse\n", "import argparse\n\nfrom tqdm import tqdm\n").replace(
        "    optimizer.step()\n", "    optimizer.step()\n    tqdm.write(\"Loss: \" + str(loss.item()))\n")
    out = convert(source).output
    assert '    accelerator.print("Loss: " + str(loss.item()))\n' in out, out
    assert_stable(out)
    kept = source.replace('tqdm.write("Loss: " + str(loss.item()))', 'tqdm.write("Loss", nolock=True)')
    assert 'tqdm.write("Loss", nolock=True)' in convert(kept).output  # (no such argument of print)


def test_thop_profile_prints_on_the_main_process_only():
    """SimCLR (leftthomas): `flops, params = profile(model, inputs=(torch.randn(1, 3, 32, 32).cuda(),))` prints a
    line per layer type it registers, on every process (the side-effect check saw them twice); thop's own
    `verbose=` keeps them to the main process. A call that says `verbose=` (or `report_missing=`) is kept."""
    for spelling, call in (("from thop import profile\n", "profile"), ("import thop\n", "thop.profile")):
        source = KWS.replace("import argparse\n", f"import argparse\n\n{spelling}").replace(
            "    optimizer.step()\n", f"    optimizer.step()\n    flops, params = {call}(model, inputs=(data,))\n")
        out = convert(source).output
        assert f"    flops, params = {call}(model, inputs=(data,), verbose=accelerator.is_main_process)\n" in out, out
        assert_stable(out)
        kept = source.replace("inputs=(data,))", "inputs=(data,), verbose=False)")
        assert f"{call}(model, inputs=(data,), verbose=False)" in convert(kept).output
    # a function of the script's own named `profile` is not thop's
    own = KWS.replace("import argparse\n", "import argparse\n\n\ndef profile(m, inputs):\n    return 0, 0\n").replace(
        "    optimizer.step()\n", "    optimizer.step()\n    flops, params = profile(model, inputs=(data,))\n")
    assert "verbose=" not in convert(own).output


def test_training_objects_returned_in_a_dict_are_prepared_where_the_caller_reads_them() -> None:
    """Issue 26 §2, "models returned in a dict": `objects = create_objects(lr)`, then `model = objects["model"]`
    and `optimizer = objects["optimizer"]` (fixtures/factory_dict, run on two processes by test_e2e_scripts); a dict
    handed on whole (`**objects`, NeRF's render kwargs) cannot be followed key by key: ACC107 as before."""
    from conftest import FIXTURES

    source = (FIXTURES / "factory_dict" / "before.py").read_text(encoding="utf-8")
    result = convert(source)
    assert '    optimizer = objects["optimizer"]\n\n    loader, model, optimizer = accelerator.prepare(loader, model, optimizer)\n' \
        in result.output
    assert '    model = objects["model"]\n' in result.output
    unread = source.replace('    optimizer = objects["optimizer"]\n', '    optimizer = objects.get("optimizer")\n')
    assert [f.code for f in convert(unread).findings] == ["ACC107"]

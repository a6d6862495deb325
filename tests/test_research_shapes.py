"""Shapes of research code (issue 26) that single tests pin down: a model kept in a module global
that only `main` assigns (vdsr: `global opt, model`), and a helper that saves the model inside a
dict it builds (`state = {"epoch": epoch, "model": model}; torch.save(state, path)`)."""

from __future__ import annotations

from accelify.core.pipeline import convert_source

VDSR = """\
import torch


def main():
    global model
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
    model = torch.nn.Linear(4, 2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        train(loader, optimizer, model, device)
        save_checkpoint(model, epoch)


def train(loader, optimizer, model, device):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def save_checkpoint(model, epoch):
    state = {"epoch": epoch, "model": model}
    torch.save(state, f"model_epoch_{epoch}.pth")


if __name__ == "__main__":
    main()
"""


def test_a_model_global_that_only_main_assigns_is_mains() -> None:
    result = convert_source(VDSR, "train.py")
    assert result.changed, result.findings  # was ACC107: "trains `model`, which lives in `<module>`"
    assert "    loader, model, optimizer = accelerator.prepare(loader, model, optimizer)\n" in result.output
    assert "    global model\n" in result.output
    assert convert_source(result.output, "train.py").output == result.output


def test_a_model_saved_inside_a_dict_by_a_helper_is_unwrapped_and_saved_once() -> None:
    result = convert_source(VDSR, "train.py")
    assert 'state = {"epoch": epoch, "model": accelerator.unwrap_model(model)}' in result.output
    assert ('    if accelerator.is_main_process:\n        torch.save(state, f"model_epoch_{epoch}.pth")\n'
            in result.output)
    assert "save_checkpoint(accelerator, model, epoch)" in result.output


def test_a_global_also_assigned_elsewhere_stays_the_modules() -> None:
    text = VDSR.replace("if __name__", "model = None\n\nif __name__")
    result = convert_source(text, "train.py")
    assert not result.changed and any(f.code == "ACC107" for f in result.findings)


PROTONET = """\
import torch


def init_optim(opt, model):
    '''
    Initialize optimizer
    '''
    return torch.optim.Adam(params=model.parameters(), lr=opt)


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
    model = torch.nn.Linear(4, 2).to(device)
    optim = init_optim(0.1, model)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optim.zero_grad()
        loss.backward()
        optim.step()


if __name__ == "__main__":
    main()
"""


def test_an_optimizer_from_a_one_line_factory_trains_the_model_handed_to_it() -> None:
    """protonet: `optim = init_optim(options, model)`, whose body is `return torch.optim.Adam(params=
    model.parameters(), ...)` (was ACC125: "builds no optimizer accelify recognises")."""
    result = convert_source(PROTONET, "train.py")
    assert result.changed, result.findings
    assert "    loader, model, optim = accelerator.prepare(loader, model, optim)\n" in result.output
    assert "return torch.optim.Adam(params=model.parameters(), lr=opt)" in result.output  # the factory stays


def test_a_factory_that_builds_its_own_model_is_no_one_line_factory() -> None:
    text = PROTONET.replace("params=model.parameters()", "params=torch.nn.Linear(4, 2).parameters()")
    result = convert_source(text, "train.py")
    assert not result.changed and [f.code for f in result.findings] == ["ACC125"]

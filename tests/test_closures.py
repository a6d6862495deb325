"""A training step in a function defined inside a module-level one (GAT's `main_loop` inside `get_main_loop`):
the outer function takes the accelerator, the inner one reads it from there; a prepared model handed to
another module's function whose result is saved right away is handed unwrapped."""

from __future__ import annotations

from conftest import assert_stable, convert

SCRIPT = """\
import torch

import utils


def get_main_loop(model, optimizer, features, labels):
    def main_loop(train=True):
        out = model(features)
        loss = torch.nn.functional.cross_entropy(out, labels)
        if train:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return loss.item()

    return main_loop


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    features = torch.randn(16, 4).to(device)
    labels = torch.randint(0, 2, (16,)).to(device)
    model = torch.nn.Linear(4, 2).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    main_loop = get_main_loop(model, optimizer, features, labels)
    for epoch in range(3):
        print(main_loop())
    torch.save(utils.training_state(model), "model.pth")


if __name__ == "__main__":
    main()
"""


def test_the_outer_function_takes_the_accelerator_and_the_closure_reads_it() -> None:
    result = convert(SCRIPT, "train.py")
    assert result.changed, result.findings
    out = result.output
    assert "def get_main_loop(accelerator, model, optimizer, features, labels):" in out
    assert "            accelerator.backward(loss)\n" in out
    assert "main_loop = get_main_loop(accelerator, model, optimizer, features, labels)" in out
    assert "ACC106" not in [f.code for f in result.findings]
    assert_stable(out)


def test_a_closure_whose_outer_function_cannot_take_it_keeps_acc106() -> None:
    source = SCRIPT.replace("    main_loop = get_main_loop(model, optimizer, features, labels)\n",
                            "    objects = (model, optimizer, features, labels)\n    main_loop = get_main_loop(*objects)\n")
    result = convert(source, "train.py")
    assert not result.changed and "ACC106" in [f.code for f in result.findings]


def test_a_model_handed_to_another_modules_function_whose_result_is_saved_is_unwrapped() -> None:
    out = convert(SCRIPT, "train.py").output
    assert 'torch.save(utils.training_state(accelerator.unwrap_model(model)), "model.pth")' in out

"""A plain PyTorch training script: the kind accelify converts.

Runs anywhere (CPU included) on synthetic data:  python examples/train.py
Convert it:                                     accelify convert examples/train.py
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
features = torch.randn(256, 16)
labels = (features.sum(dim=1) > 0).long()
train_dataloader = DataLoader(TensorDataset(features[:192], labels[:192]), batch_size=32, shuffle=True)
eval_dataloader = DataLoader(TensorDataset(features[192:], labels[192:]), batch_size=32)

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

for epoch in range(3):
    model.train()
    for inputs, targets in train_dataloader:
        inputs, targets = inputs.to(device), targets.to(device)
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss {loss.item():.4f}")

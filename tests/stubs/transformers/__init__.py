"""Offline stand-in for Hugging Face ``transformers`` (test stub; see ../README.md).

Provides ``AdamW``, ``AutoTokenizer``, ``AutoModelForSequenceClassification``
and ``get_scheduler`` -- just enough for ``fixtures/docs/before.py``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

__version__ = "0.0.0-stub"

AdamW = torch.optim.AdamW

VOCAB_SIZE = 32
MAX_LENGTH = 8
PAD_ID, CLS_ID = 0, 1


class _CharTokenizer:
    """Deterministic char-level tokenizer: [CLS] + (ord(c) % 30 + 2), padded/truncated to 8."""

    model_max_length = MAX_LENGTH

    def _encode(self, text: str, max_length: int, truncation: bool, pad: bool):
        ids = [CLS_ID] + [2 + ord(c) % (VOCAB_SIZE - 2) for c in text]
        if truncation:
            ids = ids[:max_length]
        mask = [1] * len(ids)
        if pad and len(ids) < max_length:
            mask += [0] * (max_length - len(ids))
            ids += [PAD_ID] * (max_length - len(ids))
        return ids, mask

    def __call__(self, text, padding=False, truncation=False, max_length=None, **_kwargs):
        max_length = max_length or self.model_max_length
        pad = padding == "max_length"
        single = isinstance(text, str)
        encoded = [self._encode(t, max_length, bool(truncation), pad) for t in ([text] if single else text)]
        out = {
            "input_ids": [ids for ids, _ in encoded],
            "token_type_ids": [[0] * len(ids) for ids, _ in encoded],
            "attention_mask": [mask for _, mask in encoded],
        }
        return {k: v[0] for k, v in out.items()} if single else out


class AutoTokenizer:
    @classmethod
    def from_pretrained(cls, name_or_path, *args, **kwargs) -> _CharTokenizer:
        return _CharTokenizer()


@dataclass
class SequenceClassifierOutput:
    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None


def _log_loss(loss: torch.Tensor) -> None:
    path = os.environ.get("ACCELIFY_LOSS_LOG")
    if not path:
        return
    rank = os.environ.get("RANK", "0")
    with open(f"{path}.{rank}", "a", encoding="utf-8") as fh:
        fh.write(f"rank={rank} loss={round(loss.item(), 6)}\n")
        fh.flush()


class TinySequenceClassifier(nn.Module):
    """Embedding -> masked mean pool -> linear."""

    def __init__(self, num_labels: int = 2, hidden: int = 16):
        super().__init__()
        self.num_labels = num_labels
        self.embed = nn.Embedding(VOCAB_SIZE, hidden)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, input_ids, attention_mask=None, labels=None, **_kwargs):
        emb = self.embed(input_ids)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        mask = attention_mask.unsqueeze(-1).to(emb.dtype)
        pooled = (emb * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        logits = self.classifier(pooled)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits, labels)
            if self.training:
                _log_loss(loss)
        return SequenceClassifierOutput(loss=loss, logits=logits)


class AutoModelForSequenceClassification:
    @classmethod
    def from_pretrained(cls, name_or_path, *args, num_labels: int = 2, **kwargs) -> TinySequenceClassifier:
        # Same weights in every run and process, without disturbing the global RNG.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return TinySequenceClassifier(num_labels=num_labels)


def get_scheduler(name, optimizer, num_warmup_steps=None, num_training_steps=None, **_kwargs):
    if name != "linear":
        raise ValueError(f"stub get_scheduler only supports 'linear', got {name!r}")
    if num_training_steps is None:
        raise ValueError("'linear' requires num_training_steps")
    warmup = num_warmup_steps or 0

    def lr_lambda(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (num_training_steps - step) / max(1, num_training_steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)

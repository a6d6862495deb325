"""Offline stand-in for Hugging Face ``datasets`` (test stub; see ../README.md).

Only what ``fixtures/docs/before.py`` needs: ``load_dataset`` returning a
``DatasetDict`` with "train" (24 rows) and "test" (10 rows) splits of synthetic
``text`` + integer ``label``, and ``map(batched=True)``, ``remove_columns``,
``rename_column``, ``set_format("torch")`` and ``ds["train"][i]``.
"""
from __future__ import annotations

import torch

__version__ = "0.0.0-stub"

SPLIT_SIZES = {"train": 24, "test": 10}
_WORDS = ["awful", "great", "bland", "superb"]  # even index -> label 0, odd -> 1


class Dataset(torch.utils.data.Dataset):
    """Column-oriented map-style dataset."""

    def __init__(self, columns: dict[str, list]):
        lengths = {len(v) for v in columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns have different lengths: {lengths}")
        self._columns = {k: list(v) for k, v in columns.items()}
        self._format = None

    @property
    def column_names(self) -> list[str]:
        return list(self._columns)

    def __len__(self) -> int:
        return len(next(iter(self._columns.values()), []))

    def __getitem__(self, key):
        if isinstance(key, str):
            return list(self._columns[key])
        if not isinstance(key, int):
            raise TypeError(f"unsupported index type {type(key).__name__}")
        if not -len(self) <= key < len(self):
            raise IndexError(key)
        row = {name: values[key] for name, values in self._columns.items()}
        if self._format == "torch":
            row = {k: (v if isinstance(v, str) else torch.tensor(v)) for k, v in row.items()}
        return row

    def _copy(self, columns: dict[str, list]) -> "Dataset":
        new = Dataset(columns)
        new._format = self._format
        return new

    def map(self, function, batched: bool = False, **_kwargs) -> "Dataset":
        columns = dict(self._columns)
        if batched:
            update = dict(function({k: list(v) for k, v in columns.items()}))
        else:
            rows = [dict(function({k: v[i] for k, v in columns.items()})) for i in range(len(self))]
            update = {k: [r[k] for r in rows] for k in (rows[0] if rows else {})}
        for name, values in update.items():
            if len(values) != len(self):
                raise ValueError(f"map() returned {len(values)} values for column {name!r}, expected {len(self)}")
            columns[name] = list(values)
        return self._copy(columns)

    def remove_columns(self, column_names) -> "Dataset":
        if isinstance(column_names, str):
            column_names = [column_names]
        missing = [c for c in column_names if c not in self._columns]
        if missing:
            raise ValueError(f"columns {missing} not in the dataset")
        return self._copy({k: v for k, v in self._columns.items() if k not in column_names})

    def rename_column(self, original_column_name: str, new_column_name: str) -> "Dataset":
        if original_column_name not in self._columns:
            raise ValueError(f"column {original_column_name!r} not in the dataset")
        return self._copy(
            {(new_column_name if k == original_column_name else k): v for k, v in self._columns.items()}
        )

    def set_format(self, type=None, **_kwargs) -> None:  # noqa: A002 - mirrors datasets' signature
        if type not in (None, "torch"):
            raise ValueError(f"stub only supports set_format('torch'), got {type!r}")
        self._format = type


class IterableDataset(torch.utils.data.IterableDataset):
    """Placeholder so ``from datasets import IterableDataset`` works; never instantiated."""


class DatasetDict(dict):
    def map(self, function, batched: bool = False, **kwargs) -> "DatasetDict":
        return DatasetDict({k: v.map(function, batched=batched, **kwargs) for k, v in self.items()})

    def remove_columns(self, column_names) -> "DatasetDict":
        return DatasetDict({k: v.remove_columns(column_names) for k, v in self.items()})

    def rename_column(self, original_column_name: str, new_column_name: str) -> "DatasetDict":
        return DatasetDict({k: v.rename_column(original_column_name, new_column_name) for k, v in self.items()})

    def set_format(self, type=None, **kwargs) -> None:  # noqa: A002
        for ds in self.values():
            ds.set_format(type, **kwargs)


def _make_split(name: str, n: int) -> Dataset:
    texts, labels = [], []
    for i in range(n):
        word = _WORDS[(i * 7 + len(name)) % len(_WORDS)]
        labels.append(_WORDS.index(word) % 2)
        texts.append(f"{word} {name} review {i}")
    return Dataset({"label": labels, "text": texts})


def load_dataset(path: str, *args, **kwargs) -> DatasetDict:
    """Return the same tiny synthetic DatasetDict whatever ``path`` is.

    Seeds torch's global RNG (the scripts under test do no seeding and call
    this before building ``DataLoader(shuffle=True)``), so the shuffle order
    is reproducible across runs and processes.
    """
    splits = DatasetDict({split: _make_split(split, n) for split, n in SPLIT_SIZES.items()})
    torch.manual_seed(0)
    return splits

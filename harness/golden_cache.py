"""Goldens and baselines kept on disk, so a second sweep over the same cases does not recompute them.

A stored pair is found again only under the same key: the op's declaration (under the case's
option: its references, inputs and states), every
field of the case (which with the seed determines the inputs), the run options, and a fingerprint
of the code that draws the inputs and computes the references. Changing any of them misses.

Float64 goldens of long cases are large (one B=2, T=43884, H=4, K=V=128 gla case: over 2 GB), so
the store keeps at most `limit_bytes` (default $HARNESS_GOLDEN_CACHE_GB, else 16 GiB) and drops
the least recently used entries beyond it. An entry is stored only where reading it back would be
faster than computing it again (`worth_storing`): a GPU can compute a long golden faster than
its gigabytes are written, and a sweep wrote one at every case.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
FINGERPRINTED = ["harness/inputs.py", "harness/execution.py", "harness/goldens.py", "harness/packing.py",
                 "harness/cases.py", "harness/declaration.py", "references"]


def default_dir() -> Path:
    """$HARNESS_GOLDEN_CACHE, else ~/.cache/fla-harness/goldens."""
    env = os.environ.get("HARNESS_GOLDEN_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "fla-harness" / "goldens"


# How fast an entry is written (and read back: 4.5 s either way for 1.3 GiB here), until this
# process has timed a save of MEASURED_FROM_BYTES or more (smaller ones time the file's overhead).
PRIOR_BYTES_PER_S = 2**29
MEASURED_FROM_BYTES = 2**24


def stored_bytes(*tensor_dicts) -> int:
    """The bytes the tensors of `tensor_dicts` (None for a dict or a tensor: nothing) hold."""
    return sum(t.numel() * t.element_size() for d in tensor_dicts if d for t in d.values() if t is not None)


def default_limit_bytes() -> int:
    return int(float(os.environ.get("HARNESS_GOLDEN_CACHE_GB", "16")) * 2**30)


def code_fingerprint() -> str:
    """sha256 over the sources that determine inputs, goldens and baselines."""
    digest = hashlib.sha256()
    for entry in FINGERPRINTED:
        path = ROOT / entry
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(str(file.relative_to(ROOT)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


class GoldenCache:
    """get(spec, case, options) -> (golden, baseline) or None; put(...) stores them (atomically).
    An entry stored with its baseline alone (its golden was given: a chain of segments) has
    golden None."""

    def __init__(self, directory: Path, limit_bytes: int | None = None):
        self.directory = Path(directory)
        self.limit_bytes = default_limit_bytes() if limit_bytes is None else limit_bytes
        self.fingerprint = code_fingerprint()
        self.hits = self.misses = self.skipped = 0
        self.bytes_per_s = PRIOR_BYTES_PER_S

    def key(self, spec, case, options: dict) -> str:
        fields = {"op": repr(spec.under(case.option)),
                  "case": case.as_dict(), "options": {k: list(v) if isinstance(v, tuple) else v
                                                      for k, v in sorted(options.items())},
                  "code": self.fingerprint}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.pt"

    def get(self, spec, case, options: dict, device, golden_given: bool = False):
        """The stored pair, or None (also for an entry without its golden, unless `golden_given`).
        Several sweeps share the store (the workers of one, the gate's op sweeps): an entry
        another process evicts between the look and the read is a miss, and so is one that cannot
        be read whole (then it is removed)."""
        path = self._path(self.key(spec, case, options))
        try:
            stored = torch.load(path, map_location=device)
            os.utime(path)  # recently used: evicted last (never re-creates an evicted entry)
        except FileNotFoundError:
            stored = None
        except (EOFError, RuntimeError, pickle.UnpicklingError):
            path.unlink(missing_ok=True)
            stored = None
        if stored is None or (stored["golden"] is None and not golden_given):
            self.misses += 1
            return None
        self.hits += 1
        return stored["golden"], stored["baseline"]

    def worth_storing(self, nbytes: int, seconds: float | None) -> bool:
        """Whether an entry of `nbytes` that took `seconds` (None: unknown) to compute is worth
        storing: reading it back, about as slow as writing it, must be faster than computing it."""
        return seconds is None or nbytes / self.bytes_per_s < seconds

    def put(self, spec, case, options: dict, golden: dict | None, baseline: dict,
            seconds: float | None = None) -> bool:
        """Store the pair (golden None: the baseline alone) computed in `seconds`, if worth it."""
        nbytes = stored_bytes(golden, baseline)
        if not self.worth_storing(nbytes, seconds):
            self.skipped += 1
            return False
        start = time.perf_counter()
        path = self._path(self.key(spec, case, options))
        path.parent.mkdir(parents=True, exist_ok=True)
        cpu = {name: d and {k: None if v is None else v.detach().cpu() for k, v in d.items()}
               for name, d in (("golden", golden), ("baseline", baseline))}
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(cpu, tmp)
        tmp.replace(path)
        if nbytes >= MEASURED_FROM_BYTES:
            self.bytes_per_s = nbytes / max(time.perf_counter() - start, 1e-6)
        self._evict()
        return True

    def _evict(self):
        """Drop the least recently used entries until the store fits its limit (entries another
        process removes meanwhile are passed over)."""
        entries = []
        for path in self.directory.rglob("*.pt"):
            try:
                info = path.stat()
            except FileNotFoundError:
                continue
            entries.append((info.st_mtime, info.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries, key=lambda e: e[0]):
            if total <= self.limit_bytes:
                break
            total -= size
            path.unlink(missing_ok=True)

"""Every rank starts from one random state (Python's, NumPy's, torch's), the same for all ranks of a job and new for
each job: randomness the notebook leaves unseeded (a shuffle, a sample, a split) gives every rank the same data.

A generator or a reseed that would draw its seed from the OS's entropy draws it instead from one stream seeded by the
job, the n-th draw the same on every rank: `random.Random()` and `random.seed()` without a seed, NumPy's
`RandomState()`, `default_rng()`, `SeedSequence()`, a bit generator made without a seed and `numpy.random.seed()`
(all of them take their entropy from one function of numpy.random.bit_generator), and `torch.Generator().seed()` and
`torch.seed()`. What a library made before the notebook's first line keeps its own (tempfile's names). A seed the
notebook gives is used as it is. NBDDP_SAME_RANDOM=0 leaves each rank's own."""
import hashlib
import importlib.util
import os
import random

import torch

from .group import NBDDP_AT_START, NBDDP_WORLD_SIZE

NBDDP_ENTROPY = random.Random(0)  # the job's stream of seeds for what would ask the OS (seeded at the start)


def nbddp_entropy_bits(bits):
    return NBDDP_ENTROPY.getrandbits(bits)


class _NbddpRandom(random.Random):
    def seed(self, a=None, version=2):
        super().seed(nbddp_entropy_bits(64) if a is None else a, version)


_NbddpRandom.__module__, _NbddpRandom.__qualname__ = "random", "Random"  # pickled as random.Random


_NBDDP_RESEED = random.seed  # the module's own generator's


def _nbddp_reseed(a=None, version=2):
    _NBDDP_RESEED(nbddp_entropy_bits(64) if a is None else a, version)


class _NbddpGenerator(torch.Generator):
    def seed(self):
        seed = nbddp_entropy_bits(63)
        self.manual_seed(seed)
        return seed


_NbddpGenerator.__module__, _NbddpGenerator.__qualname__ = "torch", "Generator"


def _nbddp_torch_seed():
    seed = nbddp_entropy_bits(63)
    torch.manual_seed(seed)
    return seed


def nbddp_same_random_state():
    if NBDDP_WORLD_SIZE == 1 or os.environ.get("NBDDP_SAME_RANDOM", "1").strip().lower() in ("0", "false", "no", "off"):
        return
    job = "|".join(os.environ.get(name, "") for name in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"))
    seed = int(hashlib.sha256(job.encode()).hexdigest()[:8], 16)
    NBDDP_ENTROPY.seed(seed + 1)
    random.seed(seed)
    random.Random, random.seed = _NbddpRandom, _nbddp_reseed
    torch.manual_seed(seed)
    torch.Generator = _NbddpGenerator
    torch.seed = torch.random.seed = _nbddp_torch_seed
    if importlib.util.find_spec("numpy") is not None:
        import numpy.random
        import numpy.random.bit_generator

        numpy.random.seed(seed)
        numpy.random.bit_generator.randbits = nbddp_entropy_bits  # every NumPy seed drawn from the OS


NBDDP_AT_START.append(nbddp_same_random_state)

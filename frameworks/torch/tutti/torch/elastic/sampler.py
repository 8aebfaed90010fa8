"""ElasticSampler: a dataset partitioned over the current world that resumes mid-epoch."""

import math
import random

import torch

from tutti.torch import basics


class ElasticSampler(torch.utils.data.Sampler):
    """Like DistributedSampler, over the world of the current generation: after a reset
    (workers added or removed) the samples of the epoch not processed yet are partitioned
    over the new world, so that none is skipped and none repeated.

    The processed samples are counted in the epoch's shuffled order: call record_batch()
    after each batch every rank processed, keep the sampler in the TorchState (its count is
    committed and synced with the rest), and call set_epoch() at the end of an epoch.
    Rank r takes every size-th remaining sample from r on; the remaining samples are padded
    by wrapping around to a multiple of the world size, as DistributedSampler does, so an
    epoch's last batch may repeat up to size-1 samples when they do not divide evenly.
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0  # samples of this epoch's order processed by the whole world
        self.reset()

    def set_epoch(self, epoch):
        """Starts `epoch` with no sample processed (call it at the end of the previous one)."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Records that every rank processed one more batch of `batch_size` samples."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices):
        """Records `len(indices)` samples of this rank's partition as processed by every
        rank (the world steps together)."""
        self.processed_num += len(indices) * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self, rank=None, num_replicas=None):
        """Repartitions the remaining samples over the current world (or the given one)."""
        initialized = basics._C.is_initialized()
        self.num_replicas = num_replicas or (basics._C.size() if initialized else 1)
        self.rank = rank if rank is not None else (basics._C.rank() if initialized else 0)
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[min(self.processed_num, len(order)):]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        padded = list(self.remaining_indices)
        while padded and len(padded) < self.total_size:  # at most num_replicas - 1 rounds
            padded += padded[:self.total_size - len(padded)]
        return iter(padded[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples

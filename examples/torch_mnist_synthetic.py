#!/usr/bin/env python3
"""Data-parallel training of a small CNN on synthetic MNIST-like data with tutti.torch.

Written against the horovod.torch API: only the import line differs.

    tuttirun -np 2 python3 examples/torch_mnist_synthetic.py
    mpirun -np 2 python3 examples/torch_mnist_synthetic.py

Each rank trains on its own shard; gradients are averaged by hvd.DistributedOptimizer
while backward runs. Rank 0 prints the loss per epoch. At the end every rank checks that
all ranks hold identical parameters and that the loss went down; the exit status is
non-zero otherwise.
"""

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import tutti.torch as hvd


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--samples", type=int, default=2048, help="whole data set")
    parser.add_argument("--lr", type=float, default=0.02, help="scaled by the world size")
    parser.add_argument("--fp16-allreduce", action="store_true",
                        help="compress gradients to float16 for the allreduce")
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, kernel_size=5, stride=2)  # 28x28 -> 12x12
        self.fc1 = nn.Linear(8 * 6 * 6, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)  # -> 6x6
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def synthetic_shard(samples, seed, rank, size):
    """Ten noisy class prototypes (the same on every rank); this rank's rows of the set."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(10, 1, 28, 28, generator=g)
    labels = torch.randint(0, 10, (samples,), generator=g)
    images = prototypes[labels] + 3.0 * torch.randn(samples, 1, 28, 28, generator=g)
    return images[rank::size], labels[rank::size]


def average_metric(value, name):
    return hvd.allreduce(torch.tensor([value]), name=name).item()


def parameters_identical(model):
    """Every rank compares the gathered copies of every parameter."""
    ok = True
    for name, p in model.named_parameters():
        gathered = hvd.allgather(p.detach().unsqueeze(0), name="check." + name)
        if not torch.equal(gathered.min(0).values, gathered.max(0).values):
            print("rank %d: parameter %s differs across ranks" % (hvd.rank(), name),
                  file=sys.stderr)
            ok = False
    return ok


def main():
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed + hvd.rank())  # different init per rank: broadcast fixes it
    torch.set_num_threads(1)

    images, labels = synthetic_shard(args.samples, args.seed, hvd.rank(), hvd.size())
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Ranks may hold a different number of rows: every rank runs the same number of steps.
    steps = min(hvd.allgather_object(len(labels), name="shard_sizes")) // args.batch_size
    losses = []
    for epoch in range(args.epochs):
        model.train()
        total = 0.0
        correct = 0
        for step in range(steps):
            lo, hi = step * args.batch_size, (step + 1) * args.batch_size
            optimizer.zero_grad()
            output = model(images[lo:hi])
            loss = F.cross_entropy(output, labels[lo:hi])
            loss.backward()
            optimizer.step()
            total += loss.item()
            correct += (output.argmax(1) == labels[lo:hi]).sum().item()
        loss = average_metric(total / steps, "epoch_loss")
        accuracy = average_metric(correct / (steps * args.batch_size), "epoch_accuracy")
        losses.append(loss)
        if hvd.rank() == 0:
            print("epoch %d: loss %.4f accuracy %.3f (%d ranks, %d steps of %d)"
                  % (epoch, loss, accuracy, hvd.size(), steps, args.batch_size), flush=True)

    ok = parameters_identical(model)
    if len(losses) > 1 and not losses[-1] < losses[0]:
        print("rank %d: loss did not go down: %s" % (hvd.rank(), losses), file=sys.stderr)
        ok = False
    all_ok = hvd.allreduce(torch.tensor([1 if ok else 0]), name="all_ok", op=hvd.Min).item()
    if hvd.rank() == 0:
        print("parameters identical on all ranks: %s" % ("yes" if all_ok else "NO"), flush=True)
    hvd.shutdown()
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())

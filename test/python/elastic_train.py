"""A horovod.torch elastic training script (the pattern of Horovod's docs: @hvd.elastic.run,
TorchState, state.commit(), ElasticSampler) run by test_torch_elastic.py under tuttirun's
elastic flags, with hooks to make faults happen at a chosen step.

Every rank appends JSON lines to --log; rank 0 records each step's world size, each commit
and each restore, from which the test rebuilds the schedule of world sizes that produced the
final model (replay()). Each worker writes its final parameters to --out/<worker>.pt.
"""
import argparse
import json
import os
import signal
import time

import torch

N_SAMPLES, BATCH, FEATURES = 72, 3, 4


def make_data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N_SAMPLES, FEATURES, generator=g, dtype=torch.float64)
    y = x @ torch.arange(1.0, FEATURES + 1, dtype=torch.float64).unsqueeze(1) + 0.5
    return torch.utils.data.TensorDataset(x, y)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 1).double()


def batch_grads(model, x, y):
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def replay(schedule, epochs, lr, commit_every):
    """The same training without Tutti: each step averages the gradients of the ranks of a
    world of schedule[i] ranks, partitioned by the same ElasticSampler arithmetic."""
    from tutti.torch.elastic.sampler import ElasticSampler
    data = make_data()
    model = make_model()
    sampler = ElasticSampler(data, shuffle=True, seed=1)
    steps = iter(schedule)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        while sampler.processed_num < N_SAMPLES:
            size = next(steps)
            sampler.reset(rank=0, num_replicas=size)
            parts = []
            for r in range(size):
                sampler.reset(rank=r, num_replicas=size)
                parts.append(list(iter(sampler))[:BATCH])
            grads = None
            for indices in parts:
                x, y = data[indices]
                g = batch_grads(model, x, y)
                grads = g if grads is None else [a + b for a, b in zip(grads, g)]
            with torch.no_grad():
                for p, g in zip(model.parameters(), grads):
                    p -= lr * g / size
            sampler.num_replicas = size
            sampler.record_batch(0, BATCH)
    return model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--commit-every", type=int, default=2)
    p.add_argument("--log", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--kill-rank", type=int, default=-1, help="this rank of generation 0 ...")
    p.add_argument("--kill-at", type=int, default=-1, help="... SIGKILLs itself at this step")
    p.add_argument("--grow-file", help="rank 0 of generation 0 writes --grow-hosts here ...")
    p.add_argument("--grow-hosts")
    p.add_argument("--grow-at", type=int, default=-1, help="... at this step")
    args = p.parse_args()

    import tutti.torch as hvd
    hvd.init()
    worker = os.environ.get("TUTTI_ELASTIC_WORKER", "w?")
    log = open(args.log, "a")

    def note(**record):
        record.update(worker=worker, gen=hvd._C.elastic_generation())
        log.write(json.dumps(record) + "\n")
        log.flush()

    data = make_data()
    model = make_model()
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=1)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
    state.register_reset_callbacks([lambda: note(event="reset", size=hvd.size())])

    @hvd.elastic.run
    def train(state):
        note(event="start", rank=hvd.rank(), size=hvd.size(), batch=state.batch)
        while state.epoch < args.epochs:
            for x, y in loader:
                first_generation = hvd._C.elastic_generation() == 0
                if first_generation and hvd.rank() == args.kill_rank and \
                        state.batch == args.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                if first_generation and hvd.rank() == 0 and state.batch == args.grow_at:
                    with open(args.grow_file + ".tmp", "w") as f:
                        f.write(args.grow_hosts + "\n")
                    os.replace(args.grow_file + ".tmp", args.grow_file)
                    deadline = time.monotonic() + 30
                    while not hvd._C.hosts_updated() and time.monotonic() < deadline:
                        time.sleep(0.1)
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
                sampler.record_batch(0, BATCH)
                state.batch += 1
                if hvd.rank() == 0:
                    note(event="step", size=hvd.size())
                if state.batch % args.commit_every == 0:
                    if hvd.rank() == 0:
                        note(event="commit")
                    state.commit()
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            if hvd.rank() == 0:
                note(event="commit")
            state.commit()

    train(state)
    note(event="done", rank=hvd.rank(), size=hvd.size())
    torch.save([p.detach() for p in model.parameters()],
               os.path.join(args.out, worker + ".pt"))
    hvd.shutdown()


if __name__ == "__main__":
    main()

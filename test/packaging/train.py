"""A 2-rank job for the packaging test: tutti.torch from the pip-installed wheel, in a venv
with pip's torch and no numpy. An allreduce and an allgather, then a few training steps the
way a Horovod script starts: broadcast_parameters and broadcast_optimizer_state from rank 0
(each rank began with its own weights and learning rate), DistributedOptimizer over each rank's
own data. Checked on every rank; exits non-zero on any mismatch."""
import sys

import torch
import tutti.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
if size != 2:
    sys.exit("rank %d: expected 2 ranks, got %d" % (rank, size))
summed = hvd.allreduce(torch.full((4,), float(rank + 1)), op=hvd.Sum, name="pkg.sum")
if not torch.equal(summed, torch.full((4,), 3.0)):
    sys.exit("rank %d: allreduce pkg.sum expected [3, 3, 3, 3], got %s" % (rank, summed.tolist()))
gathered = hvd.allgather(torch.tensor([rank]), name="pkg.gather")
if gathered.tolist() != [0, 1]:
    sys.exit("rank %d: allgather pkg.gather expected [0, 1], got %s" % (rank, gathered.tolist()))

torch.manual_seed(rank)  # different initial weights on each rank
model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * (rank + 1), momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
lr = optimizer.param_groups[0]["lr"]
if lr != 0.01:
    sys.exit("rank %d: broadcast_optimizer_state: expected rank 0's lr 0.01, got %r" % (rank, lr))
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
data = torch.randn(16, 8)  # each rank's own batch
target = data.sum(dim=1, keepdim=True)
for step in range(5):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(data), target)
    loss.backward()
    optimizer.step()
# Averaged gradients from equal starting points: the replicas stay identical.
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
replicas = hvd.allgather(flat.unsqueeze(0), name="pkg.params")
if not torch.equal(replicas[0], replicas[1]):
    sys.exit("rank %d: parameters differ between the ranks after training (max diff %g)"
             % (rank, (replicas[0] - replicas[1]).abs().max().item()))
print("rank %d of %d: ok, loss %.4f (torch %s, tutti from %s)"
      % (rank, size, loss.item(), torch.__version__, hvd.__file__))
hvd.shutdown()

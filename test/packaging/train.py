"""A 2-rank job for the packaging test: tutti.torch from the pip-installed wheel, an
allreduce and an allgather, checked on every rank. Exits non-zero on any mismatch."""
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
print("rank %d of %d: ok (torch %s, tutti from %s)" % (rank, size, torch.__version__,
                                                       hvd.__file__))
hvd.shutdown()

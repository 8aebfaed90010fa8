"""PyTorch's own torch.distributed test-suite on the backend "tutti" (or "gloo", to compare).

The torch wheel ships torch/testing/_internal/distributed/distributed_test.py: the
DistributedTest._DistTestBase mixin that PyTorch's CI runs for gloo, nccl, mpi and ucc, each
test in a fresh set of WORLD_SIZE processes started with only INIT_METHOD (a file:// store)
and WORLD_SIZE. This driver runs it with BACKEND=tutti (registered by importing tutti.torch,
and added to DistTestCases.backend_feature where Tutti has the feature: "ddp") or with
BACKEND=gloo, on the same machine (docs/pytorch.md, "torch.distributed backend"):

    PYTHONPATH=build/python-torch2 BACKEND=tutti WORLD_SIZE=2 \\
      .venv-torch/bin/python -m pytest -q -p no:cacheprovider \\
      test/python/pytorch_distributed_suite.py [-k all_reduce]

TEMP_DIR defaults to a fresh temporary directory. Not collected by the per-rank suites (the
name does not start with test_).

TUTTI_SUITE_GATES=gloo (with BACKEND=tutti) runs tutti under gloo's gates: the suite decides
which tests to skip from the backend's name when it is imported, so many tests it keeps for
gloo (or for "mpi, nccl and gloo") are skipped on any other backend, even where Tutti has the
feature (Work.get_future, all_reduce_coalesced, the object collectives). With this setting
the suite is imported as if for gloo and the tests then run on tutti; those that check gloo's
own words or features (point-to-point, sparse tensors, gloo's timeouts) fail, as expected.
"""

import os
import sys
import tempfile

os.environ.setdefault("BACKEND", "tutti")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="tutti-pytorch-suite-")

import torch  # noqa: E402,F401

import tutti.torch  # noqa: E402,F401  registers the backend "tutti"

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# The features of distributed_test.py Tutti has: DDP and "subgroup" (process groups of some
# ranks). Not "gpu"/"cuda" (CPU tensors only) or "plugin".
TUTTI_FEATURES = ("ddp", "subgroup")
if os.environ["BACKEND"] == "tutti":
    for feature in TUTTI_FEATURES:
        DistTestCases.backend_feature[feature].add("tutti")

from torch.testing._internal.common_utils import run_tests  # noqa: E402

AS_GLOO = os.environ["BACKEND"] == "tutti" and os.environ.get("TUTTI_SUITE_GATES") == "gloo"
if AS_GLOO:  # the gates (decorators) read the name at import; the tests read it at run time
    os.environ["BACKEND"] = "gloo"
from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)
if AS_GLOO:
    os.environ["BACKEND"] = "tutti"
    distributed_test.BACKEND = "tutti"


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    sys.exit(run_tests())

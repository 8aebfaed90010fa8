"""Tutti: collective communication for data-parallel training.

Framework adapters live in subpackages; `import tutti.torch as hvd` is a drop-in for
`import horovod.torch as hvd`.
"""

__version__ = "0.3.0"

from tutti.runner import run  # noqa: E402,F401  (horovod.run's equivalent; no torch needed)

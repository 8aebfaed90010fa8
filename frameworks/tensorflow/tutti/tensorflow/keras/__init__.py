"""tutti.tensorflow.keras: Horovod's import path (horovod.tensorflow.keras) for tutti.keras."""

from tutti.keras import *  # noqa: F401,F403
from tutti.keras import callbacks  # noqa: F401

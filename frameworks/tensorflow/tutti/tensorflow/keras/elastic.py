"""tutti.tensorflow.keras.elastic: Horovod's import path (horovod.tensorflow.keras.elastic)
for tutti.keras.elastic."""

from tutti.keras.elastic import *  # noqa: F401,F403
from tutti.keras.elastic import __all__  # noqa: F401

"""tutti.tensorflow.keras.callbacks: Horovod's import path for tutti.keras.callbacks."""

from tutti.keras.callbacks import *  # noqa: F401,F403

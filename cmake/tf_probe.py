"""Prints, one `key=value` line each (lists joined by "|"), what CMake needs to build the
tutti.tensorflow op library against the TensorFlow this interpreter imports: its version and
tf.sysconfig's compile and link flags. Exits 1 with the import error on stderr when TensorFlow
cannot be imported. Run by cmake/TuttiTensorFlow.cmake; standard library + tensorflow only."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # no start-up chatter in CMake's output
try:
    import tensorflow as tf
except Exception as e:  # noqa: BLE001 - any failure means "no usable TensorFlow here"
    print("%s: %s" % (type(e).__name__, e), file=sys.stderr)
    sys.exit(1)

print("version=" + tf.__version__)
print("compile_flags=" + "|".join(tf.sysconfig.get_compile_flags()))
print("link_flags=" + "|".join(tf.sysconfig.get_link_flags()))
print("cuda=%d" % int(bool(tf.sysconfig.get_build_info().get("is_cuda_build", False))))

# cmake -DSRC=<tree> -DWORK=<scratch dir> -P forced_missing_tf.cmake
# TUTTI_WITH_TENSORFLOW=1 with no interpreter that imports TensorFlow stops the configure with
# a message naming what is missing.
set(ENV{TUTTI_WITH_TENSORFLOW} 1)
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC} -B ${WORK} -DTUTTI_BUILD_TESTS=OFF
                        -DTUTTI_WITH_NCCL=OFF -DTUTTI_WITH_TORCH=OFF
                        "-DTUTTI_TENSORFLOW_PYTHONS=${WORK}/no-such-python"
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 120)
file(REMOVE_RECURSE ${WORK})
string(REGEX REPLACE "[ \n]+" " " folded "${out}${err}")
set(expect "TUTTI_WITH_TENSORFLOW=1 asks for the TensorFlow and Keras adapters tutti.tensorflow, tutti.keras, but no usable TensorFlow: ${WORK}/no-such-python does not exist")
if(rc EQUAL 0)
  message(FATAL_ERROR "TUTTI_WITH_TENSORFLOW=1 without TensorFlow configured fine:\n${out}${err}")
endif()
if(NOT folded MATCHES "${expect}")
  message(FATAL_ERROR "expected the configure to say\n  ${expect}\ngot:\n${err}")
endif()
message(STATUS "TUTTI_WITH_TENSORFLOW=1 without it fails as expected: ${CMAKE_MATCH_0}")

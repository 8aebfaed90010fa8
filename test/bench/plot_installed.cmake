# Installs bench/'s rules (tutti-bench and tutti-bench-plot) into a scratch prefix, writes a
# sweep's JSON with the built tutti-bench (the installed one would load the prefix's
# libtutti), and runs the installed plot script's --table
# under a Python without site-packages (no matplotlib): a table, exit 0; -o there fails with
# a message naming matplotlib, not a traceback.
# -DBUILD_BENCH_DIR (the build tree's bench/) -DBENCH (the built tutti-bench) -DPREFIX -DPYTHON
file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND ${CMAKE_COMMAND} -DCMAKE_INSTALL_PREFIX=${PREFIX}
                        -P ${BUILD_BENCH_DIR}/cmake_install.cmake
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "installing bench/ into ${PREFIX} failed (${rc}):\n${out}${err}")
endif()
file(GLOB_RECURSE plot "${PREFIX}/*/tutti-bench-plot")
file(GLOB_RECURSE bench "${PREFIX}/*/tutti-bench")
if(NOT plot OR NOT bench)
  message(FATAL_ERROR "expected tutti-bench and tutti-bench-plot under ${PREFIX}, got:\n${out}")
endif()
execute_process(COMMAND ${BENCH} allreduce -b 4 -e 1K -f 16 -n 2 -w 1 -d all --json ${PREFIX}/run.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tutti-bench exited with '${rc}':\n${out}${err}")
endif()
execute_process(COMMAND ${PYTHON} -I -S ${plot} --table ${PREFIX}/run.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
message("${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "\\| size \\| oop time \\(us\\)" OR NOT out MATCHES "\n\\| 64 \\|"
   OR NOT out MATCHES "#### allreduce loopback np=1 half sum" OR NOT out MATCHES "np=1 int8 sum")
  message(FATAL_ERROR "tutti-bench-plot --table without site-packages: exit '${rc}', "
                      "expected a table per type (-d all) with a row for 64 B:\n${out}${err}")
endif()
execute_process(COMMAND ${PYTHON} -I -S ${plot} -o ${PREFIX}/x.png ${PREFIX}/run.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 2 OR NOT err MATCHES "needs matplotlib" OR err MATCHES "Traceback")
  message(FATAL_ERROR "tutti-bench-plot -o without matplotlib: exit '${rc}', expected 2 and "
                      "a message naming matplotlib:\n${err}")
endif()
file(REMOVE_RECURSE "${PREFIX}")

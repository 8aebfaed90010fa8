/* Settings that every rank must give alike (docs/env_vars.md, "Settings across ranks"), in
 * real processes: the launcher gives each rank its own value (mpirun MPMD with -x, or
 * tuttirun through settings_wrapper.sh).
 *
 *   settings_driver VAR    the ranks were given different values of VAR: tutti_init must
 *                          fail on this rank with TUTTI_ERR_MISMATCH, naming VAR
 *   settings_driver -      the ranks agree: init succeeds and 60 names x 3 steps of
 *                          allreduce give the right sums
 * Prints "PASSED ..." and returns 0, or "FAILED ..." and returns 1. */
#include <tutti/tutti.h>

#include <stdio.h>
#include <string.h>

static int fail(const char* what, tutti_status_t status) {
  printf("settings_driver: FAILED: %s: status %d: %s\n", what, (int)status, tutti_last_error());
  fflush(stdout);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: settings_driver VAR|-\n");
    return 2;
  }
  const char* var = argv[1];
  tutti_status_t s = tutti_init();
  if (strcmp(var, "-") != 0) {
    if (s == TUTTI_OK) {
      fail("tutti_init succeeded though the ranks were given different values", s);
      tutti_shutdown();
      return 1;
    }
    if (s != TUTTI_ERR_MISMATCH || strstr(tutti_last_error(), var) == NULL ||
        strstr(tutti_last_error(), "set it the same on every rank") == NULL)
      return fail("tutti_init: expected TUTTI_ERR_MISMATCH naming the variable", s);
    printf("settings_driver: PASSED: %s\n", tutti_last_error());
    return 0;
  }
  if (s != TUTTI_OK) return fail("tutti_init", s);
  const int size = tutti_size();
  for (int step = 0; step < 3; ++step)
    for (int k = 0; k < 60; ++k) {
      char name[32];
      float v[3] = {1, (float)k, (float)step};
      tutti_handle_t h = 0;
      snprintf(name, sizeof(name), "t.%d", k);
      s = tutti_allreduce_async(name, v, v, 3, TUTTI_FLOAT32, TUTTI_SUM, 1.0, 1.0, &h);
      if (s == TUTTI_OK) s = tutti_wait(h, -1.0);
      if (s != TUTTI_OK) return fail(name, s);
      if (v[0] != (float)size || v[1] != (float)(k * size) || v[2] != (float)(step * size)) {
        printf("rank %d: FAILED: %s step %d: got %g %g %g\n", tutti_rank(), name, step, v[0],
               v[1], v[2]);
        return 1;
      }
    }
  printf("rank %d: PASSED\n", tutti_rank());
  tutti_shutdown();
  return 0;
}

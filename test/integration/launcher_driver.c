/* A job of the size the launcher gave, whatever the launcher (torchrun, hydra, mpirun):
 *
 *   launcher_driver N    tutti_init, then: the world has N ranks, this rank is the one the
 *                        launcher's RANK or PMI_RANK says (where set), and an allreduce of
 *                        rank + 1 over every rank gives N (N + 1) / 2
 *
 * Prints "launcher_driver: rank R of N: PASSED" and returns 0, or "... FAILED ..." and 1. */
#include <tutti/tutti.h>

#include <stdio.h>
#include <stdlib.h>

static int fail(const char* what, tutti_status_t status) {
  printf("launcher_driver: FAILED: %s: status %d: %s\n", what, (int)status, tutti_last_error());
  fflush(stdout);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: launcher_driver N\n");
    return 2;
  }
  const int want = atoi(argv[1]);
  tutti_status_t s = tutti_init();
  if (s != TUTTI_OK) return fail("tutti_init", s);
  const int rank = tutti_rank(), size = tutti_size();
  const char* given = getenv("RANK") ? getenv("RANK") : getenv("PMI_RANK");
  if (size != want || (given != NULL && atoi(given) != rank)) {
    printf("launcher_driver: FAILED: rank %d of %d, expected a world of %d (launcher's rank %s)\n",
           rank, size, want, given ? given : "unset");
    tutti_shutdown();
    return 1;
  }
  double v = rank + 1.0;
  tutti_handle_t h = 0;
  s = tutti_allreduce_async("launcher.sum", &v, &v, 1, TUTTI_FLOAT64, TUTTI_SUM, 1.0, 1.0, &h);
  if (s == TUTTI_OK) s = tutti_wait(h, 60.0);
  if (s != TUTTI_OK) return fail("allreduce", s);
  if (v != want * (want + 1) / 2.0) {
    printf("launcher_driver: FAILED: rank %d: sum %g, expected %g\n", rank, v,
           want * (want + 1) / 2.0);
    return 1;
  }
  printf("launcher_driver: rank %d of %d: PASSED\n", rank, size);
  fflush(stdout);
  tutti_shutdown();
  return 0;
}

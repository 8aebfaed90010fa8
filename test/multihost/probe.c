/* A rank of the multi-host tests, through the public C API only.
 *   probe topology       prints "TOPO host rank size local_rank local_size cross_rank cross_size"
 *   probe loop SECONDS   allreduces 64 KiB (checking each sum) until SECONDS have passed;
 *                        prints "LOOPING" once the first allreduce is done, on every rank.
 *   probe env NAME       prints "ENV NAME=value" (or "ENV NAME unset") after init.
 * Exits 0 after tutti_shutdown; on a failure prints the error and exits 1. */
#include <tutti/tutti.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int fail(const char* what) {
  fprintf(stderr, "probe rank %d: %s failed: %s\n", tutti_rank(), what, tutti_last_error());
  fflush(stderr);
  return 1;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int loop(double seconds) {
  enum { kCount = 16384 };
  static float buf[kCount];
  double end = now() + seconds;
  int size = tutti_size();
  for (long step = 0; now() < end; ++step) {
    for (int i = 0; i < kCount; ++i) buf[i] = (float)(tutti_rank() + i % 7);
    tutti_handle_t h;
    if (tutti_allreduce_async("probe/grad", buf, buf, kCount, TUTTI_FLOAT32, TUTTI_SUM, 1.0,
                              1.0, &h) != TUTTI_OK)
      return fail("allreduce submit");
    if (tutti_wait(h, -1) != TUTTI_OK) return fail("allreduce");
    float want = (float)(size * (size - 1) / 2 + size * 3);  /* element 3: i % 7 == 3 */
    if (buf[3] != want) {
      fprintf(stderr, "probe rank %d: step %ld: got %g, expected %g\n", tutti_rank(), step,
              buf[3], want);
      return 1;
    }
    if (step == 0) {
      printf("LOOPING\n");
      fflush(stdout);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: probe topology | loop SECONDS | env NAME\n");
    return 2;
  }
  if (tutti_init() != TUTTI_OK) return fail("tutti_init");
  int rc = 0;
  if (!strcmp(argv[1], "topology")) {
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    printf("TOPO %s %d %d %d %d %d %d\n", host, tutti_rank(), tutti_size(), tutti_local_rank(),
           tutti_local_size(), tutti_cross_rank(), tutti_cross_size());
  } else if (!strcmp(argv[1], "loop") && argc > 2) {
    rc = loop(atof(argv[2]));
  } else if (!strcmp(argv[1], "env") && argc > 2) {
    const char* v = getenv(argv[2]);
    if (v)
      printf("ENV %s=%s\n", argv[2], v);
    else
      printf("ENV %s unset\n", argv[2]);
  } else {
    fprintf(stderr, "probe: unknown mode %s\n", argv[1]);
    rc = 2;
  }
  fflush(stdout);
  if (rc == 0 && tutti_shutdown() != TUTTI_OK) return fail("tutti_shutdown");
  return rc;
}

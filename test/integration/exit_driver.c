/* A Tutti job that ends in one chosen way, for test/integration/exit_test.py, which launches
 * it under mpirun, tuttirun --mpi and tuttirun --gloo and checks the exit code, the wall
 * time, the messages and that no process of the job is left.
 *
 *   exit_driver MODE [RANK [CODE]]
 *
 * Every rank first runs STEPS allreduces (of "step.K"), then, by MODE:
 *   clean       tutti_shutdown, return 0
 *   return      return 0 from main without tutti_shutdown
 *   exit        RANK calls exit(CODE) before step 3; the others go on until an op fails
 *   sigterm     RANK raises SIGTERM before step 3
 *   sigstop     RANK raises SIGSTOP before step 3 (its peers must time out)
 *   never       RANK never submits "never.arrives"; the others wait for it
 *   callback    a callback that calls tutti_shutdown (on the background thread)
 *   race        a thread submits while the main thread shuts down; every handle completes
 *   sleep       sleeps 60 s (for Ctrl-C to the launcher), then shuts down
 *   slow        rank RANK works CODE seconds alone (a checkpoint) before step 3; the others
 *               wait in the allreduce: fine under the collective deadline
 *   caught      rank RANK sleeps CODE seconds before step 3; the others' step 3 fails at the
 *               deadline; every rank prints the error it caught and returns 0 (a handled
 *               error is not a failed job, even when the peers reach their exit later)
 *   fail        rank RANK runs with TUTTI_TIMEOUT_SECONDS=1 and waits on "only.mine", which
 *               no other rank submits: its own runtime fails (the job deadline passes
 *               without a verdict) and it keeps running (sleeps 60 s); the others wait on
 *               "peer.fails" under the job's longer deadline and must fail soon after it
 * A rank whose op fails prints "rank R: FAILED: <status> <message>" and exits with 3. */
#include <tutti/tutti.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { kSteps = 40 };

static int g_rank = -1;

static void failed(const char* what, tutti_status_t status) {
  printf("rank %d: FAILED: %s: status %d: %s\n", g_rank, what, (int)status,
         tutti_last_error());
  fflush(stdout);
  exit(3);
}

/* One allreduce of 4 floats named `name`, waited on with the job's deadline. */
static void allreduce(const char* name) {
  float v[4] = {1, 1, 1, 1};
  tutti_handle_t h = 0;
  tutti_status_t s = tutti_allreduce_async(name, v, v, 4, TUTTI_FLOAT32, TUTTI_SUM, 1.0, 1.0, &h);
  if (s == TUTTI_OK) s = tutti_wait(h, -1.0);
  if (s != TUTTI_OK) failed(name, s);
}

static void steps(int from, int to) {
  char name[32];
  for (int k = from; k < to; ++k) {
    snprintf(name, sizeof(name), "step.%d", k);
    allreduce(name);
  }
}

static volatile int g_called_back = 0;
static void shutdownCallback(tutti_handle_t handle, tutti_status_t status, const char* message,
                             void* user_data) {
  (void)handle, (void)status, (void)message, (void)user_data;
  tutti_shutdown(); /* on the background thread: must not join itself */
  g_called_back = 1;
}

static void* submitter(void* arg) {
  int* unfinished = (int*)arg;
  char name[32];
  for (int k = 0; k < 200; ++k) {
    float v[4] = {1, 1, 1, 1};
    tutti_handle_t h = 0;
    snprintf(name, sizeof(name), "race.%d", k);
    if (tutti_allreduce_async(name, v, v, 4, TUTTI_FLOAT32, TUTTI_SUM, 1.0, 1.0, &h) !=
        TUTTI_OK)
      break; /* refused at submit: fine */
    if (tutti_wait(h, 30.0) == TUTTI_ERR_IN_PROGRESS) ++*unfinished;
  }
  return NULL;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* mode = argc > 1 ? argv[1] : "clean";
  const int who = argc > 2 ? atoi(argv[2]) : 1;
  const int code = argc > 3 ? atoi(argv[3]) : 7;
  /* mode fail: the rank's own deadline, set before init (its rank from the launcher) */
  const char* env_rank = getenv("OMPI_COMM_WORLD_RANK");
  if (!env_rank) env_rank = getenv("TUTTI_RANK");
  if (strcmp(mode, "fail") == 0 && env_rank && atoi(env_rank) == who)
    setenv("TUTTI_TIMEOUT_SECONDS", "1", 1);
  tutti_status_t s = tutti_init();
  if (s != TUTTI_OK) failed("init", s);
  g_rank = tutti_rank();
  steps(0, 3);
  if (strcmp(mode, "clean") == 0) {
    steps(3, kSteps);
    tutti_shutdown();
    return 0;
  }
  if (strcmp(mode, "return") == 0) {
    steps(3, kSteps);
    printf("rank %d: returning without tutti_shutdown\n", g_rank);
    return 0;
  }
  if (strcmp(mode, "exit") == 0 || strcmp(mode, "sigterm") == 0 ||
      strcmp(mode, "sigstop") == 0) {
    if (g_rank == who) {
      printf("rank %d: leaving by %s\n", g_rank, mode);
      if (mode[0] == 'e') exit(code);
      raise(mode[3] == 't' ? SIGTERM : SIGSTOP);
      return 0; /* after SIGCONT */
    }
    for (int round = 0; round < 1000; ++round) steps(3, kSteps); /* until an op fails */
    return 0;
  }
  if (strcmp(mode, "slow") == 0) {
    if (g_rank == who) sleep((unsigned)code);
    steps(3, kSteps);
    tutti_shutdown();
    printf("rank %d: slow step ok\n", g_rank);
    return 0;
  }
  if (strcmp(mode, "caught") == 0) {
    if (g_rank == who) sleep((unsigned)code);
    float v[4] = {1, 1, 1, 1};
    tutti_handle_t h = 0;
    s = tutti_allreduce_async("step.3", v, v, 4, TUTTI_FLOAT32, TUTTI_SUM, 1.0, 1.0, &h);
    if (s == TUTTI_OK) s = tutti_wait(h, -1.0);
    printf("rank %d: caught: status %d: %s\n", g_rank, (int)s, tutti_last_error());
    return 0;
  }
  if (strcmp(mode, "sleep") == 0) {
    printf("rank %d: sleeping\n", g_rank);
    sleep(60);
    tutti_shutdown();
    return 0;
  }
  if (strcmp(mode, "never") == 0) {
    if (g_rank == who) {
      sleep(60); /* the verdict stops its runtime too; the launcher or MPI ends it */
      return 0;
    }
    allreduce("never.arrives");
    return 0;
  }
  if (strcmp(mode, "fail") == 0) {
    if (g_rank == who) {
      float v[4] = {1, 1, 1, 1};
      tutti_handle_t h = 0;
      s = tutti_allreduce_async("only.mine", v, v, 4, TUTTI_FLOAT32, TUTTI_SUM, 1.0, 1.0, &h);
      if (s == TUTTI_OK) s = tutti_wait(h, -1.0);
      printf("rank %d: own runtime failed (status %d: %s); staying alive\n", g_rank, (int)s,
             tutti_last_error());
      fflush(stdout);
      sleep(60); /* the launcher ends it once a peer fails */
      return 0;
    }
    allreduce("peer.fails");
    return 0;
  }
  if (strcmp(mode, "callback") == 0) {
    float v[4] = {1, 1, 1, 1};
    tutti_tensor_t t;
    memset(&t, 0, sizeof(t));
    t.data = v;
    t.dtype = TUTTI_FLOAT32;
    t.ndim = 1;
    t.shape[0] = 4;
    tutti_op_options_t o;
    tutti_op_options_init(&o);
    o.callback = shutdownCallback;
    tutti_handle_t h = 0;
    s = tutti_allreduce_tensor_async("callback.shutdown", &t, &t, &o, &h);
    if (s != TUTTI_OK) failed("callback.shutdown", s);
    for (int i = 0; i < 1000 && !g_called_back; ++i) usleep(10000);
    if (!g_called_back) {
      printf("rank %d: FAILED: the callback never ran\n", g_rank);
      return 4;
    }
    if (tutti_is_initialized()) {
      printf("rank %d: FAILED: still initialized after a callback's shutdown\n", g_rank);
      return 4;
    }
    if (tutti_init() != TUTTI_OK) failed("init after a callback's shutdown", TUTTI_ERR_INTERNAL);
    steps(100, 103); /* a second life works */
    tutti_shutdown();
    printf("rank %d: callback shutdown ok\n", g_rank);
    return 0;
  }
  if (strcmp(mode, "race") == 0) {
    int unfinished = 0;
    pthread_t thread;
    pthread_create(&thread, NULL, submitter, &unfinished);
    usleep(2000 * (g_rank + 1));
    tutti_shutdown();
    pthread_join(thread, NULL);
    if (unfinished) {
      printf("rank %d: FAILED: %d handles never completed\n", g_rank, unfinished);
      return 4;
    }
    printf("rank %d: race ok\n", g_rank);
    return 0;
  }
  printf("unknown mode %s\n", mode);
  return 2;
}

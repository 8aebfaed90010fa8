/* Tutti C API. Every function is safe to call from any thread; none throws.
 * A failing call returns a non-zero tutti_status_t and tutti_last_error() returns the
 * detail for the calling thread. See docs/c_api.md. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* libtutti is built with hidden visibility: what this header declares is its public API,
 * exported; nothing else is. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define TUTTI_VERSION_MAJOR 0
#define TUTTI_VERSION_MINOR 3
#define TUTTI_MAX_DIMS 8
/* No tensor may exceed 2^56 bytes (more than any process can address); a larger count or
 * shape, or one whose bytes overflow, is TUTTI_ERR_INVALID_ARGUMENT. */
#define TUTTI_MAX_TENSOR_BYTES (((int64_t)1) << 56)

typedef enum tutti_status {
  TUTTI_OK = 0,
  TUTTI_ERR_INVALID_ARGUMENT = 1, /* bad input on this rank */
  TUTTI_ERR_MISMATCH = 2,         /* ranks disagree about a tensor (dtype, shape, op, ...)
                                     or a setting that must agree (docs/env_vars.md) */
  TUTTI_ERR_TIMEOUT = 3,          /* a deadline passed */
  TUTTI_ERR_ABORTED = 4,          /* the job was aborted (peer died, earlier fatal error) */
  TUTTI_ERR_NOT_INITIALIZED = 5,  /* tutti_init has not been called */
  TUTTI_ERR_BACKEND = 6,          /* the backend library reported an error */
  TUTTI_ERR_UNSUPPORTED = 7,      /* no backend supports this op/dtype/device */
  TUTTI_ERR_IN_PROGRESS = 8,      /* wait timed out: the operation is still running */
  TUTTI_ERR_JOINED = 9,           /* op not allowed while a rank has joined */
  TUTTI_ERR_DUPLICATE_NAME = 10,  /* a tensor of that name is already in flight here */
  TUTTI_ERR_INTERNAL = 11
} tutti_status_t;

typedef enum tutti_dtype {
  TUTTI_UINT8 = 0,
  TUTTI_INT8 = 1,
  TUTTI_UINT16 = 2,
  TUTTI_INT16 = 3,
  TUTTI_INT32 = 4,
  TUTTI_INT64 = 5,
  TUTTI_FLOAT16 = 6,
  TUTTI_BFLOAT16 = 7,
  TUTTI_FLOAT32 = 8,
  TUTTI_FLOAT64 = 9,
  TUTTI_BOOL = 10
} tutti_dtype_t;

typedef enum tutti_reduce_op {
  TUTTI_SUM = 0,
  TUTTI_AVERAGE = 1,
  TUTTI_MIN = 2,
  TUTTI_MAX = 3,
  TUTTI_PRODUCT = 4
} tutti_reduce_op_t;

/* 0 is never a valid handle. */
typedef int64_t tutti_handle_t;

/* Process set 0 is the global set of all ranks. */
#define TUTTI_GLOBAL_PROCESS_SET 0

/* Called on the background thread when an operation finishes. `message` is NULL on
 * success; it is only valid during the call. Must not block. */
typedef void (*tutti_callback_t)(tutti_handle_t handle, tutti_status_t status,
                                 const char* message, void* user_data);

/* The result of an operation whose output size depends on other ranks (allgather,
 * alltoall, reducescatter), or of join. Filled by tutti_wait_result. */
typedef struct tutti_result {
  size_t struct_size;   /* set to sizeof(tutti_result_t) before the call */
  void* data;           /* output, allocated by Tutti: release with tutti_free() */
  int64_t nbytes;       /* bytes in data */
  int ndim;             /* output shape */
  int64_t shape[TUTTI_MAX_DIMS];
  int64_t* recv_splits; /* alltoall: rows received from each rank (process-set order);
                           allocated by Tutti, release with tutti_free(); else NULL */
  int nsplits;
  int last_joined_rank; /* join: the last rank that joined; else -1 */
} tutti_result_t;

/* ---- lifecycle and topology ---- */
tutti_status_t tutti_init(void); /* settings from the environment (docs/env_vars.md) */
tutti_status_t tutti_shutdown(void);
int tutti_is_initialized(void);
int tutti_rank(void); /* -1 before init */
int tutti_size(void);
int tutti_local_rank(void);
int tutti_local_size(void);
int tutti_cross_rank(void);
int tutti_cross_size(void);
const char* tutti_last_error(void); /* detail of this thread's last failure; "" if none */
const char* tutti_status_string(tutti_status_t status);
const char* tutti_dtype_name(tutti_dtype_t dtype);
int64_t tutti_dtype_size(tutti_dtype_t dtype); /* bytes of one element; 0 if not a dtype */
int tutti_backend_built(const char* name); /* "mpi", "gloo", "nccl": 1 if compiled in */
const char* tutti_cpu_backend(void);       /* backend in use after init, e.g. "mpi" */

/* ---- started from the caller's key-value store (docs/c_api.md, "Init from a store") ---- */
/* A key-value rendezvous the caller already has (torch.distributed's TCPStore, FileStore or
 * PrefixStore, a file system, a database). Tutti only sets keys it made up itself and gets
 * them back, on every rank; it never deletes one. The callbacks return 0 on success. */
typedef struct tutti_store {
  size_t struct_size; /* sizeof(tutti_store_t) */
  /* Stores `nbytes` bytes under `key` (overwriting). Non-zero fails the caller's call. */
  int (*set)(const char* key, const void* value, size_t nbytes, void* user_data);
  /* Waits up to timeout_seconds for `key`: 0 with *value (malloc'd; Tutti free()s it) and
   * *nbytes when it is there, 1 when it is not there in time, anything else for an error. */
  int (*get)(const char* key, double timeout_seconds, void** value, size_t* nbytes,
             void* user_data);
  void* user_data;
  const char* description; /* for messages, e.g. "TCPStore 10.0.0.1:29500"; may be NULL */
} tutti_store_t;
/* tutti_init with the job's rank and size given, connecting through `store` instead of a
 * launcher's rendezvous: every rank of the job calls it with the same size, its own rank and
 * a store shared by all (the same store serves several inits one after another: each init
 * uses keys of its own). The settings still come from the environment (docs/env_vars.md); a
 * launcher's topology variables are not read. The CPU operations run over gloo (a world of
 * one: loopback); TUTTI_CPU_OPERATIONS=mpi is an error here. The store is copied; Tutti calls
 * its functions during this call, on the calling thread, and for process sets added later
 * on its background thread, so they must stay valid (and thread-safe) until tutti_shutdown
 * returns. TUTTI_ERR_TIMEOUT names the key when the other ranks do not arrive within
 * TUTTI_START_TIMEOUT_SECONDS. */
tutti_status_t tutti_init_with_store(int rank, int size, const tutti_store_t* store);

/* ---- elastic jobs (docs/elastic.md) ---- */
/* 1 when `status` is a failure this process recovers from in an elastic job: the job failed
 * under it (TUTTI_ERR_ABORTED, _BACKEND or _TIMEOUT: a peer died or left, a connection or a
 * deadline failed); restore the last committed state, tutti_shutdown(), tutti_init() (which
 * joins the launcher's next generation) and sync. 0 otherwise, and always outside an elastic
 * job. */
int tutti_status_recoverable(tutti_status_t status);
/* *updated = 1 when the launcher has published a newer world than the one this process joined
 * (hosts added or removed; it asks the launcher's rendezvous server). TUTTI_ERR_UNSUPPORTED
 * outside an elastic job. */
tutti_status_t tutti_hosts_updated(int* updated);
/* The generation (world) this process joined last; -1 before init and outside elastic jobs. */
int64_t tutti_elastic_generation(void);

/* ---- collectives on flat buffers (process set 0) ---- */
tutti_status_t tutti_allreduce_async(const char* name, const void* input, void* output,
                                     int64_t count, tutti_dtype_t dtype, tutti_reduce_op_t op,
                                     double prescale, double postscale, tutti_handle_t* handle);
tutti_status_t tutti_broadcast_async(const char* name, void* buffer, int64_t count,
                                     tutti_dtype_t dtype, int root, tutti_handle_t* handle);

/* ---- general form: shapes, process sets, callbacks ---- */
typedef struct tutti_tensor {
  void* data;
  tutti_dtype_t dtype;
  int ndim;
  int64_t shape[TUTTI_MAX_DIMS];
} tutti_tensor_t;

typedef enum tutti_device { TUTTI_DEVICE_CPU = 0, TUTTI_DEVICE_CUDA = 1 } tutti_device_t;

typedef struct tutti_op_options {
  size_t struct_size;    /* sizeof(tutti_op_options_t) */
  tutti_reduce_op_t op;  /* allreduce, reducescatter */
  double prescale;       /* default 1.0 */
  double postscale;      /* default 1.0 */
  int root;              /* broadcast: rank within the process set */
  int process_set;       /* TUTTI_GLOBAL_PROCESS_SET */
  const int64_t* splits; /* alltoall: rows to send to each rank of the set; NULL = equal */
  int nsplits;
  tutti_callback_t callback; /* optional */
  void* user_data;           /* passed to callback, allocator and release */
  /* Since 0.2 (a struct_size of TUTTI_OP_OPTIONS_SIZE_0_1 leaves them NULL). */
  /* Optional, allgather/alltoall/reducescatter: memory for the output once its shape is
   * known (shape[0..ndim-1] elements of the input's dtype, where the input lives), called on
   * one of Tutti's threads; NULL fails the op. The output is then the caller's: tutti_wait
   * does not free it. Without an allocator Tutti mallocs it (release with tutti_free). */
  void* (*allocator)(const int64_t* shape, int ndim, void* user_data);
  /* Optional: called exactly once, on any thread, when Tutti no longer uses user_data (the
   * op's callback and allocator have run, or the submission failed). */
  void (*release)(void* user_data);
  tutti_device_t device; /* where the tensors' memory is: TUTTI_DEVICE_CPU (default) */
  /* Since 0.3 (a struct_size of TUTTI_OP_OPTIONS_SIZE_0_2 or _0_1 leaves it 0). */
  /* 1: the caller issues this process set's ordered ops in the same order on every rank
   * (as torch.distributed does). Tutti then agrees on them by position, from the round's
   * bits alone, with no gather of requests; ranks whose n-th ordered ops differ (name, op,
   * dtype, shape, reduce op, scales, root) fall back to full negotiation, where the
   * difference fails as a mismatch. Allreduce, broadcast, allgather and reducescatter outside
   * a group use it; other ops negotiate as usual. 0 (default): matched by name. */
  int ordered;
} tutti_op_options_t;
/* The size of tutti_op_options_t in version 0.1 (up to user_data), still accepted. */
#define TUTTI_OP_OPTIONS_SIZE_0_1 (offsetof(tutti_op_options_t, allocator))
/* The size of tutti_op_options_t in version 0.2 (up to device), still accepted. */
#define TUTTI_OP_OPTIONS_SIZE_0_2 (offsetof(tutti_op_options_t, ordered))

/* Fills defaults: SUM, scales 1.0, root 0, global set, equal splits, no callback. */
void tutti_op_options_init(tutti_op_options_t* options);

tutti_status_t tutti_allreduce_tensor_async(const char* name, const tutti_tensor_t* input,
                                            tutti_tensor_t* output,
                                            const tutti_op_options_t* options,
                                            tutti_handle_t* handle);
/* Negotiated and run together: every tensor of the group completes at once. One handle. */
tutti_status_t tutti_grouped_allreduce_async(const char* const* names,
                                             const tutti_tensor_t* inputs,
                                             tutti_tensor_t* outputs, int ntensors,
                                             const tutti_op_options_t* options,
                                             tutti_handle_t* handle);
tutti_status_t tutti_broadcast_tensor_async(const char* name, tutti_tensor_t* buffer,
                                            const tutti_op_options_t* options,
                                            tutti_handle_t* handle);
/* Output sizes depend on other ranks: read them with tutti_wait_result. */
tutti_status_t tutti_allgather_async(const char* name, const tutti_tensor_t* input,
                                     const tutti_op_options_t* options, tutti_handle_t* handle);
tutti_status_t tutti_alltoall_async(const char* name, const tutti_tensor_t* input,
                                    const tutti_op_options_t* options, tutti_handle_t* handle);
tutti_status_t tutti_reducescatter_async(const char* name, const tutti_tensor_t* input,
                                         const tutti_op_options_t* options,
                                         tutti_handle_t* handle);
/* Blocks until every rank of the process set has entered the barrier. */
tutti_status_t tutti_barrier(int process_set, double timeout_seconds);
/* The same as an op: complete once every rank of the set has entered it. */
tutti_status_t tutti_barrier_async(int process_set, tutti_handle_t* handle);
/* This rank has no more data: until all ranks join it contributes zeros to the others'
 * allreduces. Blocks until every rank has joined; *last_joined_rank receives the last. */
tutti_status_t tutti_join(int process_set, double timeout_seconds, int* last_joined_rank);
/* The same as an op: tutti_wait_result's last_joined_rank is the last rank that joined. */
tutti_status_t tutti_join_async(int process_set, tutti_handle_t* handle);

/* ---- handles ---- */
tutti_status_t tutti_poll(tutti_handle_t handle, int* done);
/* Waits up to timeout_seconds (< 0: no limit but TUTTI_TIMEOUT_SECONDS). On TUTTI_ERR_IN_PROGRESS
 * the handle stays valid; otherwise it is released. When several threads wait on one handle,
 * one gets the op's status (and result); the others TUTTI_ERR_INVALID_ARGUMENT, "handle N was
 * already waited on by another thread" (docs/c_api.md, "Handles"). */
tutti_status_t tutti_wait(tutti_handle_t handle, double timeout_seconds);
tutti_status_t tutti_wait_result(tutti_handle_t handle, double timeout_seconds,
                                 tutti_result_t* result);
void tutti_free(void* ptr);

/* ---- timeline and counters (docs/troubleshooting.md, docs/c_api.md) ---- */
/* Starts this rank's timeline: `path` a directory ("traces/": every rank writes
 * traces/rank-N.json) or a file (rank 0 writes it, other ranks nothing). Starting again with
 * the same path keeps the file; another path stops the first. */
tutti_status_t tutti_start_timeline(const char* path, int mark_cycles);
/* Completes and closes the timeline file (a no-op when none runs). */
tutti_status_t tutti_stop_timeline(void);

/* One counter of this rank since init. */
typedef struct tutti_stat {
  const char* name; /* e.g. "cache.hits", "op.allreduce.gloo.bytes" */
  int64_t value;    /* counts, bytes, or nanoseconds for "time.*" */
} tutti_stat_t;
/* All counters, sorted by name: *stats receives *count entries owned by Tutti, valid on the
 * calling thread until its next tutti_stats call. Names never change meaning; new versions
 * only add names. Per-op counters ("op.<op>.<backend>.*") appear once such an op ran. */
tutti_status_t tutti_stats(const tutti_stat_t** stats, int* count);
/* One counter by name; TUTTI_ERR_INVALID_ARGUMENT when there is none of that name (yet). */
tutti_status_t tutti_stat(const char* name, int64_t* value);

/* ---- process sets ---- */
/* Collective over ALL ranks: each passes the same sorted, duplicate-free rank list.
 * *process_set receives its id (> 0). Sets registered differently on different ranks
 * are an error on every rank. */
tutti_status_t tutti_add_process_set(const int* ranks, int nranks, int* process_set);
tutti_status_t tutti_remove_process_set(int process_set);
/* This rank's index in the set, or -1 if it is not a member. */
int tutti_process_set_rank(int process_set);
int tutti_process_set_size(int process_set); /* -1 if unknown */
/* The set's world ranks, ascending: *nranks receives their number and the first `capacity`
 * of them go to ranks (NULL with capacity 0 asks for the number only).
 * TUTTI_ERR_INVALID_ARGUMENT for a set that does not exist. */
tutti_status_t tutti_process_set_ranks(int process_set, int* ranks, int capacity, int* nranks);

#ifdef __cplusplus
} /* extern "C" */
#endif

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

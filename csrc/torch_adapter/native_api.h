/* The core's direct entry points for the c10d adapter: plain C across two libraries.
 *
 * The adapter (c10d_backend.cc) is built against torch at run time, the core's _C module by
 * pip; the two may not share C++ types, so _C exports this table in a capsule
 * (`ringreduce._C.NATIVE_API`) and each communicator hands out an opaque handle
 * (`Communicator.native_handle()`, a capsule that keeps a weak reference to the
 * communicator: a destroyed one fails the call, it is never used after free).
 *
 * A synchronous collective (torch passes opts.asyncOp = false for dist.all_reduce(t) and
 * friends) then runs on the caller's thread without the GIL or any Python object: the
 * latency path. Every call returns 0, or -1 with the Python exception set (the GIL is taken
 * for that and released again: the caller raises it with the GIL held). */
#ifndef RINGREDUCE_NATIVE_API_H_
#define RINGREDUCE_NATIVE_API_H_

#include <stddef.h>

#define RR_NATIVE_API_VERSION 1
#define RR_NATIVE_API_CAPSULE "ringreduce._C.NATIVE_API"
#define RR_NATIVE_COMM_CAPSULE "ringreduce._C.native_comm"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rr_native_api {
  unsigned version; /* RR_NATIVE_API_VERSION */
  /* Codes are those of _C.DTYPE_CODES / OP_CODES / ALGO_CODES; root is a group rank. */
  int (*allreduce)(void* comm, void* ptr, size_t count, int dtype, int op, int algo,
                   unsigned site);
  int (*broadcast)(void* comm, void* ptr, size_t count, int dtype, int root, unsigned site);
  int (*barrier)(void* comm, unsigned site);
  /* 1 when `op` may reduce `dtype` (else take the checked path, which explains why). */
  int (*reduction_ok)(int dtype, int op);
  /* The calling Python line (comm/site.h id) for diagnostics; needs the GIL. */
  unsigned (*call_site)(void);
} rr_native_api;

#ifdef __cplusplus
}
#endif

#endif /* RINGREDUCE_NATIVE_API_H_ */

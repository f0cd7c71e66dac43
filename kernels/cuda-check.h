/*
 * cuda-check.h - checking every CUDA, cuBLAS and NCCL call.
 *
 * One macro family, one behaviour: on failure, record a dg_error naming the
 * call's text, file:line, the GPU index and the library's own error name
 * and string, then jump to the function's cleanup.  The macros expect, in
 * the calling function:
 *     int rc;                     set to the negative dg_status on failure
 *     struct dg_error *err;       where the message goes (may be NULL)
 *     int dev;                    the GPU index, for the message
 *     out:                        the cleanup label
 * Kernel launches are followed by DG_LAUNCH_CHECK(), which reads
 * cudaGetLastError().  Whether an error is fatal is the caller's decision
 * (a sticky CUDA error is: the daemon's worker reports it and exits).
 */
#ifndef DG_CUDA_CHECK_H
#define DG_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "lib/error.h"

#define DG_CUDA_CHECK(call)                                                          \
    do {                                                                             \
        cudaError_t e_ = (call);                                                     \
        if (e_ != cudaSuccess) {                                                     \
            rc = dg_error_set(err, DG_E_CUDA, "GPU %d: %s:%d: %s: %s (%s)", dev,     \
                              __FILE__, __LINE__, #call, cudaGetErrorName(e_),       \
                              cudaGetErrorString(e_));                               \
            goto out;                                                                \
        }                                                                            \
    } while (0)

#define DG_LAUNCH_CHECK() DG_CUDA_CHECK(cudaGetLastError())

#define DG_CUBLAS_CHECK(call)                                                        \
    do {                                                                             \
        cublasStatus_t s_ = (call);                                                  \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                           \
            rc = dg_error_set(err, DG_E_CUBLAS, "GPU %d: %s:%d: %s: %s (%s)", dev,   \
                              __FILE__, __LINE__, #call, cublasGetStatusName(s_),    \
                              cublasGetStatusString(s_));                            \
            goto out;                                                                \
        }                                                                            \
    } while (0)

#define DG_NCCL_CHECK(call)                                                          \
    do {                                                                             \
        ncclResult_t r_ = (call);                                                    \
        if (r_ != ncclSuccess) {                                                     \
            rc = dg_error_set(err, DG_E_NCCL, "GPU %d: %s:%d: %s: %s (%s)", dev,     \
                              __FILE__, __LINE__, #call, ncclGetErrorString(r_),     \
                              ncclGetLastError(NULL));                               \
            goto out;                                                                \
        }                                                                            \
    } while (0)

#endif

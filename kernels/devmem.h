/*
 * devmem.h - device memory and streams for C callers (the backend, the GPU
 * tests): allocate, copy, fill, wait.  Each returns 0 or a negative
 * dg_status with err naming the GPU and the CUDA error.
 */
#ifndef DG_KERNELS_DEVMEM_H
#define DG_KERNELS_DEVMEM_H

#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Make dev the calling thread's current GPU. */
int dg_cuda_use(int dev, struct dg_error *err);

/* *p = bytes of device memory on the current GPU (dev names it in errors).
 * Errors: DG_E_NOMEM when the GPU has not that much free (with the free and
 * total memory in the message), DG_E_CUDA otherwise. */
int dg_cuda_alloc(void **p, size_t bytes, int dev, struct dg_error *err);
void dg_cuda_free(void *p);

/* Copies (synchronous): host -> device, device -> host. */
int dg_cuda_upload(void *dst, const void *src, size_t bytes, int dev, struct dg_error *err);
int dg_cuda_download(void *dst, const void *src, size_t bytes, int dev, struct dg_error *err);

/* Every byte of [p, p + bytes) set to value. */
int dg_cuda_memset(void *p, int value, size_t bytes, int dev, struct dg_error *err);

/* Wait for the current GPU's work; reports a kernel's asynchronous fault. */
int dg_cuda_sync(int dev, struct dg_error *err);

/* Streams: a non-blocking stream on the current GPU; wait for one. */
typedef struct CUstream_st *dg_stream_t;
int dg_cuda_stream_create(dg_stream_t *s, int dev, struct dg_error *err);
void dg_cuda_stream_destroy(dg_stream_t s);
int dg_cuda_stream_sync(dg_stream_t s, int dev, struct dg_error *err);

/* Events that order one stream's work after another's (no timing): after
 * dg_cuda_stream_after(b, a, ev), what b queues next starts once what a
 * had queued so far is done.  While a is being captured into a CUDA graph
 * this forks b into the capture (b must join a again the same way before
 * the capture ends). */
typedef struct CUevent_st *dg_cuda_event_t;
int dg_cuda_event_create(dg_cuda_event_t *ev, int dev, struct dg_error *err);
void dg_cuda_event_destroy(dg_cuda_event_t ev);
int dg_cuda_stream_after(dg_stream_t b, dg_stream_t a, dg_cuda_event_t ev, int dev,
                         struct dg_error *err);
/* ev marks what s has queued so far; dg_cuda_event_sync waits on the host
 * until that is done (what s queued after it may still run). */
int dg_cuda_event_record(dg_cuda_event_t ev, dg_stream_t s, int dev, struct dg_error *err);
int dg_cuda_event_sync(dg_cuda_event_t ev, int dev, struct dg_error *err);
/* An event that also keeps the time the device reached it (the others
 * do not: timing costs them), and the device milliseconds from a to b,
 * two such events both recorded (*ms -1 while either is not yet
 * reached). */
int dg_cuda_event_create_timed(dg_cuda_event_t *ev, int dev, struct dg_error *err);
int dg_cuda_event_ms(dg_cuda_event_t a, dg_cuda_event_t b, double *ms, int dev,
                     struct dg_error *err);

/* Copies and fills queued on stream s (either direction; host memory that
 * is not page-locked makes the copy synchronous with the host). */
int dg_cuda_copy_async(void *dst, const void *src, size_t bytes, dg_stream_t s, int dev,
                       struct dg_error *err);
int dg_cuda_memset_async(void *p, int value, size_t bytes, dg_stream_t s, int dev,
                         struct dg_error *err);

/* GPU dev's free and total memory in bytes (the calling thread's current
 * GPU stays as it was). */
int dg_cuda_mem_info(size_t *free_bytes, size_t *total_bytes, int dev, struct dg_error *err);

/* Whether GPU dev (made current) can still run work: waits for all of its
 * work, then reads the last error.  A failure here is a sticky error (the
 * context is lost until the process ends): DG_E_CUDA. */
int dg_cuda_healthy(int dev, struct dg_error *err);

/* GPU dev's PCI address as the kernel's sysfs names it ("0000:1b:00.0",
 * lower case).  Errors: DG_E_CUDA. */
int dg_cuda_pci_id(int dev, char *buf, size_t len, struct dg_error *err);

#ifdef __cplusplus
}
#endif

#endif

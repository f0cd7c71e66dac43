/*
 * graph.h - CUDA graphs for C callers: capture what a stream is given,
 * replay it.  A captured sequence keeps every pointer and size it was
 * given; whoever captures must rebuild it when any of them changes (the
 * backend keys its graphs by shape and by the generation of the buffers
 * behind them).
 */
#ifndef DG_KERNELS_GRAPH_H
#define DG_KERNELS_GRAPH_H

#include "kernels/ops.h"
#include "lib/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUgraphExec_st *dg_graph_t;

/* Start capturing the work the calling thread queues on stream (other
 * threads may capture their own streams at the same time).  Errors:
 * DG_E_CUDA. */
int dg_graph_begin(dg_stream_t stream, int dev, struct dg_error *err);

/* End the capture and instantiate it.  With ok 0 (the captured code
 * failed) the capture is ended and dropped; *out stays NULL.  Errors:
 * DG_E_CUDA (the capture was invalidated: something in it cannot be
 * captured). */
int dg_graph_end(dg_stream_t stream, int ok, dg_graph_t *out, int dev, struct dg_error *err);

/* Queue a replay on stream.  Errors: DG_E_CUDA. */
int dg_graph_launch(dg_graph_t g, dg_stream_t stream, int dev, struct dg_error *err);

void dg_graph_destroy(dg_graph_t g);

#ifdef __cplusplus
}
#endif

#endif

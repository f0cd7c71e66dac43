/* graph.cu - CUDA graphs for C callers (see graph.h). */
#include "kernels/graph.h"

#include "kernels/cuda-check.h"

extern "C" int dg_graph_begin(dg_stream_t stream, int dev, struct dg_error *err)
{
    int rc = 0;
    DG_CUDA_CHECK(cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal));
out:
    return rc;
}

extern "C" int dg_graph_end(dg_stream_t stream, int ok, dg_graph_t *out, int dev,
                            struct dg_error *err)
{
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    int rc = 0;
    *out = NULL;
    DG_CUDA_CHECK(cudaStreamEndCapture((cudaStream_t)stream, &g));
    if (ok)
        DG_CUDA_CHECK(cudaGraphInstantiate(&x, g, 0));
    *out = (dg_graph_t)x;
out:
    if (g)
        cudaGraphDestroy(g);
    return rc;
}

extern "C" int dg_graph_launch(dg_graph_t g, dg_stream_t stream, int dev, struct dg_error *err)
{
    int rc = 0;
    DG_CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)g, (cudaStream_t)stream));
out:
    return rc;
}

extern "C" void dg_graph_destroy(dg_graph_t g)
{
    if (g)
        cudaGraphExecDestroy((cudaGraphExec_t)g);
}

/* ref-router.c - top-k expert choice reference; see ref-ops.h. */
#include "lib/ref-ops.h"


void dg_ref_router_topk(int *idx, float *w, const float *logits, int E, int K,
                        const float *per_expert_scale)
{
    float mx = -INFINITY, sel_sum = 0;
    double sum = 0;

    for (int e = 0; e < E; e++)
        if (logits[e] > mx)
            mx = logits[e];
    for (int e = 0; e < E; e++)
        sum += expf(logits[e] - mx);
    /* selection: K passes, each taking the largest probability not yet
     * taken, lower index first on ties (E and K are small) */
    for (int k = 0; k < K; k++) {
        int best = -1;
        float best_p = -1.0f;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            float p;
            for (int j = 0; j < k; j++)
                taken |= idx[j] == e;
            if (taken)
                continue;
            p = (float)(expf(logits[e] - mx) / sum);
            if (p > best_p) {
                best_p = p;
                best = e;
            }
        }
        idx[k] = best;
        w[k] = best_p;
        sel_sum += best_p;
    }
    for (int k = 0; k < K; k++)
        w[k] = w[k] / sel_sum * per_expert_scale[idx[k]];
}

/*
 * cpu-backend.h - the backend interface (backend.h) over the CPU forward
 * pass: the reference every other backend is compared with.  Single
 * threaded; items of a batch run one after another, each exactly as it
 * would alone, so a request's result never depends on its batch.
 */
#ifndef DG_CPU_BACKEND_H
#define DG_CPU_BACKEND_H

#include "lib/backend.h"
#include "lib/cpu-forward.h"

/* A backend with max_slots request slots over cm (which must outlive it).
 * Errors: DG_E_INVAL, DG_E_NOMEM. */
int dg_cpu_backend_create(const struct dg_cpu_model *cm, int max_slots, struct dg_backend **out,
                          struct dg_error *err);

#endif

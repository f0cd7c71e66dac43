/*
 * shm-layout.h - the shared-memory job ring of dgemmad, version 1: the
 * binary layout both sides agree on (the daemon in daemon/shm-ring.c,
 * libdgemma in client/libdgemma-ring*.c, any other client from dgemmad(8)).
 * Definitions only; no code.  Little-endian, natural alignment; every
 * offset below is fixed (static assertions at the end).
 *
 * ATTACH
 *   A client sends {"v":1,"op":"shm_attach"} on its socket (optionally
 *   "sq_entries", "cq_entries", "in_bytes", "out_bytes": requests, capped
 *   by the configuration).  The daemon answers with one event line,
 *   {"v":1,"event":"shm_attached","version":1,"size":..,...}, and with it,
 *   as SCM_RIGHTS, three descriptors in this order: the memfd holding the
 *   ring (sealed against shrinking and growing: map it whole, MAP_SHARED),
 *   the submission doorbell and the completion doorbell (eventfds).  One
 *   ring per connection; it lives until the connection closes.
 *
 * THE REGION
 *   [0, 4096)                         struct dg_shm_header
 *   [sq_off, + sq_entries * 160)      submission entries (client writes)
 *   [cq_off, + cq_entries * 128)      completion entries (daemon writes)
 *   [in_off, + in_size)               submission arena: prompts and stop
 *                                     strings (client writes, daemon reads)
 *   [out_off, + out_size)             completion arena: output ids and
 *                                     text, error messages (daemon writes)
 *   The header's geometry is written by the daemon before it sends the
 *   descriptor; the daemon never reads it back (it keeps its own copy), so
 *   a client that overwrites it only misleads itself.
 *
 * INDEXES AND MEMORY ORDER
 *   sq_tail, sq_head, cq_tail, cq_head are free-running uint32 counters; an
 *   index i names entry i & (entries - 1), and tail - head (mod 2^32) is
 *   how many entries are between them.  Each is written by one side only,
 *   with a release store, and read by the other with an acquire load:
 *     sq_tail  client: it wrote entries [old tail, new tail) and their
 *              arena bytes before the release store; the daemon's acquire
 *              load of sq_tail makes them visible to it.
 *     sq_head  daemon: it copied entries [old head, new head) and their
 *              arena bytes out before the release store; once the client
 *              has loaded sq_head (acquire) it may reuse those entries and
 *              arena bytes.
 *     cq_tail  daemon: it wrote completions [old tail, new tail) and their
 *              arena bytes before the release store; the client's acquire
 *              load makes them visible.
 *     cq_head  client: it is done with completions [old head, new head) and
 *              their arena bytes (copied out) before the release store;
 *              the daemon's acquire load lets it reuse them.
 *   All four start at 0.  The daemon checks every value it loads:
 *   sq_tail - sq_head must not exceed sq_entries, cq_head must lie in [the
 *   last cq_head it saw, cq_tail]; a client that breaks that loses its ring
 *   (flags gets DG_SHM_FAULT, the completion doorbell is written, its jobs
 *   are cancelled), not the daemon.
 *
 * DOORBELLS
 *   Eventfds, non-blocking (the flag belongs to the open file, so the
 *   client's copies are non-blocking too); a write adds to a counter, so a
 *   ring is never missed: write after publishing, read (to empty the
 *   counter) before looking, and look again after every wake-up.  The
 *   client writes the submission doorbell after moving sq_tail, and after
 *   moving cq_head when flags has DG_SHM_NEED_WAKE (the daemon stopped
 *   taking submissions because every completion slot was taken).  The flag
 *   is a store-then-load handshake on both sides: the daemon sets flags,
 *   then loads cq_head; the client stores cq_head, then loads flags; both
 *   sequentially consistent, so one of them sees the other.  (The daemon
 *   also looks at every ring at each housekeeping tick.)  The daemon
 *   writes the completion doorbell after moving cq_tail.  It reads and
 *   writes the doorbells only through its io_uring, never in its own
 *   thread: a client that makes its copies blocking, or fills the
 *   completion doorbell's counter, delays only its own wake-ups.
 *
 * SUBMISSIONS
 *   op DG_SHM_OP_TEXT: prompt_len bytes of UTF-8 at in_off + prompt_off (a
 *   <bos> is prepended, as for "prompt" on the socket); DG_SHM_OP_IDS:
 *   prompt_len / 4 token ids (int32); DG_SHM_OP_CANCEL: cancel the job
 *   submitted with user_data == cancel_user_data (no completion of its
 *   own, even when malformed or naming no job in flight; the job's
 *   completion says cancelled, unless it ended first).  A setting is used when its
 *   DG_SHM_SET_* bit is in `set`, else the default; values are checked as
 *   on the socket.  Stop strings: stop_len bytes at in_off + stop_off,
 *   each string ended by a NUL.  The daemon copies an entry and its bytes
 *   out before it looks at them; an entry it cannot use (an unknown op or
 *   flag, a range outside the arena, bad UTF-8, a value out of range)
 *   completes with that job's error, never more.
 *
 * COMPLETIONS
 *   One per generate job, when it ends: status 0 (done; finish says how)
 *   or a DG_SHM_ERR_* code with the error message as the text: refused
 *   (request_id 0) or failed after it started (request_id set).  Output:
 *   n_ids int32 ids at out_off (8-byte aligned), then text_len bytes of
 *   text (not NUL-terminated; it may hold U+0000).  Which stop string
 *   ended a job is not reported (the socket's done event has it).  At most
 *   cq_entries jobs are taken before their completions are reaped.
 *   The prompt arena needs no alignment: the daemon copies bytes.
 */
#ifndef DG_SHM_LAYOUT_H
#define DG_SHM_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#define DG_SHM_MAGIC 0x52534744u   /* "DGSR" */
#define DG_SHM_VERSION 1u
#define DG_SHM_HEADER_SIZE 4096u
#define DG_SHM_SQE_SIZE 160u
#define DG_SHM_CQE_SIZE 128u
#define DG_SHM_MAX_STOP_IDS 8

/* header.flags (daemon writes) */
#define DG_SHM_NEED_WAKE 1u        /* ring the submission doorbell after reaping */
#define DG_SHM_FAULT 2u            /* the ring broke a rule; the daemon left it */

enum dg_shm_op { DG_SHM_OP_TEXT = 1, DG_SHM_OP_IDS = 2, DG_SHM_OP_CANCEL = 3 };

/* sqe.flags */
#define DG_SHM_F_BATCH 1u          /* a batch job's (metrics source 'batch') */
#define DG_SHM_F_PLAIN_TEXT 2u     /* a text prompt matches no added token ("parse_special":
                                    * false); not with an ids prompt */
#define DG_SHM_F_PARSE_SPECIAL 4u  /* "parse_special": true (neither flag: the daemon's
                                    * default); not with PLAIN_TEXT or an ids prompt */
#define DG_SHM_F_ALL (DG_SHM_F_BATCH | DG_SHM_F_PLAIN_TEXT | DG_SHM_F_PARSE_SPECIAL)

/* sqe.set: which settings the entry gives */
enum {
    DG_SHM_SET_CANVAS_LENGTH = 1u << 0,
    DG_SHM_SET_MAX_DENOISING_STEPS = 1u << 1,
    DG_SHM_SET_STABILITY_THRESHOLD = 1u << 2,
    DG_SHM_SET_TOP_K = 1u << 3,
    DG_SHM_SET_ENTROPY_BOUND = 1u << 4,
    DG_SHM_SET_CONFIDENCE_THRESHOLD = 1u << 5,
    DG_SHM_SET_T_MIN = 1u << 6,
    DG_SHM_SET_T_MAX = 1u << 7,
    DG_SHM_SET_TOP_P = 1u << 8,
    DG_SHM_SET_SEED = 1u << 9,
    DG_SHM_SET_MAX_TOKENS = 1u << 10,
    DG_SHM_SET_STOP_IDS = 1u << 11,   /* n_stop_ids of stop_ids */
    DG_SHM_SET_STOP = 1u << 12,       /* the stop strings at stop_off */
    DG_SHM_SET_ALL = (1u << 13) - 1,
};

/* cqe.status: 0, or why the job was refused (the socket protocol's codes) */
enum dg_shm_status {
    DG_SHM_OK = 0,
    DG_SHM_ERR_BAD_REQUEST = 1,
    DG_SHM_ERR_TOO_LARGE = 2,
    DG_SHM_ERR_BUSY = 3,
    DG_SHM_ERR_SHUTTING_DOWN = 4,
    DG_SHM_ERR_INTERNAL = 5,
};

/* cqe.finish (status 0) */
enum dg_shm_finish {
    DG_SHM_FINISH_STOP = 0,
    DG_SHM_FINISH_LENGTH = 1,
    DG_SHM_FINISH_CANCELLED = 2,
    DG_SHM_FINISH_ERROR = 3,
};

struct dg_shm_header {
    /* geometry: written by the daemon before the memfd is sent */
    uint32_t magic;                /*   0 DG_SHM_MAGIC */
    uint32_t version;              /*   4 DG_SHM_VERSION */
    uint32_t sq_entries;           /*   8 a power of two */
    uint32_t cq_entries;           /*  12 a power of two */
    uint64_t sq_off, cq_off;       /*  16, 24 */
    uint64_t in_off, in_size;      /*  32, 40 */
    uint64_t out_off, out_size;    /*  48, 56 */
    uint64_t total_size;           /*  64 */
    uint8_t pad0[128 - 72];
    /* one cache line each */
    uint32_t sq_tail;              /* 128 client writes (release) */
    uint8_t pad1[60];
    uint32_t sq_head;              /* 192 daemon writes (release) */
    uint8_t pad2[60];
    uint32_t cq_tail;              /* 256 daemon writes (release) */
    uint8_t pad3[60];
    uint32_t cq_head;              /* 320 client writes (release) */
    uint8_t pad4[60];
    uint32_t flags;                /* 384 daemon writes: DG_SHM_NEED_WAKE, DG_SHM_FAULT */
    uint8_t pad5[DG_SHM_HEADER_SIZE - 388];
};

struct dg_shm_sqe {
    uint64_t user_data;            /*   0 the client's; echoed in the completion */
    uint32_t op;                   /*   8 enum dg_shm_op */
    uint32_t flags;                /*  12 DG_SHM_F_*; other bits must be 0 */
    uint64_t prompt_off;           /*  16 in the submission arena */
    uint32_t prompt_len;           /*  24 bytes */
    uint32_t n_stop_ids;           /*  28 <= DG_SHM_MAX_STOP_IDS */
    uint64_t stop_off;             /*  32 in the submission arena */
    uint32_t stop_len;             /*  40 bytes, NUL-ended strings */
    uint32_t set;                  /*  44 DG_SHM_SET_* */
    int32_t canvas_length;         /*  48 */
    int32_t max_denoising_steps;   /*  52 */
    int32_t stability_threshold;   /*  56 */
    int32_t top_k;                 /*  60 */
    double entropy_bound;          /*  64 */
    double confidence_threshold;   /*  72 */
    double t_min;                  /*  80 */
    double t_max;                  /*  88 */
    double top_p;                  /*  96 */
    uint64_t seed;                 /* 104 */
    int64_t max_tokens;            /* 112 */
    uint64_t cancel_user_data;     /* 120 op DG_SHM_OP_CANCEL */
    int32_t stop_ids[DG_SHM_MAX_STOP_IDS]; /* 128 */
};

struct dg_shm_cqe {
    uint64_t user_data;            /*   0 the submission's */
    uint64_t request_id;           /*   8 the daemon's id (0: refused) */
    uint32_t status;               /*  16 enum dg_shm_status */
    uint32_t finish;               /*  20 enum dg_shm_finish (status 0) */
    uint64_t out_off;              /*  24 in the completion arena */
    uint32_t n_ids;                /*  32 output ids at out_off */
    uint32_t text_len;             /*  36 text after the ids (status != 0: the message) */
    uint32_t prompt_tokens;        /*  40 */
    uint32_t completion_tokens;    /*  44 */
    uint32_t canvases;             /*  48 */
    int32_t stop_id;               /*  52 the stop token that ended it, -1 if none */
    uint64_t decoder_steps;        /*  56 */
    uint64_t seed;                 /*  64 the seed used */
    double tokens_per_s;           /*  72 */
    double ms_total;               /*  80 */
    double ms_first_canvas;        /*  88 */
    uint8_t pad[DG_SHM_CQE_SIZE - 96];
};

_Static_assert(sizeof(struct dg_shm_header) == DG_SHM_HEADER_SIZE, "header size");
_Static_assert(offsetof(struct dg_shm_header, sq_tail) == 128, "sq_tail");
_Static_assert(offsetof(struct dg_shm_header, sq_head) == 192, "sq_head");
_Static_assert(offsetof(struct dg_shm_header, cq_tail) == 256, "cq_tail");
_Static_assert(offsetof(struct dg_shm_header, cq_head) == 320, "cq_head");
_Static_assert(offsetof(struct dg_shm_header, flags) == 384, "flags");
_Static_assert(sizeof(struct dg_shm_sqe) == DG_SHM_SQE_SIZE, "sqe size");
_Static_assert(offsetof(struct dg_shm_sqe, entropy_bound) == 64, "sqe doubles");
_Static_assert(offsetof(struct dg_shm_sqe, stop_ids) == 128, "sqe stop ids");
_Static_assert(sizeof(struct dg_shm_cqe) == DG_SHM_CQE_SIZE, "cqe size");
_Static_assert(offsetof(struct dg_shm_cqe, tokens_per_s) == 72, "cqe doubles");

#endif

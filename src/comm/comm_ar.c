/* comm_ar.c: the group all-reduce of comm.h (blocking and non-blocking), one engine for both
 * transports, built on their group messages (CommOps.g_isend / g_irecv / g_test / g_free).
 *
 * A ring over the group in group rank order: me sends to right = me + 1 and receives from
 * left = me - 1 (mod r). The buffer is split into r chunks (comm_ar_chunk). There are
 * 2(r - 1) steps; at step s, me sends chunk (me - 1 - s) mod r and receives chunk
 * (me - 2 - s) mod r (the same formulas for both phases):
 *   - reduce-scatter, s = 0 .. r - 2: the received partial sum p of a chunk becomes
 *     p + own (in place in buf; at s = r - 2 also / r for COMM_MEAN), and is sent on at step
 *     s + 1. So chunk k starts as x_{k+1} (sent raw at step 0 by group rank k + 1), gains
 *     x_{k+2}, ... and ends, complete, at group rank k with x_k added last: the order stated
 *     in comm.h, which comm_sum_serial computes serially.
 *   - all-gather, s = r - 1 .. 2r - 3: the finished chunks travel once more round the ring,
 *     received straight into buf and sent on at the next step.
 * Each rank thus sends every chunk but its own in the first phase and every chunk but its
 * right neighbour's in the second: 2n - len(me) - len(me + 1) floats, 2(r - 1)/r of n.
 *
 * Pieces: a chunk moves in pieces of COMM_AR_PIECE floats. The send of piece p of step
 * s + 1 depends only on the receive of piece p of step s, so pieces pipeline round the ring.
 * All of an all-reduce's pieces from left travel on one tag and match receives in posting
 * order (both sides list them in the same order), so a member posts its receives in order,
 * AR_DEPTH ahead (reduce-scatter receives land in AR_DEPTH piece buffers), and issues its
 * sends in order as soon as their data is final. Each pass tests the oldest pending send (sends
 * are reaped in order) and the oldest pending receive, so its cost does not grow with the
 * pieces in flight. An all-gather receive into a region of buf
 * waits until the reduce-scatter send from that region has completed.
 *
 * Notices: at the start each member sends every other one 24 bytes (sequence number, n,
 * op) on the all-reduce's notice tag, and the ring starts only when all have come and agree.
 * So members that disagree on n or op all fail, and only after every notice has been
 * received: a failed all-reduce leaves no message behind (under MPI a stray message to a
 * freed communicator can reach a later one that reuses its context id); and a timeout names
 * the lowest member that has not started. The cost is one exchange of tiny messages before
 * the first piece moves. Running all-reduces are kept on their Comm's list and advanced
 * (ar_pass) by the Comm's progress thread (ar_thread_main), or, without one, by every
 * comm_ar_test / comm_ar_wait / comm_wait / comm_test.
 *
 * Threads: c->ar_mu guards the list and every running CommAr; each pass and each API call
 * that touches a running one holds it. A handle ends (ar_done, ar_fail) under it, and
 * a->fin is published last: from then on the engine never touches a, so the caller may
 * read its result and free it without the mutex (and after comm_free, when a->home is gone). */
#include "comm_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { AR_RUNNING = 0, AR_DONE = 1, AR_FAILED = 2 };
enum { AR_DEPTH = 4 };     /* receives posted ahead */
enum { NOTE_WORDS = 3 };   /* a notice: seq, n, op as int64 */

typedef struct ArPiece {
    size_t off, len;       /* floats of buf */
    int step, piece;
    int64_t dep;           /* send: the receive that must have been processed first; receive:
                              the send that must have completed first; -1: none */
} ArPiece;

struct CommAr {
    CommAr *prev, *next;   /* in c->ars while running */
    Comm *c;               /* while running; NULL once finished (then nothing touches c or g) */
    Comm *home;            /* the same, never cleared: the caller's way to c->ar_mu while
                              running (read only while fin is 0, when c is alive) */
    CommGroup *g;
    float *buf;
    size_t n;
    CommOp op;
    int64_t seq;
    int r, me, left, right;   /* group ranks */
    int wme;                  /* world rank, for messages */
    int tag_note, tag_data;
    int state, rc;
    _Atomic int fin;          /* set last, once state, rc and err are final and the engine
                                 will not touch this handle again: the caller may then read
                                 them (and free it) without ar_mu */
    Err err;
    char what[80];            /* "all-reduce #3 of 1000 floats" */
    int leak;                 /* a transport kept a buffer of ours: never free tmp / notices */
    /* notices */
    int64_t *note_out;        /* NOTE_WORDS */
    int64_t *note_in;         /* r * NOTE_WORDS */
    CommReq **note_sq, **note_rq;   /* r each; own entry unused */
    int notes_missing, note_sends;
    /* the ring */
    ArPiece *sp, *rp;         /* every send / receive, in order */
    size_t ns, nr;
    CommReq **sq, **rq;
    unsigned char *sdone;     /* ns: send j completed */
    size_t next_send, send_low, next_post, next_proc;
    float *tmp;               /* AR_DEPTH pieces of tmp_cap floats: reduce-scatter receives */
    size_t tmp_cap;
    int bad;                  /* a notice disagreed: fail with bad_err once all have come */
    Err bad_err;
};

size_t comm_ar_chunk(size_t n, int r, int k) {
    PD_ASSERTF(r >= 1 && k >= 0 && k <= r, "chunk %d of %d", k, r);
    const size_t q = n / (size_t)r, m = n % (size_t)r;   /* floor(k n / r) = k q + floor(k m / r) */
    return (size_t)k * q + (size_t)k * m / (size_t)r;
}

static int mod(int a, int r) {
    a %= r;
    return a < 0 ? a + r : a;
}

void comm_sum_serial(const float *const *x, int nx, size_t n, CommOp op, float *out) {
    PD_ASSERT(nx >= 1);
    if (nx == 1) {   /* a group of one leaves its buffer as it is */
        if (n && out != x[0]) memmove(out, x[0], n * sizeof(float));
        return;
    }
    enum { B = 1024 };
    float s[B];
    const float fn = (float)nx;
    for (int k = 0; k < nx; k++) {
        const size_t lo = comm_ar_chunk(n, nx, k), hi = comm_ar_chunk(n, nx, k + 1);
        for (size_t b = lo; b < hi; b += B) {   /* block by block, so out may alias any x[g] */
            const size_t m = hi - b < B ? hi - b : B;
            const float *x0 = x[(k + 1) % nx] + b;
            for (size_t i = 0; i < m; i++) s[i] = x0[i];
            for (int j = 2; j <= nx; j++) {
                const float *xj = x[(k + j) % nx] + b;
                for (size_t i = 0; i < m; i++) s[i] = s[i] + xj[i];
            }
            if (op == COMM_MEAN)
                for (size_t i = 0; i < m; i++) s[i] = s[i] / fn;
            memcpy(out + b, s, m * sizeof(float));
        }
    }
}

/* ---- state ---------------------------------------------------------------------------- */

static size_t npieces(size_t len) { return (len + COMM_AR_PIECE - 1) / COMM_AR_PIECE; }

static size_t chunk_len(const CommAr *a, int k) { return comm_ar_chunk(a->n, a->r, k + 1) - comm_ar_chunk(a->n, a->r, k); }

/* Lists every send and receive of the ring, in order, with its dependency. */
static void ar_build(CommAr *a) {
    const int r = a->r, steps = 2 * (r - 1);
    size_t *sbase = malloc((size_t)(steps + 1) * sizeof *sbase), *rbase = malloc((size_t)(steps + 1) * sizeof *rbase);
    PD_ASSERT(sbase && rbase);
    sbase[0] = rbase[0] = 0;
    for (int s = 0; s < steps; s++) {
        sbase[s + 1] = sbase[s] + npieces(chunk_len(a, mod(a->me - 1 - s, r)));
        rbase[s + 1] = rbase[s] + npieces(chunk_len(a, mod(a->me - 2 - s, r)));
    }
    a->ns = sbase[steps];
    a->nr = rbase[steps];
    a->sp = malloc((a->ns + 1) * sizeof *a->sp);
    a->rp = malloc((a->nr + 1) * sizeof *a->rp);
    a->sq = calloc(a->ns + 1, sizeof *a->sq);
    a->rq = calloc(a->nr + 1, sizeof *a->rq);
    a->sdone = calloc(a->ns + 1, 1);
    PD_ASSERT(a->sp && a->rp && a->sq && a->rq && a->sdone);
    a->tmp_cap = 0;
    for (int s = 0; s < steps; s++)
        for (int side = 0; side < 2; side++) {
            const int k = mod(a->me - 1 - side - s, r);   /* send: me - 1 - s; receive: me - 2 - s */
            const size_t lo = comm_ar_chunk(a->n, r, k), hi = comm_ar_chunk(a->n, r, k + 1);
            const size_t base = side ? rbase[s] : sbase[s];
            for (size_t p = 0; p < npieces(hi - lo); p++) {
                ArPiece *e = side ? &a->rp[base + p] : &a->sp[base + p];
                e->off = lo + p * COMM_AR_PIECE;
                e->len = hi - e->off < COMM_AR_PIECE ? hi - e->off : COMM_AR_PIECE;
                e->step = s;
                e->piece = (int)p;
                if (!side) /* piece p of step s was received (and reduced) at step s - 1 */
                    e->dep = s > 0 ? (int64_t)(rbase[s - 1] + p) : -1;
                else       /* all-gather into a region this rank sent from at step s - (r - 1) */
                    e->dep = s >= r - 1 ? (int64_t)(sbase[s - (r - 1)] + p) : -1;
                if (side && s < r - 1 && e->len > a->tmp_cap) a->tmp_cap = e->len;
            }
        }
    free(sbase);
    free(rbase);
    a->tmp = a->tmp_cap ? pd_alloc((size_t)AR_DEPTH * a->tmp_cap * sizeof(float)) : NULL;
}

static void ar_unlink(CommAr *a) {
    Comm *c = a->c;
    if (a->prev) a->prev->next = a->next;
    else c->ars = a->next;
    if (a->next) a->next->prev = a->prev;
    else c->ars_tail = a->prev;
    a->prev = a->next = NULL;
    a->g->ar_running--;
}

/* Releases every request still held (withdrawing pending ones). */
static void ar_release(CommAr *a) {
    CommGroup *g = a->g;
    const CommOps *ops = a->c->ops;
    for (int i = 0; i < a->r; i++) {
        if (a->note_rq && a->note_rq[i] && !ops->g_free(g, a->note_rq[i])) a->leak = 1;
        if (a->note_sq && a->note_sq[i] && !ops->g_free(g, a->note_sq[i])) a->leak = 1;
        if (a->note_rq) a->note_rq[i] = NULL;
        if (a->note_sq) a->note_sq[i] = NULL;
    }
    for (size_t j = 0; a->rq && j < a->nr; j++)
        if (a->rq[j]) {
            if (!ops->g_free(g, a->rq[j])) a->leak = 1;
            a->rq[j] = NULL;
        }
    for (size_t j = 0; a->sq && j < a->ns; j++)
        if (a->sq[j]) {
            if (!ops->g_free(g, a->sq[j])) a->leak = 1;
            a->sq[j] = NULL;
        }
}

/* The ring's bookkeeping, once nothing refers to it. */
static void ar_drop_ring(CommAr *a) {
    free(a->sp);
    free(a->rp);
    free(a->sq);
    free(a->rq);
    free(a->sdone);
    free(a->note_sq);
    free(a->note_rq);
    a->sp = a->rp = NULL;
    a->sq = a->rq = a->note_sq = a->note_rq = NULL;
    a->sdone = NULL;
    if (!a->leak) {
        pd_free(a->tmp);
        free(a->note_in);
        free(a->note_out);
    }
    a->tmp = NULL;
    a->note_in = a->note_out = NULL;
}

/* The last thing the engine does to a finished a: publish fin. */
static void ar_finish(CommAr *a) { atomic_store_explicit(&a->fin, 1, memory_order_release); }

static void ar_done(CommAr *a) {
    ar_unlink(a);
    a->state = AR_DONE;
    a->c = NULL;
    a->g = NULL;
    ar_drop_ring(a);
    ar_finish(a);
}

/* Ends a with code rc and message e (its own words); the group is broken from now on. */
static void ar_fail(CommAr *a, int rc, const Err *e) {
    if (a->state != AR_RUNNING) return;
    a->state = AR_FAILED;
    a->rc = rc ? rc : PD_ECOMM;
    a->err = *e;
    a->err.code = a->rc;
    ar_release(a);
    CommGroup *g = a->g;
    if (!g->broken) {
        g->broken = 1;
        snprintf(g->why, sizeof g->why, "%s failed: %.200s", a->what, e->msg);
    }
    ar_unlink(a);
    a->c = NULL;
    a->g = NULL;
    ar_drop_ring(a);
    ar_finish(a);
}

/* An error the transport reported ("rank W: [all-reduce: ]what") in a's words: "rank W:
 * all-reduce #s of n floats: what". */
static void ar_words(const CommAr *a, int rc, const Err *e, Err *out) {
    char head[32];
    char m[sizeof e->msg];
    snprintf(head, sizeof head, "rank %d: ", a->wme);
    const char *p = e->msg;
    if (!strncmp(p, head, strlen(head))) p += strlen(head);
    if (!strncmp(p, "all-reduce: ", 12)) p += 12;
    snprintf(m, sizeof m, "%s", p);
    err_set(out, rc ? rc : PD_ECOMM, "rank %d: %s: %.400s", a->wme, a->what, m);
}

static void ar_fail_t(CommAr *a, int rc, const Err *e) {
    Err f;
    ar_words(a, rc, e, &f);
    ar_fail(a, rc, &f);
}

static void ar_free(CommAr *a) {
    PD_ASSERT(a->state != AR_RUNNING);
    free(a);
}

/* ---- progress --------------------------------------------------------------------------- */

static void reduce(float *restrict x, const float *restrict p, size_t len, int mean, float fn) {
    if (mean)
        for (size_t i = 0; i < len; i++) x[i] = (p[i] + x[i]) / fn;
    else
        for (size_t i = 0; i < len; i++) x[i] = p[i] + x[i];
}

/* Tests request *q once; finished (done or failed): frees it and sets *q = NULL. */
static int ar_test1(CommAr *a, CommReq **q, size_t *got, Err *e) {
    int st = a->c->ops->g_test(a->g, *q, got, e);
    if (st != COMM_PENDING) {
        a->c->ops->g_free(a->g, *q);
        *q = NULL;
    }
    return st;
}

/* The notices: receives that came are checked, sends that completed are freed. Returns 1 if
 * something moved, 0 if not, -1 if a failed (then a is finished: not to be touched). */
static int ar_notices(CommAr *a) {
    int moved = 0;
    Err e = {0};
    size_t got = 0;
    for (int i = 0; i < a->r; i++) {
        if (a->note_rq[i]) {
            int st = ar_test1(a, &a->note_rq[i], &got, &e);
            if (st != COMM_PENDING) {
                moved = 1;
                if (st < 0) {
                    ar_fail_t(a, -st, &e);
                    return -1;
                }
                a->notes_missing--;
                const int64_t *v = a->note_in + (size_t)i * NOTE_WORDS;
                const int who = a->g->ranks[i];
                /* the first disagreement is kept; the other notices are still received */
                if (!a->bad && (got != NOTE_WORDS * sizeof(int64_t) || v[0] != a->seq)) {
                    a->bad = 1;
                    err_set(&a->bad_err, PD_ECOMM, "rank %d: %s: rank %d (group rank %d) is in all-reduce #%" PRId64
                            " (%zu bytes): members must start the same all-reduces in the same order", a->wme, a->what,
                            who, i, got == NOTE_WORDS * sizeof(int64_t) ? v[0] : -1, got);
                } else if (!a->bad && (v[1] != (int64_t)a->n || v[2] != (int64_t)a->op)) {
                    a->bad = 1;
                    err_set(&a->bad_err, PD_ECOMM, "rank %d: %s: members disagree on size or op: rank %d (group rank "
                            "%d) brings %" PRId64 " floats op %" PRId64 ", this rank %zu floats op %d", a->wme,
                            a->what, who, i, v[1], v[2], a->n, (int)a->op);
                }
            }
        }
        if (a->note_sq[i]) {
            int st = ar_test1(a, &a->note_sq[i], &got, &e);
            if (st != COMM_PENDING) {
                moved = 1;
                a->note_sends--;
                if (st < 0) {
                    ar_fail_t(a, -st, &e);
                    return -1;
                }
            }
        }
    }
    return moved;
}

/* Does everything a can do now without blocking (under ar_mu). Returns 1 if anything
 * moved. Once a has finished (ar_done, ar_fail) it returns at once without touching a: the
 * caller may already be freeing it. */
static int ar_pass(CommAr *a) {
    if (a->state != AR_RUNNING) return 0;
    Comm *c = a->c;
    CommGroup *g = a->g;
    const CommOps *ops = c->ops;
    Err e = {0};
    size_t got = 0;
    int moved = ar_notices(a);
    if (moved < 0) return 1;
    if (a->notes_missing > 0) return moved;   /* the ring starts once every member is known to agree */
    if (a->bad) {
        ar_fail(a, PD_ECOMM, &a->bad_err);
        return 1;
    }
    const float fn = (float)a->r;
    for (;;) {
        int ch = 0;
        /* sends that completed, oldest first */
        while (a->send_low < a->next_send) {
            const size_t j = a->send_low;
            if (!a->sdone[j]) {
                int st = ar_test1(a, &a->sq[j], &got, &e);
                if (st == COMM_PENDING) break;
                if (st < 0) {
                    ar_fail_t(a, -st, &e);
                    return 1;
                }
                a->sdone[j] = 1;
                ch = 1;
            }
            a->send_low++;
        }
        /* receives that came, in order: reduce-scatter adds its own data */
        while (a->next_proc < a->next_post) {
            const size_t j = a->next_proc;
            const ArPiece *p = &a->rp[j];
            int st = ar_test1(a, &a->rq[j], &got, &e);
            if (st == COMM_PENDING) break;
            ch = 1;
            if (st < 0) {
                ar_fail_t(a, -st, &e);
                return 1;
            }
            if (got != p->len * sizeof(float)) {   /* not after agreeing notices, unless a bug */
                err_set(&e, PD_ECOMM, "rank %d: %s: rank %d (group rank %d) sent %zu bytes as piece %d of step %d, "
                        "this rank expected %zu", a->wme, a->what, g->ranks[a->left], a->left, got, p->piece,
                        p->step + 1, p->len * sizeof(float));
                ar_fail(a, PD_ECOMM, &e);
                return 1;
            }
            if (p->step < a->r - 1)
                reduce(a->buf + p->off, a->tmp + (j % AR_DEPTH) * a->tmp_cap, p->len,
                       a->op == COMM_MEAN && p->step == a->r - 2, fn);
            a->next_proc++;
        }
        /* receives to post: AR_DEPTH ahead; all-gather ones once their region is sent */
        while (a->next_post < a->nr && a->next_post < a->next_proc + AR_DEPTH) {
            const size_t j = a->next_post;
            const ArPiece *p = &a->rp[j];
            if (p->dep >= 0 && !a->sdone[p->dep]) {   /* that send may have completed out of order */
                if ((size_t)p->dep >= a->next_send) break;   /* not even started */
                int st = ar_test1(a, &a->sq[p->dep], &got, &e);
                if (st == COMM_PENDING) break;
                if (st < 0) {
                    ar_fail_t(a, -st, &e);
                    return 1;
                }
                a->sdone[p->dep] = 1;
            }
            float *dst = p->step < a->r - 1 ? a->tmp + (j % AR_DEPTH) * a->tmp_cap : a->buf + p->off;
            int rc = ops->g_irecv(g, a->left, a->tag_data, dst, p->len * sizeof(float), &a->rq[j], &e);
            if (rc) {
                ar_fail_t(a, rc, &e);
                return 1;
            }
            a->next_post++;
            ch = 1;
        }
        /* sends whose data is final, in order */
        while (a->next_send < a->ns) {
            const size_t j = a->next_send;
            const ArPiece *p = &a->sp[j];
            if (p->dep >= 0 && (size_t)p->dep >= a->next_proc) break;
            int rc = ops->g_isend(g, a->right, a->tag_data, a->buf + p->off, p->len * sizeof(float), &a->sq[j], &e);
            if (rc) {
                ar_fail_t(a, rc, &e);
                return 1;
            }
            c->bytes_sent += p->len * sizeof(float);
            a->next_send++;
            ch = 1;
        }
        if (!ch) break;
        moved = 1;
    }
    if (a->notes_missing == 0 && a->note_sends == 0 && a->next_proc == a->nr && a->send_low == a->ns) {
        ar_done(a);
        moved = 1;
    }
    return moved;
}

/* ---- progress: a thread, or the caller --------------------------------------------------- */

enum { AR_NAP_NS = 100000,       /* the progress thread's first nap (MPI): 100 us */
       AR_NAP_MAX_NS = 1000000 };  /* its longest (1 ms: 125 KB at 1 Gbit/s, which socket buffers hold) */

/* One pass over every running all-reduce of c (under ar_mu). */
static int progress_locked(Comm *c) {
    int moved = 0;
    for (CommAr *a = c->ars, *nx; a; a = nx) {
        nx = a->next;   /* a may finish (and leave the list) */
        moved |= ar_pass(a);
    }
    return moved;
}

int comm_ar_progress_all(Comm *c) {
    if (c->ar_mode != COMM_PROGRESS_CALLER) return 0;   /* the thread does it */
    pthread_mutex_lock(&c->ar_mu);
    int moved = progress_locked(c);
    pthread_mutex_unlock(&c->ar_mu);
    return moved;
}

int comm_ar_progress_thread(const Comm *c) { return c->ar_mode != COMM_PROGRESS_CALLER; }

int comm_ar_caller_progress(Comm *c) { return c->ar_mode == COMM_PROGRESS_CALLER && c->ars; }

/* The progress thread: a pass over the running all-reduces; if nothing moved, a nap (MPI
 * cannot say when a message comes: 100 us, doubling to 1 ms while nothing moves; threads:
 * until a delivery to this endpoint, at most 5 ms); while none runs, a sleep until one
 * starts. Never spins unless COMM_PROGRESS_SPIN asks it to. */
static void *ar_thread_main(void *arg) {
    Comm *c = arg;
    /* MPI: the nap doubles while passes move nothing (a member still computing its
     * backward), up to AR_NAP_MAX_NS, and drops back to ar_nap_ns when something moves */
    const long nap_max = c->ar_nap_ns > AR_NAP_MAX_NS ? c->ar_nap_ns : AR_NAP_MAX_NS;
    long nap = c->ar_nap_ns;
    pthread_mutex_lock(&c->ar_mu);
    while (!c->ar_stop) {
        if (!c->ars) {
            pthread_cond_wait(&c->ar_work, &c->ar_mu);
            nap = c->ar_nap_ns;
            continue;
        }
        const uint64_t mark = c->ops->events(c);
        const int moved = progress_locked(c);
        pthread_mutex_unlock(&c->ar_mu);   /* between passes the caller may take it */
        if (moved) {
            nap = c->ar_nap_ns;
        } else if (c->ar_mode == COMM_PROGRESS_THREAD) {
            if (c->ops->has_events) {
                c->ops->idle(c, mark, 0, pd_now() + 0.005);
            } else if (nap > 0) {
                struct timespec ts = {nap / 1000000000L, nap % 1000000000L};
                nanosleep(&ts, NULL);
                nap = 2 * nap < nap_max ? 2 * nap : nap_max;
            }
        }
        pthread_mutex_lock(&c->ar_mu);
    }
    pthread_mutex_unlock(&c->ar_mu);
    return NULL;
}

/* Starts c's progress thread if its mode has one and it is not running (under ar_mu). If
 * the thread cannot be made, c falls back to progress by the caller, saying so. */
static void ar_thread_start(Comm *c) {
    if (c->ar_mode == COMM_PROGRESS_CALLER || c->ar_thread_on) return;
    int rc = pthread_create(&c->ar_thread, NULL, ar_thread_main, c);
    if (rc) {
        pd_log(LOG_WARN, "rank %d: comm: cannot start the all-reduce progress thread (%s): all-reduces advance "
               "only inside comm calls", c->rank, strerror(rc));
        c->ar_mode = COMM_PROGRESS_CALLER;
        return;
    }
    c->ar_thread_on = 1;
}

int comm_progress_mode(CommProgress *mode, long *nap_ns, Err *err) {
    *mode = COMM_PROGRESS_THREAD;
    *nap_ns = AR_NAP_NS;
    const char *v = getenv("PD_COMM_PROGRESS");
    if (!v || !*v || !strcmp(v, "thread")) return PD_OK;
    if (!strcmp(v, "spin")) {
        *mode = COMM_PROGRESS_SPIN;
        *nap_ns = 0;
        return PD_OK;
    }
    if (!strcmp(v, "caller")) {
        *mode = COMM_PROGRESS_CALLER;
        return PD_OK;
    }
    if (!strncmp(v, "thread:", 7)) {
        char *end = NULL;
        errno = 0;
        long us = strtol(v + 7, &end, 10);
        if (end != v + 7 && !*end && !errno && us >= 0 && us <= 1000000) {
            *nap_ns = us * 1000;
            return PD_OK;
        }
    }
    return err_set(err, PD_EINVAL, "PD_COMM_PROGRESS=%s: expected thread, thread:MICROSECONDS (the nap, 0 .. 1000000), "
                   "spin or caller", v);
}

void comm_ar_init(Comm *c, CommProgress mode, long nap_ns, int threads_ok) {
    c->ar_mode = threads_ok ? mode : COMM_PROGRESS_CALLER;
    c->ar_nap_ns = nap_ns;
    PD_ASSERT(pthread_mutex_init(&c->ar_mu, NULL) == 0);
    pthread_condattr_t at;
    pthread_condattr_init(&at);
    pthread_condattr_setclock(&at, CLOCK_MONOTONIC);   /* the clock of pd_now() */
    PD_ASSERT(pthread_cond_init(&c->ar_work, &at) == 0);
    pthread_condattr_destroy(&at);
}

void comm_ar_fini(Comm *c) {
    if (c->ar_thread_on) {
        pthread_mutex_lock(&c->ar_mu);
        c->ar_stop = 1;
        pthread_cond_broadcast(&c->ar_work);
        pthread_mutex_unlock(&c->ar_mu);
        pthread_join(c->ar_thread, NULL);
        c->ar_thread_on = 0;
    }
    pthread_cond_destroy(&c->ar_work);
    pthread_mutex_destroy(&c->ar_mu);
}

void comm_ar_detach(Comm *c, CommGroup *g, const char *why) {
    pthread_mutex_lock(&c->ar_mu);
    for (CommAr *a = c->ars, *nx; a; a = nx) {
        nx = a->next;
        if (g && a->g != g) continue;
        Err e;
        err_set(&e, PD_ECOMM, "rank %d: %s: %s before it finished", a->wme, a->what, why);
        ar_fail(a, PD_ECOMM, &e);
    }
    pthread_mutex_unlock(&c->ar_mu);
}

/* ---- the API ------------------------------------------------------------------------------ */

int comm_group_iallreduce(CommGroup *g, float *buf, size_t n, CommOp op, CommAr **out, Err *err) {
    *out = NULL;
    Comm *c = g->comm;
    if (op < 0 || op >= COMM_OP_COUNT)
        return err_set(err, PD_EINVAL, "rank %d: all-reduce: unknown op %d", c->rank, (int)op);
    if (n > 0 && !buf) return err_set(err, PD_EINVAL, "rank %d: all-reduce: NULL buffer", c->rank);
    pthread_mutex_lock(&c->ar_mu);   /* g's all-reduce fields and c's list are shared with the thread */
    if (g->broken) {
        int rc = err_set(err, PD_ECOMM, "rank %d: all-reduce on a broken group (%s)", c->rank, g->why);
        pthread_mutex_unlock(&c->ar_mu);
        return rc;
    }
    if (g->ar_running >= COMM_AR_WINDOW) {
        int rc = err_set(err, PD_EINVAL, "rank %d: all-reduce: %d already running on this group (at most %d)",
                         c->rank, g->ar_running, COMM_AR_WINDOW);
        pthread_mutex_unlock(&c->ar_mu);
        return rc;
    }
    CommAr *a = calloc(1, sizeof *a);
    PD_ASSERT(a);
    a->c = a->home = c;
    a->g = g;
    a->buf = buf;
    a->n = n;
    a->op = op;
    a->seq = g->ar_seq++;
    a->r = g->size;
    a->me = g->rank;
    a->left = mod(a->me - 1, a->r);
    a->right = mod(a->me + 1, a->r);
    a->wme = c->rank;
    a->tag_note = comm_ar_tag(a->seq, 0, c->tag_window);
    a->tag_data = comm_ar_tag(a->seq, 1, c->tag_window);
    snprintf(a->what, sizeof a->what, "all-reduce #%" PRId64 " of %zu floats", a->seq, n);
    a->state = AR_RUNNING;
    *out = a;
    if (a->r == 1) {   /* nothing to send; x / 1 = x */
        a->state = AR_DONE;
        a->c = NULL;
        a->g = NULL;
        atomic_store_explicit(&a->fin, 1, memory_order_release);
        pthread_mutex_unlock(&c->ar_mu);
        return PD_OK;
    }
    /* running from here: on the list, so that a failure below unwinds like any other */
    a->prev = c->ars_tail;
    if (c->ars_tail) c->ars_tail->next = a;
    else c->ars = a;
    c->ars_tail = a;
    g->ar_running++;
    a->note_out = malloc(NOTE_WORDS * sizeof(int64_t));
    a->note_in = calloc((size_t)a->r * NOTE_WORDS, sizeof(int64_t));
    a->note_sq = calloc((size_t)a->r, sizeof *a->note_sq);
    a->note_rq = calloc((size_t)a->r, sizeof *a->note_rq);
    PD_ASSERT(a->note_out && a->note_in && a->note_sq && a->note_rq);
    a->note_out[0] = a->seq;
    a->note_out[1] = (int64_t)n;
    a->note_out[2] = (int64_t)op;
    ar_build(a);
    Err e = {0};
    int rc = PD_OK;
    for (int i = 0; i < a->r && !rc; i++) {
        if (i == a->me) continue;
        rc = c->ops->g_irecv(g, i, a->tag_note, a->note_in + (size_t)i * NOTE_WORDS, NOTE_WORDS * sizeof(int64_t),
                             &a->note_rq[i], &e);
        if (!rc) a->notes_missing++;
    }
    for (int i = 0; i < a->r && !rc; i++) {
        if (i == a->me) continue;
        rc = c->ops->g_isend(g, i, a->tag_note, a->note_out, NOTE_WORDS * sizeof(int64_t), &a->note_sq[i], &e);
        if (!rc) {
            a->note_sends++;
            c->bytes_sent += NOTE_WORDS * sizeof(int64_t);
        }
    }
    if (rc) {
        ar_fail_t(a, rc, &e);   /* reported by comm_ar_test / comm_ar_wait */
    } else {
        ar_pass(a);             /* the first pieces go as soon as the notices are in */
        ar_thread_start(c);
        pthread_cond_broadcast(&c->ar_work);
    }
    pthread_mutex_unlock(&c->ar_mu);
    return PD_OK;
}

int comm_ar_test(CommAr *a, int *done, Err *err) {
    if (!atomic_load_explicit(&a->fin, memory_order_acquire)) comm_ar_progress_all(a->home);   /* no-op with a thread */
    *done = atomic_load_explicit(&a->fin, memory_order_acquire);
    if (*done && a->state == AR_FAILED) {
        if (err) *err = a->err;
        return a->rc;
    }
    return PD_OK;
}

/* The timeout message: the lowest member not heard from, else the neighbour this rank
 * waits for. */
static int ar_timeout_err(const CommAr *a, double waited, Err *err) {
    const CommGroup *g = a->g;
    for (int i = 0; i < a->r; i++)
        if (a->note_rq[i])
            return err_set(err, PD_ECOMM, "rank %d: timed out after %.3g s in %s: waiting for rank %d (group rank %d), "
                           "which has not started it", a->wme, waited, a->what, g->ranks[i], i);
    const int steps = 2 * (a->r - 1);
    if (a->next_proc < a->nr) {
        const ArPiece *p = &a->rp[a->next_proc];
        return err_set(err, PD_ECOMM, "rank %d: timed out after %.3g s in %s: waiting for rank %d (group rank %d) to "
                       "pass piece %d of step %d of %d", a->wme, waited, a->what, g->ranks[a->left], a->left, p->piece,
                       p->step + 1, steps);
    }
    if (a->send_low < a->ns) {
        const ArPiece *p = &a->sp[a->send_low];
        return err_set(err, PD_ECOMM, "rank %d: timed out after %.3g s in %s: sending to rank %d (group rank %d): it "
                       "has not received piece %d of step %d of %d", a->wme, waited, a->what, g->ranks[a->right],
                       a->right, p->piece, p->step + 1, steps);
    }
    for (int i = 0; i < a->r; i++)
        if (a->note_sq[i])
            return err_set(err, PD_ECOMM, "rank %d: timed out after %.3g s in %s: sending to rank %d (group rank %d): it "
                           "has not received this rank's notice", a->wme, waited, a->what, g->ranks[i], i);
    return err_set(err, PD_ECOMM, "rank %d: timed out after %.3g s in %s", a->wme, waited, a->what);
}

int comm_ar_wait(CommAr **ap, double timeout_s, Err *err) {
    CommAr *a = *ap;
    if (!a) return PD_OK;
    if (!atomic_load_explicit(&a->fin, memory_order_acquire)) {
        Comm *c = a->home;
        const double start = pd_now(), deadline = timeout_s > 0 ? start + timeout_s : 0;
        double t0 = start;
        /* The caller has nothing else to do, so it makes passes too (with or without the
         * thread): its polling has a shorter latency than the thread's naps, which matters
         * once the ring only waits for handshakes (shared memory: 7% of dp's throughput). */
        pthread_mutex_lock(&c->ar_mu);
        for (;;) {
            uint64_t mark = c->ops->events(c);
            int moved = progress_locked(c);
            if (a->fin) break;
            if (deadline > 0 && pd_now() >= deadline) {
                int rc = ar_timeout_err(a, pd_now() - start, err);
                pthread_mutex_unlock(&c->ar_mu);
                return rc;
            }
            if (moved) {
                t0 = pd_now();
                continue;
            }
            pthread_mutex_unlock(&c->ar_mu);
            c->ops->idle(c, mark, t0, deadline);
            pthread_mutex_lock(&c->ar_mu);
        }
        pthread_mutex_unlock(&c->ar_mu);
    }
    int rc = PD_OK;
    if (a->state == AR_FAILED) {
        rc = a->rc;
        if (err) *err = a->err;
    }
    ar_free(a);
    *ap = NULL;
    return rc;
}

void comm_ar_cancel(CommAr **ap) {
    CommAr *a = *ap;
    if (!a) return;
    if (!atomic_load_explicit(&a->fin, memory_order_acquire)) {
        Comm *c = a->home;
        pthread_mutex_lock(&c->ar_mu);
        if (!a->fin) {
            Err e;
            err_set(&e, PD_ECOMM, "rank %d: %s was cancelled", a->wme, a->what);
            ar_fail(a, PD_ECOMM, &e);
        }
        pthread_mutex_unlock(&c->ar_mu);
    }
    ar_free(a);
    *ap = NULL;
}

int comm_group_allreduce(CommGroup *g, float *buf, size_t n, CommOp op, Err *err) {
    CommAr *a = NULL;
    int rc = comm_group_iallreduce(g, buf, n, op, &a, err);
    if (!rc) rc = comm_ar_wait(&a, g->comm->coll_timeout, err);
    comm_ar_cancel(&a);   /* timed out: given up (the group is broken now) */
    return rc;
}

/* aionet's native ring allreduce and reduce-scatter over two TCP streams (native.py drives it).
 *
 * Why C: on one host a rank's kernel time for a ring allreduce is the same in Python and in C
 * (the socket copies); what the interpreter adds is a few ms of user time per call and rank,
 * measured as the gap between 1.1x and 1.2x gloo at 4 ranks on 2 cores (BENCHMARKS.md). Here
 * one call moves the whole ring: one thread, non-blocking sockets to the right neighbour and
 * from the left one, poll() between them and the caller's abort pipe. Ring reduce-scatter then
 * allgather, each chunk cut in segments; a segment is forwarded as soon as it is reduced (or, in
 * the allgather, received). Out of place a received partial sum lands in its place in the result
 * and is reduced there; in place it lands in a scratch segment.
 *
 * The same loop without its allgather is the reduce-scatter, over the caller's chunk bounds.
 *
 * Every call first sends the right neighbour a header (sequence number, element count, dtype,
 * op and kind, a digest of the bounds) and checks the left one's: ranks that disagree fail with
 * RC_MISMATCH instead of reading each other's bytes as data. The call returns when done, when the
 * abort pipe becomes readable (RC_ABORTED), or when a stream fails; it never blocks anywhere else, and the
 * Python caller releases the GIL for it (ctypes). A failed call leaves the streams out of step:
 * the caller drops them.
 *
 * The module also defines an (empty) Python extension module so that setuptools builds it like
 * any other; native.py loads the shared object with ctypes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { DT_F32 = 0, DT_F64 = 1, DT_I32 = 2, DT_I64 = 3 };
enum { OP_SUM = 0, OP_PROD = 1, OP_MIN = 2, OP_MAX = 3 };
enum {
    RC_OK = 0,
    RC_ABORTED = -1,
    RC_LEFT_CLOSED = -2,
    RC_LEFT_ERROR = -3,
    RC_RIGHT_ERROR = -4,
    RC_MISMATCH = -5,
    RC_BAD_ARGS = -6,
    RC_POLL = -7,
};

#define LOWAT_MAX (1 << 20) /* wake once per MiB of a segment, not per few packets */
#define MAGIC 0x6e6f6961u   /* "aion" */
#define VERSION 2u

typedef struct {
    uint32_t magic, version;
    uint64_t seq, count;
    uint32_t dtype, op; /* op: the OP_* code, plus 256 for a reduce-scatter */
    uint64_t check;     /* the caller's digest of the chunk bounds (0 for an allreduce's own) */
} Header;               /* 40 bytes, host order: both ends are this build on the same kind of host */

/* out[i] = a[i] op b[i] (out may be a or b). Integers wrap as numpy's do (unsigned arithmetic);
 * float min/max propagate NaN as numpy.minimum/maximum do. */
#define DEFINE_FLOAT_REDUCE(NAME, T)                                                              \
    static void NAME(int op, T *out, const T *a, const T *b, long len) {                          \
        long i;                                                                                   \
        switch (op) {                                                                             \
        case OP_SUM:                                                                              \
            for (i = 0; i < len; i++) out[i] = a[i] + b[i];                                       \
            break;                                                                                \
        case OP_PROD:                                                                             \
            for (i = 0; i < len; i++) out[i] = a[i] * b[i];                                       \
            break;                                                                                \
        case OP_MIN:                                                                              \
            for (i = 0; i < len; i++) {                                                           \
                T x = a[i], y = b[i];                                                             \
                out[i] = (x != x || x <= y) ? x : y;                                              \
            }                                                                                     \
            break;                                                                                \
        default:                                                                                  \
            for (i = 0; i < len; i++) {                                                           \
                T x = a[i], y = b[i];                                                             \
                out[i] = (x != x || x >= y) ? x : y;                                              \
            }                                                                                     \
        }                                                                                         \
    }

#define DEFINE_INT_REDUCE(NAME, T, U)                                                             \
    static void NAME(int op, T *out, const T *a, const T *b, long len) {                          \
        long i;                                                                                   \
        switch (op) {                                                                             \
        case OP_SUM:                                                                              \
            for (i = 0; i < len; i++) out[i] = (T)((U)a[i] + (U)b[i]);                            \
            break;                                                                                \
        case OP_PROD:                                                                             \
            for (i = 0; i < len; i++) out[i] = (T)((U)a[i] * (U)b[i]);                            \
            break;                                                                                \
        case OP_MIN:                                                                              \
            for (i = 0; i < len; i++) out[i] = a[i] <= b[i] ? a[i] : b[i];                        \
            break;                                                                                \
        default:                                                                                  \
            for (i = 0; i < len; i++) out[i] = a[i] >= b[i] ? a[i] : b[i];                        \
        }                                                                                         \
    }

DEFINE_FLOAT_REDUCE(reduce_f32, float)
DEFINE_FLOAT_REDUCE(reduce_f64, double)
DEFINE_INT_REDUCE(reduce_i32, int32_t, uint32_t)
DEFINE_INT_REDUCE(reduce_i64, int64_t, uint64_t)

static void reduce(int dt, int op, void *out, const void *a, const void *b, long len) {
    switch (dt) {
    case DT_F32:
        reduce_f32(op, out, a, b, len);
        break;
    case DT_F64:
        reduce_f64(op, out, a, b, len);
        break;
    case DT_I32:
        reduce_i32(op, out, a, b, len);
        break;
    default:
        reduce_i64(op, out, a, b, len);
    }
}

static long chunk_start(long count, int n, int c) {
    long q = count / n, r = count % n;
    return c * q + (c < r ? c : r);
}

static long chunk_len(long count, int n, int c) { return count / n + (c < count % n ? 1 : 0); }

static int mod(long a, int n) { return (int)(((a % n) + n) % n); }

/* Where chunk c (the schedule's number) lies: the caller's bounds, else near-equal chunks; the
 * schedule's chunk c is the caller's chunk c + rot. */
typedef struct {
    const long long *bounds; /* n + 1 element offsets, or NULL */
    long count;
    int n, rot;
} Chunks;

static long cstart(const Chunks *k, int c) {
    c = mod(c + k->rot, k->n);
    return k->bounds ? (long)k->bounds[c] : chunk_start(k->count, k->n, c);
}

static long clen(const Chunks *k, int c) {
    c = mod(c + k->rot, k->n);
    return k->bounds ? (long)(k->bounds[c + 1] - k->bounds[c]) : chunk_len(k->count, k->n, c);
}

static int aborted(int abort_fd) {
    struct pollfd p = {abort_fd, POLLIN, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
}

/* Move len bytes of a small record (the header), waiting on the abort pipe too. */
static int whole(int fd, char *buf, size_t len, int writing, int abort_fd, int *err) {
    while (len) {
        ssize_t k = writing ? send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) : recv(fd, buf, len, MSG_DONTWAIT);
        if (k > 0) {
            buf += k;
            len -= (size_t)k;
            continue;
        }
        if (k == 0 && !writing) return RC_LEFT_CLOSED;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            *err = errno;
            return writing ? RC_RIGHT_ERROR : RC_LEFT_ERROR;
        }
        struct pollfd p[2] = {{fd, writing ? POLLOUT : POLLIN, 0}, {abort_fd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR) {
            *err = errno;
            return RC_POLL;
        }
        if (p[1].revents) return RC_ABORTED;
    }
    return RC_OK;
}

static void set_lowat(int fd, int *cur, int want) {
    if (want != *cur && !setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want)) *cur = want;
}

/* The ring: reduce-scatter, then (phases 2) allgather. Returns RC_OK or a negative RC_*; *err is
 * errno where one applies, and peer[4] the left neighbour's header fields (seq, count, dtype, op)
 * on RC_MISMATCH. */
static int ring(int left, int right, int abort_fd, const void *x, void *res, void *scratch, long long count, int dtype,
                int op, int n, int rank, long long seg_items, unsigned long long seq, int phases, const long long *bounds,
                unsigned long long check, int *err, unsigned long long *peer) {
    *err = 0;
    if (n < 2 || rank < 0 || rank >= n || count < 0 || seg_items < 1 || dtype < DT_F32 || dtype > DT_I64 ||
        op < OP_SUM || op > OP_MAX || phases < 1 || phases > 2)
        return RC_BAD_ARGS;
    if (bounds) {
        if (bounds[0] != 0 || bounds[n] != count) return RC_BAD_ARGS;
        for (int c = 0; c < n; c++)
            if (bounds[c + 1] < bounds[c]) return RC_BAD_ARGS;
    }
    /* a reduce-scatter leaves rank r holding the caller's chunk r: the schedule ends on r + 1 */
    Chunks k = {bounds, (long)count, n, phases == 1 ? n - 1 : 0};
    if (aborted(abort_fd)) return RC_ABORTED;
    size_t isz = (dtype == DT_F32 || dtype == DT_I32) ? 4 : 8;
    int lowat = -1;
    set_lowat(left, &lowat, 1); /* the header is 40 bytes: a mark left high would never wake */
    uint32_t opk = (uint32_t)op + (phases == 1 ? 256u : 0u);
    Header mine = {MAGIC, VERSION, seq, (uint64_t)count, (uint32_t)dtype, opk, (uint64_t)check}, theirs;
    int rc = whole(right, (char *)&mine, sizeof mine, 1, abort_fd, err);
    if (rc == RC_OK) rc = whole(left, (char *)&theirs, sizeof theirs, 0, abort_fd, err);
    if (rc != RC_OK) return rc;
    if (theirs.magic != MAGIC || theirs.version != VERSION || theirs.seq != seq || theirs.count != (uint64_t)count ||
        theirs.dtype != (uint32_t)dtype || theirs.op != opk || theirs.check != (uint64_t)check) {
        peer[0] = theirs.seq;
        peer[1] = theirs.count;
        peer[2] = theirs.dtype;
        peer[3] = theirs.op;
        return theirs.magic != MAGIC || theirs.version != VERSION ? RC_LEFT_ERROR : RC_MISMATCH;
    }
    const char *xb = x;
    char *rb = res;
    int inplace = x == res;
    long maxc = 0;
    for (int c = 0; c < n; c++)
        if (clen(&k, c) > maxc) maxc = clen(&k, c);
    long per = maxc ? (maxc + seg_items - 1) / seg_items : 1; /* segments per chunk */
    long total = (long)phases * (n - 1) * per;
    long sent = 0, got = 0;
    size_t sent_bytes = 0, got_bytes = 0;
    while (sent < total || got < total) {
        /* where segment k of the stream sits: its chunk (send side or receive side), offset, length */
        long ks = sent, kg = got;
        long s_step = ks / per, s_j = ks % per, g_step = kg / per, g_j = kg % per;
        int can_send = sent < total && (sent < per || got > sent - per);
        long s_len = 0, s_off = 0, g_len = 0, g_off = 0;
        int s_chunk = 0, g_chunk = 0;
        if (can_send) {
            s_chunk = s_step < n - 1 ? mod(rank - s_step, n) : mod(rank + 1 - (s_step - (n - 1)), n);
            long cl = clen(&k, s_chunk), a = s_j * seg_items;
            s_len = a < cl ? (cl - a < seg_items ? cl - a : seg_items) : 0;
            s_off = cstart(&k, s_chunk) + a;
            if (s_len == 0) { /* an empty segment (short chunk): nothing to move */
                sent++;
                continue;
            }
        }
        if (got < total) {
            g_chunk = g_step < n - 1 ? mod(rank - g_step - 1, n) : mod(rank - (g_step - (n - 1)), n);
            long cl = clen(&k, g_chunk), a = g_j * seg_items;
            g_len = a < cl ? (cl - a < seg_items ? cl - a : seg_items) : 0;
            g_off = cstart(&k, g_chunk) + a;
            if (g_len == 0) {
                got++;
                continue;
            }
            long owed = g_len * (long)isz - (long)got_bytes;
            set_lowat(left, &lowat, owed > LOWAT_MAX ? LOWAT_MAX : (int)owed);
        }
        struct pollfd pf[3] = {{right, can_send ? POLLOUT : 0, 0}, {left, got < total ? POLLIN : 0, 0},
                               {abort_fd, POLLIN, 0}};
        if (poll(pf, 3, -1) < 0) {
            if (errno == EINTR) continue;
            *err = errno;
            rc = RC_POLL;
            break;
        }
        if (pf[2].revents) {
            rc = RC_ABORTED;
            break;
        }
        if (can_send && (pf[0].revents & (POLLOUT | POLLERR | POLLHUP))) {
            const char *src = (s_step == 0 ? xb : rb) + s_off * isz;
            size_t want = (size_t)s_len * isz;
            ssize_t k = send(right, src + sent_bytes, want - sent_bytes, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                *err = errno;
                rc = RC_RIGHT_ERROR;
                break;
            }
            if (k > 0 && (sent_bytes += (size_t)k) == want) {
                sent_bytes = 0;
                sent++;
            }
        }
        if (got < total && (pf[1].revents & (POLLIN | POLLHUP | POLLERR))) {
            int reducing = g_step < n - 1;
            char *dst = (reducing && inplace) ? (char *)scratch : rb + g_off * isz;
            size_t want = (size_t)g_len * isz;
            ssize_t k = recv(left, dst + got_bytes, want - got_bytes, MSG_DONTWAIT);
            if (k == 0) {
                rc = RC_LEFT_CLOSED;
                break;
            }
            if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                *err = errno;
                rc = RC_LEFT_ERROR;
                break;
            }
            if (k > 0 && (got_bytes += (size_t)k) == want) {
                got_bytes = 0;
                if (reducing) { /* the partial sum from the left, with this rank's own part */
                    char *out = rb + g_off * isz;
                    if (inplace)
                        reduce(dtype, op, out, out, dst, g_len);
                    else
                        reduce(dtype, op, out, out, xb + g_off * isz, g_len);
                }
                got++;
            }
        }
    }
    set_lowat(left, &lowat, 1);
    return rc;
}

/* The allreduce: res = the reduction of every rank's x (res may be x; in place, scratch holds a
 * segment). */
int aionet_ring_allreduce(int left, int right, int abort_fd, const void *x, void *res, void *scratch, long long count,
                          int dtype, int op, int n, int rank, long long seg_items, unsigned long long seq, int *err,
                          unsigned long long *peer) {
    return ring(left, right, abort_fd, x, res, scratch, count, dtype, op, n, rank, seg_items, seq, 2, NULL, 0, err,
                peer);
}

/* The reduce-scatter: rank r's chunk of res (bounds[r] to bounds[r + 1]) = the reduction of every
 * rank's x there; the rest of res is the call's scratch. res must not be x. check: the caller's
 * digest of the bounds, which every rank's must match. */
int aionet_ring_reduce_scatter(int left, int right, int abort_fd, const void *x, void *res, long long count, int dtype,
                               int op, int n, int rank, long long seg_items, unsigned long long seq,
                               const long long *bounds, unsigned long long check, int *err, unsigned long long *peer) {
    if (x == res || !bounds) return RC_BAD_ARGS;
    return ring(left, right, abort_fd, x, res, NULL, count, dtype, op, n, rank, seg_items, seq, 1, bounds, check, err,
                peer);
}

static struct PyModuleDef ring_module = {PyModuleDef_HEAD_INIT, "_ring", "aionet's native ring (loaded with ctypes)",
                                         -1, NULL};

PyMODINIT_FUNC PyInit__ring(void) { return PyModule_Create(&ring_module); }

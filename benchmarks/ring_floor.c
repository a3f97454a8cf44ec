/* A ring allreduce over TCP in C: the floor any implementation over this machine's sockets
 * stands on (benchmarks/collectives.py --impls cring builds and runs it).
 *
 * One thread per rank, non-blocking TCP_NODELAY sockets to the right neighbour and from the
 * left one on 127.0.0.1, poll() between them (gloo's shape). float32 sum: ring reduce-scatter
 * then ring allgather, each chunk cut in segments; a segment is forwarded as soon as it is
 * reduced (or, in the allgather, received), so the steps overlap. Out of place, a received
 * partial sum lands in its place in the result and is reduced there; in place it lands in a
 * scratch segment. The reduction is a plain loop the compiler vectorises (-O3 -march=native).
 * The arrays are 2 MiB-aligned and advised for transparent huge pages, as numpy's large arrays
 * are (measured: no difference in CPU per call here either way).
 *
 * Its CPU per call is the yardstick, not its wall time: this single-threaded poll loop leaves
 * the core idle for part of each call, where aionet's ranks measured busier.
 * While a segment is coming in, SO_RCVLOWAT asks the kernel to wake the rank once per 1 MiB
 * (or what is left of the segment), as aionet's tcp:// connections do for large frames.
 *
 *   ring_floor RANK N PORT0 SIZES_CSV ITERS SEGMENT_BYTES
 *
 * Rank r listens on PORT0 + r. For every size and variant (out of place, in place, alternated
 * call by call) every rank prints one line:
 *   RING <bytes> <variant> <cpu s> <minflt> <switches> <runq s> <wrong> <t1,t2,...>
 * (per-call sums over the timed calls; times in seconds, rank 0's are the ones reported).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
    perror(what);
    exit(2);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double runq(void) { /* seconds runnable but waiting for a CPU (schedstat) */
    FILE *f = fopen("/proc/self/schedstat", "r");
    unsigned long long run = 0, wait = 0;
    if (f) {
        if (fscanf(f, "%llu %llu", &run, &wait) != 2) wait = 0;
        fclose(f);
    }
    return wait * 1e-9;
}

static int iters_for(long nbytes, int base) { /* as collectives.py */
    long k = (long)((double)base * (1 << 20) / (nbytes > 0 ? nbytes : 1));
    if (k > base) k = base;
    return k < 3 ? 3 : (int)k;
}

static float *alloc_floats(long count) {
    /* 2 MiB-aligned and madvised for transparent huge pages, as numpy allocates large arrays */
    void *p = NULL;
    size_t bytes = ((size_t)count * 4 + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    if (posix_memalign(&p, 2u << 20, bytes)) die("posix_memalign");
    madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

static int nodelay(int fd) {
    int one = 1;
    return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void full(int fd, void *buf, size_t len, int writing) { /* blocking, for barriers */
    char *p = buf;
    while (len) {
        ssize_t k = writing ? send(fd, p, len, 0) : recv(fd, p, len, 0);
        if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
            struct pollfd pf = {fd, writing ? POLLOUT : POLLIN, 0};
            poll(&pf, 1, -1);
            continue;
        }
        if (k <= 0) die(writing ? "send" : "recv");
        p += k;
        len -= (size_t)k;
    }
}

typedef struct {
    int n, r, left, right;
} Ring;

enum { LOWAT = 1 << 20 };

static void barrier(Ring *g) { /* two laps of a token: every rank has entered */
    char b = 0;
    for (int lap = 0; lap < 2; lap++) {
        if (g->r == 0) {
            full(g->right, &b, 1, 1);
            full(g->left, &b, 1, 0);
        } else {
            full(g->left, &b, 1, 0);
            full(g->right, &b, 1, 1);
        }
    }
}

/* Segment k of a stream: which chunk, and where in it. */
typedef struct {
    long off, len; /* in floats */
} Seg;

static void allreduce(Ring *g, const float *x, float *res, float *scratch, long count, long seg_floats) {
    int n = g->n, r = g->r;
    long chunk = count / n; /* count is a multiple of n here */
    long per = (chunk + seg_floats - 1) / seg_floats; /* segments per chunk */
    long steps = 2L * (n - 1), total = steps * per;
    int inplace = (x == res);
    long sent = 0, sent_bytes = 0, got = 0, got_bytes = 0;
    int lowat = 1;
    while (sent < total || got < total) {
        if (got < total) {
            long j = got % per, len = (j == per - 1) ? chunk - j * seg_floats : seg_floats;
            long left = len * 4 - got_bytes;
            int want = left > LOWAT ? LOWAT : (int)left;
            if (want != lowat && !setsockopt(g->left, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want)) lowat = want;
        }
        /* outgoing segment `sent` is ready when the incoming one `per` segments before it is done */
        int can_send = sent < total && (sent < per || got > sent - per);
        int want_recv = got < total;
        struct pollfd pf[2] = {{g->right, can_send ? POLLOUT : 0, 0}, {g->left, want_recv ? POLLIN : 0, 0}};
        if (poll(pf, 2, -1) < 0 && errno != EINTR) die("poll");
        if (can_send && (pf[0].revents & POLLOUT)) {
            long s = sent / per, j = sent % per;
            long c = s < n - 1 ? ((r - s) % n + n) % n : ((r + 1 - (s - (n - 1))) % n + n) % n;
            long a = c * chunk + j * seg_floats, len = (j == per - 1) ? chunk - j * seg_floats : seg_floats;
            const float *src = (s == 0) ? x + a : res + a;
            for (;;) {
                ssize_t k = send(g->right, (const char *)src + sent_bytes, len * 4 - sent_bytes, MSG_DONTWAIT);
                if (k < 0) {
                    if (errno == EAGAIN || errno == EINTR) break;
                    die("send");
                }
                sent_bytes += k;
                if (sent_bytes == len * 4) {
                    sent_bytes = 0;
                    sent++;
                    break;
                }
            }
        }
        if (want_recv && (pf[1].revents & (POLLIN | POLLHUP | POLLERR))) {
            for (;;) {
                long s = got / per, j = got % per;
                long c = s < n - 1 ? ((r - s - 1) % n + n) % n : ((r - (s - (n - 1))) % n + n) % n;
                long a = c * chunk + j * seg_floats, len = (j == per - 1) ? chunk - j * seg_floats : seg_floats;
                int reduce = s < n - 1;
                float *dst = (reduce && inplace) ? scratch : res + a;
                ssize_t k = recv(g->left, (char *)dst + got_bytes, len * 4 - got_bytes, MSG_DONTWAIT);
                if (k < 0) {
                    if (errno == EAGAIN || errno == EINTR) break;
                    die("recv");
                }
                if (k == 0) die("peer closed");
                got_bytes += k;
                if (got_bytes < len * 4) continue;
                got_bytes = 0;
                if (reduce) {
                    float *out = res + a;
                    const float *mine = x + a;
                    if (inplace)
                        for (long i = 0; i < len; i++) out[i] += dst[i];
                    else
                        for (long i = 0; i < len; i++) out[i] += mine[i];
                }
                got++;
                if (got == total) break;
            }
        }
    }
    int unit = 1; /* the barrier's single bytes must wake it */
    if (lowat != 1) setsockopt(g->left, SOL_SOCKET, SO_RCVLOWAT, &unit, sizeof unit);
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s RANK N PORT0 SIZES_CSV ITERS SEGMENT_BYTES\n", argv[0]);
        return 2;
    }
    Ring g = {.r = atoi(argv[1]), .n = atoi(argv[2])};
    int port0 = atoi(argv[3]), base = atoi(argv[5]);
    long seg_floats = atol(argv[6]) / 4;
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    addr.sin_port = htons((unsigned short)(port0 + g.r));
    if (bind(ls, (struct sockaddr *)&addr, sizeof addr) || listen(ls, 4)) die("listen");
    g.right = socket(AF_INET, SOCK_STREAM, 0);
    addr.sin_port = htons((unsigned short)(port0 + (g.r + 1) % g.n));
    double deadline = now() + 30;
    while (connect(g.right, (struct sockaddr *)&addr, sizeof addr)) {
        if (now() > deadline) die("connect");
        close(g.right);
        g.right = socket(AF_INET, SOCK_STREAM, 0);
        usleep(10000);
    }
    if ((g.left = accept(ls, NULL, NULL)) < 0) die("accept");
    close(ls);
    nodelay(g.left);
    nodelay(g.right);
    char *sizes = strdup(argv[4]);
    for (char *tok = strtok(sizes, ","); tok; tok = strtok(NULL, ",")) {
        long nbytes = atol(tok);
        long count = nbytes / 4 / g.n * g.n;
        if (count < g.n) count = g.n;
        float *x = alloc_floats(count), *y = alloc_floats(count), *scratch = alloc_floats(seg_floats + 1);
        for (long i = 0; i < count; i++) x[i] = y[i] = 1.0f;
        long seg = seg_floats < count / g.n ? seg_floats : count / g.n;
        int k = iters_for(count * 4, base);
        double *times[2] = {malloc(k * sizeof(double)), malloc(k * sizeof(double))};
        double cpu[2] = {0}, minflt[2] = {0}, csw[2] = {0}, rq[2] = {0};
        long wrong[2] = {0};
        allreduce(&g, x, y, scratch, count, seg); /* warm-up */
        for (int i = 0; i < 2 * k; i++) {
            int v = i % 2; /* 0: out of place, 1: in place */
            if (v == 1)
                for (long e = 0; e < count; e++) y[e] = 1.0f; /* untimed reset, as the other workers */
            double q0 = runq();
            barrier(&g);
            struct rusage u0, u1;
            getrusage(RUSAGE_SELF, &u0);
            double t = now();
            allreduce(&g, v ? y : x, y, scratch, count, seg);
            times[v][i / 2] = now() - t;
            getrusage(RUSAGE_SELF, &u1);
            cpu[v] += (u1.ru_utime.tv_sec - u0.ru_utime.tv_sec) + (u1.ru_utime.tv_usec - u0.ru_utime.tv_usec) * 1e-6 +
                      (u1.ru_stime.tv_sec - u0.ru_stime.tv_sec) + (u1.ru_stime.tv_usec - u0.ru_stime.tv_usec) * 1e-6;
            minflt[v] += u1.ru_minflt - u0.ru_minflt;
            csw[v] += (u1.ru_nvcsw - u0.ru_nvcsw) + (u1.ru_nivcsw - u0.ru_nivcsw);
            rq[v] += runq() - q0;
            for (long e = 0; e < count; e++) wrong[v] += y[e] != (float)g.n;
        }
        for (int v = 0; v < 2; v++) {
            printf("RING %ld %s %.9f %.1f %.1f %.9f %ld ", count * 4, v ? "inplace" : "out", cpu[v] / k, minflt[v] / k,
                   csw[v] / k, rq[v] / k, wrong[v]);
            for (int i = 0; i < k; i++) printf(i ? ",%.9f" : "%.9f", times[v][i]);
            printf("\n");
        }
        fflush(stdout);
        free(times[0]);
        free(times[1]);
        free(x);
        free(y);
        free(scratch);
        barrier(&g);
    }
    free(sizes);
    close(g.left);
    close(g.right);
    return 0;
}

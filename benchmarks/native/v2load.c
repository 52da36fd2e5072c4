/* A closed-loop load generator for v2 inference requests: benchmarks/loadgen.py's `http` (HTTP/1.1,
 * binary tensors) and `grpc` (ModelInfer over HTTP/2) protocols, in C, so that on a machine whose
 * cores the client shares with the server it measures, the client costs its system calls and little
 * else (docs/benchmarks.md, section 1's setup).
 *
 * Same semantics as loadgen.py's _closed_loop: C workers on one keep-alive connection each, each
 * sending the request (built once, by Python, into --request: the whole HTTP request, or the gRPC
 * message with its 5-byte prefix and, in --headers-block, its HPACK block) as soon as the previous answer is
 * read; answers that arrive inside the measuring window (after --warmup, --seconds long) count; no
 * request starts after the window or past --max-requests; a failed request is followed by a 10 ms
 * pause; a connection that fails or times out is dropped and opened again for the next request.
 * With --reference (raw little-endian float32), every answer's binary output is compared with it
 * within --atol: over HTTP the binary output after a JSON header that names --output, over gRPC the
 * ModelInferResponse's output named --output (its raw_output_contents, else its fp32_contents).
 *
 * gRPC (RFC 9113, gRPC over HTTP/2), what a closed-loop worker needs and no more, as
 * benchmarks/h2client.py: one call at a time per connection, the server's windows and frame size
 * honoured, PINGs and SETTINGS acknowledged, the received DATA given back to the connection window
 * after each call. Header blocks are not decoded (no HPACK decoder here): a call that ends without
 * a message is an error whose gRPC status is not read, and one that ends with a message is judged
 * by the message.
 *
 * Prints one JSON object: the window's latencies (ms), each worker's answers, the times of its
 * first and last (s, from the window's start) and the sum of its answered requests' shares of the
 * window (loadgen.window_share: the part of [sent, answered] inside the window), errors, up to five error messages, the window's
 * length and the process's CPU time inside it. Python turns it into a LoadResult.
 *
 * One thread, epoll, edge-triggered; loopback only (the caller checks the address). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum state { WAITING, BUSY, DONE };

struct seg { /* a piece of output waiting to be written: p[0..n), or own[0..n) when p is NULL */
    const char *p;
    size_t n;
    unsigned char own[17];
};

struct conn {
    int fd;
    enum state state;
    double t0;      /* when the request in flight started */
    double wake;    /* WAITING: when the next request may start */
    size_t sent;    /* bytes of the request written so far */
    char *buf;      /* bytes read and not yet consumed */
    size_t len, cap;
    long answers;   /* inside the window */
    double first, last;
    double shares;  /* answered requests' parts inside the window, each over its own length */
    /* gRPC over HTTP/2 */
    struct seg *out; /* output not yet written, from out[head] on, out_off bytes of it written */
    size_t out_n, out_cap, head, out_off;
    long conn_window, stream_window, stream_window_initial, frame_max;
    uint32_t stream, next_stream; /* the call in flight (0: none), the next call's */
    int headers_sent, ending, goaway;
    char *msg; /* the answer's DATA */
    size_t msg_len, msg_cap, unreturned;
};

static const char *request;
static size_t request_len;
static float *reference;
static size_t reference_n;
static double atol_;
static const char *atol_text = "0.0001";
static char output_name[256]; /* the output's name as its JSON string, quotes included */
static const char *output_plain = "";
static int grpc_mode;
static const char *h2_block; /* the request's HPACK block, the same for every call */
static size_t h2_block_len;
static unsigned char h2_hello[64]; /* the preface, SETTINGS and the connection's WINDOW_UPDATE */
static size_t h2_hello_len;
static struct sockaddr_in addr;
static double timeout_s = 60.0;

static double *lat;
static size_t lat_n, lat_cap;
static long n_errors, sent_total, max_requests = 200000;
static char samples[5][256];
static int n_samples;
static double t_measure, t_end;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec * 1e-6;
}

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("v2load: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) die("cannot stat %s: %s", path, strerror(errno));
    char *data = malloc((size_t)st.st_size + 1);
    if (!data || fread(data, 1, (size_t)st.st_size, f) != (size_t)st.st_size) die("cannot read %s", path);
    fclose(f);
    *n = (size_t)st.st_size;
    return data;
}

/* ---- one answer ------------------------------------------------------------------------------ */

struct answer {
    int status;
    int keep_alive;
    long header_length; /* Inference-Header-Content-Length, -1 if absent */
    const char *body;
    size_t body_len;
    char *owned; /* a chunked body, joined */
};

static int header_is(const char *line, size_t n, const char *name, const char **value, size_t *vlen) {
    size_t k = strlen(name);
    if (n <= k || line[k] != ':' || strncasecmp(line, name, k) != 0) return 0;
    const char *v = line + k + 1, *end = line + n;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t')) end--;
    *value = v;
    *vlen = (size_t)(end - v);
    return 1;
}

static long parse_long(const char *s, size_t n, int base) {
    if (n == 0 || n > 18) return -1;
    char tmp[20];
    memcpy(tmp, s, n);
    tmp[n] = 0;
    char *end;
    long v = strtol(tmp, &end, base);
    return (*end == 0 && v >= 0) ? v : -1;
}

/* A chunked body that starts at `p` (n bytes available): its length in the stream once complete,
 * 0 while incomplete, -1 when malformed; the joined data goes to *out. */
static long chunked(const char *p, size_t n, char **out, size_t *out_len) {
    size_t at = 0, joined = 0;
    char *data = NULL;
    for (;;) {
        const char *eol = memmem(p + at, n - at, "\r\n", 2);
        if (!eol) break;
        size_t line = (size_t)(eol - (p + at));
        const char *semi = memchr(p + at, ';', line);
        long size = parse_long(p + at, semi ? (size_t)(semi - (p + at)) : line, 16);
        if (size < 0) { free(data); return -1; }
        at += line + 2;
        if (size == 0) { /* trailers, then a blank line */
            for (;;) {
                const char *e = memmem(p + at, n - at, "\r\n", 2);
                if (!e) { free(data); return 0; }
                size_t l = (size_t)(e - (p + at));
                at += l + 2;
                if (l == 0) { *out = data; *out_len = joined; return (long)at; }
            }
        }
        if (n - at < (size_t)size + 2) break;
        char *grown = realloc(data, joined + (size_t)size + 1);
        if (!grown) die("out of memory");
        data = grown;
        memcpy(data + joined, p + at, (size_t)size);
        joined += (size_t)size;
        at += (size_t)size;
        if (p[at] != '\r' || p[at + 1] != '\n') { free(data); return -1; }
        at += 2;
    }
    free(data);
    return 0;
}

/* Parse one answer at the start of c->buf: its length in bytes when complete, 0 while incomplete
 * (or, with `eof`, never to complete: -1), -1 when it cannot be parsed. */
static long parse(struct conn *c, struct answer *a, int eof) {
    const char *head_end = memmem(c->buf, c->len, "\r\n\r\n", 4);
    if (!head_end) return (c->len > 65536 || eof) ? -1 : 0;
    size_t head = (size_t)(head_end - c->buf) + 4;
    const char *p = c->buf;
    if (head < 12 || strncmp(p, "HTTP/1.", 7) != 0) return -1;
    a->status = (int)parse_long(p + 9, 3, 10);
    if (a->status < 100) return -1;
    int http10 = p[7] == '0';
    a->keep_alive = !http10;
    a->header_length = -1;
    a->owned = NULL;
    long content_length = -1;
    int is_chunked = 0;
    const char *line = memchr(p, '\n', head) + 1;
    while (line < head_end) {
        const char *eol = memmem(line, (size_t)(head_end + 2 - line), "\r\n", 2);
        size_t n = (size_t)(eol - line);
        const char *v;
        size_t vl;
        if (header_is(line, n, "content-length", &v, &vl)) {
            if ((content_length = parse_long(v, vl, 10)) < 0) return -1;
        } else if (header_is(line, n, "transfer-encoding", &v, &vl)) {
            is_chunked = vl >= 7 && strncasecmp(v + vl - 7, "chunked", 7) == 0;
        } else if (header_is(line, n, "inference-header-content-length", &v, &vl)) {
            if ((a->header_length = parse_long(v, vl, 10)) < 0) return -1;
        } else if (header_is(line, n, "connection", &v, &vl)) {
            if (vl == 5 && strncasecmp(v, "close", 5) == 0) a->keep_alive = 0;
            if (vl == 10 && strncasecmp(v, "keep-alive", 10) == 0) a->keep_alive = 1;
        }
        line = eol + 2;
    }
    if (a->status == 204 || a->status == 304) content_length = 0;
    if (is_chunked) {
        size_t joined = 0;
        long used = chunked(c->buf + head, c->len - head, &a->owned, &joined);
        if (used <= 0) return (used < 0 || eof) ? -1 : 0;
        a->body = a->owned ? a->owned : "";
        a->body_len = joined;
        return (long)head + used;
    }
    if (content_length < 0) { /* the body ends with the connection */
        if (!eof) return 0;
        a->keep_alive = 0;
        a->body = c->buf + head;
        a->body_len = c->len - head;
        return (long)c->len;
    }
    if (c->len - head < (size_t)content_length) return eof ? -1 : 0;
    a->body = c->buf + head;
    a->body_len = (size_t)content_length;
    return (long)(head + (size_t)content_length);
}

static const char *check_values(const char *data, size_t bytes, char *why, size_t n);

/* Why the answer is wrong, or NULL: its binary output against the reference. */
static const char *check(const struct answer *a, char *why, size_t n) {
    if (a->status != 200) {
        snprintf(why, n, "HTTP %d", a->status);
        return why;
    }
    if (!reference) return NULL;
    if (a->header_length < 0 || (size_t)a->header_length > a->body_len) {
        snprintf(why, n, "undecodable answer: no binary output (the native client checks binary answers only)");
        return why;
    }
    if (!memmem(a->body, (size_t)a->header_length, output_name, strlen(output_name))) {
        snprintf(why, n, "answer has no output %.200s", output_name);
        return why;
    }
    return check_values(a->body + a->header_length, a->body_len - (size_t)a->header_length, why, n);
}

/* Why `bytes` bytes of little-endian float32 at `data` are not the reference's values, or NULL. */
static const char *check_values(const char *data, size_t bytes, char *why, size_t n) {
    if (bytes != reference_n * 4) {
        snprintf(why, n, "wrong answer: %zu values, expected %zu", bytes / 4, reference_n);
        return why;
    }
    double err = 0;
    for (size_t i = 0; i < reference_n; i++) {
        float v;
        memcpy(&v, data + 4 * i, 4);
        double d = fabs((double)v - (double)reference[i]);
        if (!(d <= err)) err = d; /* a NaN is the largest error */
    }
    if (err <= atol_) return NULL;
    snprintf(why, n, "wrong answer: max abs error %.3g > %s", err, atol_text);
    return why;
}

/* ---- a gRPC answer: the ModelInferResponse's output ------------------------------------------- */

/* One field of a protobuf message at *p (before end): its number and wire type, and for a
 * length-delimited field its bytes; the position after it. NULL when malformed. */
static const unsigned char *pb_field(const unsigned char *p, const unsigned char *end, uint64_t *number,
                                     int *wire, const unsigned char **data, size_t *len) {
    uint64_t key = 0, v = 0;
    for (int shift = 0;; shift += 7) {
        if (p >= end || shift > 63) return NULL;
        key |= (uint64_t)(*p & 0x7f) << shift;
        if (!(*p++ & 0x80)) break;
    }
    *number = key >> 3;
    *wire = (int)(key & 7);
    switch (*wire) {
    case 0:
        for (;;) {
            if (p >= end) return NULL;
            if (!(*p++ & 0x80)) break;
        }
        return p;
    case 1:
        return end - p >= 8 ? p + 8 : NULL;
    case 5:
        *data = p;
        *len = 4;
        return end - p >= 4 ? p + 4 : NULL;
    case 2:
        for (int shift = 0;; shift += 7) {
            if (p >= end || shift > 63) return NULL;
            v |= (uint64_t)(*p & 0x7f) << shift;
            if (!(*p++ & 0x80)) break;
        }
        if (v > (uint64_t)(end - p)) return NULL;
        *data = p;
        *len = (size_t)v;
        return p + v;
    default:
        return NULL;
    }
}

/* The last length-delimited field `number` of the message p[0..end): 1 with its bytes in *data and
 * *len, 0 when there is none, -1 when the message is malformed. */
static int pb_last(const unsigned char *p, const unsigned char *end, uint64_t number, const unsigned char **data,
                   size_t *len) {
    int found = 0;
    while (p < end) {
        uint64_t num;
        int wire;
        const unsigned char *d = NULL;
        size_t l = 0;
        if (!(p = pb_field(p, end, &num, &wire, &d, &l))) return -1;
        if (num == number && wire == 2) *data = d, *len = l, found = 1;
    }
    return found;
}

/* Why the gRPC message m[0..n) (its 5-byte prefix included) is not a right answer, or NULL. */
static const char *check_grpc(const char *m, size_t n, char *why, size_t wn) {
    if (n == 0) {
        snprintf(why, wn, "GrpcCallError: the call ended without a message (a gRPC status other than OK;"
                          " the native client does not decode it)");
        return why;
    }
    if (n < 5 || m[0] != 0 || ((size_t)(unsigned char)m[1] << 24 | (size_t)(unsigned char)m[2] << 16 |
                               (size_t)(unsigned char)m[3] << 8 | (size_t)(unsigned char)m[4]) != n - 5) {
        snprintf(why, wn, "GrpcCallError: a malformed or compressed gRPC message of %zu bytes", n);
        return why;
    }
    if (n == 5) {
        snprintf(why, wn, "empty ModelInferResponse");
        return why;
    }
    if (!reference) return NULL;
    const unsigned char *p = (const unsigned char *)m + 5, *end = (const unsigned char *)m + n;
    const unsigned char *outputs[64], *raws[64];
    size_t out_len[64], raw_len[64];
    int n_out = 0, n_raw = 0;
    while (p < end) {
        uint64_t num;
        int wire;
        const unsigned char *d = NULL;
        size_t l = 0;
        if (!(p = pb_field(p, end, &num, &wire, &d, &l))) goto malformed;
        if (wire != 2) continue;
        if (num == 5 && n_out < 64) outputs[n_out] = d, out_len[n_out++] = l;
        if (num == 6 && n_raw < 64) raws[n_raw] = d, raw_len[n_raw++] = l;
    }
    for (int i = 0; i < n_out; i++) {
        const unsigned char *qend = outputs[i] + out_len[i], *name = NULL, *contents = NULL;
        size_t name_len = 0, contents_len = 0;
        int has_name = pb_last(outputs[i], qend, 1, &name, &name_len);
        int has_contents = pb_last(outputs[i], qend, 5, &contents, &contents_len);
        if (has_name < 0 || has_contents < 0) goto malformed;
        if (!has_name || name_len != strlen(output_plain) || memcmp(name, output_plain, name_len) != 0) continue;
        if (i < n_raw) return check_values((const char *)raws[i], raw_len[i], why, wn);
        /* fp32_contents (field 6 of InferTensorContents), packed or not */
        size_t cap = contents_len, got = 0;
        char *values = malloc(cap + 4);
        if (!values) die("out of memory");
        for (const unsigned char *r = contents, *rend = contents + contents_len; r && r < rend;) {
            uint64_t num;
            int wire;
            const unsigned char *d = NULL;
            size_t l = 0;
            if (!(r = pb_field(r, rend, &num, &wire, &d, &l))) {
                free(values);
                goto malformed;
            }
            if (num == 6 && (wire == 2 || wire == 5) && got + l <= cap + 4) {
                memcpy(values + got, d, l);
                got += l;
            }
        }
        const char *bad = check_values(values, got, why, wn);
        free(values);
        return bad;
    }
    snprintf(why, wn, "answer has no output %.200s", output_name);
    return why;
malformed:
    snprintf(why, wn, "undecodable answer: a malformed ModelInferResponse");
    return why;
}

/* ---- the workers ------------------------------------------------------------------------------ */

static int ep;

static void drop(struct conn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->len = 0;
    c->head = c->out_n = c->out_off = 0;
    c->stream = 0;
}

static void finish(struct conn *c, int ok, const char *why) {
    double t1 = now();
    if (!ok && why && n_samples < 5) snprintf(samples[n_samples++], sizeof samples[0], "%s", why);
    if (ok) { /* loadgen.window_share */
        double lo = fmax(c->t0, t_measure), hi = fmin(t1, t_end);
        if (t1 > c->t0) c->shares += hi > lo ? (hi - lo) / (t1 - c->t0) : 0.0;
        else if (t_measure <= t1 && t1 <= t_end) c->shares += 1.0;
    }
    if (t_measure <= t1 && t1 <= t_end) {
        if (ok) {
            if (lat_n == lat_cap) {
                lat_cap = lat_cap ? 2 * lat_cap : 65536;
                lat = realloc(lat, lat_cap * sizeof *lat);
                if (!lat) die("out of memory");
            }
            lat[lat_n++] = (t1 - c->t0) * 1e3;
            if (!c->answers) c->first = t1 - t_measure;
            c->last = t1 - t_measure;
            c->answers++;
        } else {
            n_errors++;
        }
    }
    c->state = WAITING;
    c->wake = ok ? t1 : t1 + 0.01; /* a failing server is not hammered */
}

/* ---- HTTP/2 for gRPC ----------------------------------------------------------------------------- */

enum { H2_DATA = 0, H2_HEADERS = 1, H2_RST_STREAM = 3, H2_SETTINGS = 4, H2_PING = 6, H2_GOAWAY = 7,
       H2_WINDOW_UPDATE = 8, H2_CONTINUATION = 9 };
enum { END_STREAM = 0x1, ACK = 0x1, END_HEADERS = 0x4, PADDED = 0x8 };
enum { SETTINGS_ENABLE_PUSH = 0x2, SETTINGS_INITIAL_WINDOW_SIZE = 0x4, SETTINGS_MAX_FRAME_SIZE = 0x5 };
#define RECEIVE_WINDOW 0x7fffffffu /* what the client lets the server send, per stream and in all */

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void frame_head(unsigned char *h, size_t len, int type, int flags, uint32_t stream) {
    h[0] = (unsigned char)(len >> 16), h[1] = (unsigned char)(len >> 8), h[2] = (unsigned char)len;
    h[3] = (unsigned char)type, h[4] = (unsigned char)flags;
    put32(h + 5, stream & 0x7fffffffu);
}

/* Queue p[0..n) for writing (not copied), or, with p NULL, own[0..n) (n <= 17, copied). */
static void q_put(struct conn *c, const char *p, const unsigned char *own, size_t n) {
    if (c->out_n == c->out_cap) {
        c->out_cap = c->out_cap ? 2 * c->out_cap : 64;
        c->out = realloc(c->out, c->out_cap * sizeof *c->out);
        if (!c->out) die("out of memory");
    }
    struct seg *g = &c->out[c->out_n++];
    g->p = p;
    g->n = n;
    if (!p) memcpy(g->own, own, n);
}

/* Queue a frame: its header, then `payload` (copied, at most 8 bytes) or nothing. */
static void q_frame(struct conn *c, size_t len, int type, int flags, uint32_t stream, const unsigned char *payload,
                    size_t copied) {
    unsigned char f[17];
    frame_head(f, len, type, flags, stream);
    if (copied) memcpy(f + 9, payload, copied);
    q_put(c, NULL, f, 9 + copied);
}

/* Write what is queued, as far as the socket takes it now; -1 on a failed write. */
static int flush(struct conn *c) {
    while (c->head < c->out_n) {
        struct iovec iov[64];
        int k = 0;
        for (size_t i = c->head; i < c->out_n && k < 64; i++, k++) {
            struct seg *g = &c->out[i];
            const char *base = g->p ? g->p : (const char *)g->own;
            size_t off = i == c->head ? c->out_off : 0;
            iov[k].iov_base = (void *)(base + off);
            iov[k].iov_len = g->n - off;
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)k};
        ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
        }
        for (size_t left = (size_t)w; left && c->head < c->out_n;) {
            size_t rest = c->out[c->head].n - c->out_off;
            if (left >= rest) {
                left -= rest;
                c->head++;
                c->out_off = 0;
            } else {
                c->out_off += left;
                left = 0;
            }
        }
    }
    c->head = c->out_n = c->out_off = 0;
    return 0;
}

/* Queue the call's HEADERS and as much of its message as the server's windows allow. */
static void h2_send_more(struct conn *c) {
    if (c->state != BUSY || !c->stream) return;
    if (!c->headers_sent) {
        q_frame(c, h2_block_len, H2_HEADERS, END_HEADERS, c->stream, NULL, 0);
        q_put(c, h2_block, NULL, h2_block_len);
        c->headers_sent = 1;
    }
    while (c->sent < request_len) {
        long room = (long)(request_len - c->sent);
        if (c->conn_window < room) room = c->conn_window;
        if (c->stream_window < room) room = c->stream_window;
        if (c->frame_max < room) room = c->frame_max;
        if (room <= 0) break;
        int last = c->sent + (size_t)room == request_len;
        q_frame(c, (size_t)room, H2_DATA, last ? END_STREAM : 0, c->stream, NULL, 0);
        q_put(c, request + c->sent, NULL, (size_t)room);
        c->sent += (size_t)room;
        c->conn_window -= room;
        c->stream_window -= room;
    }
}

/* Read the frames in c->buf: 1 once the call in flight has ended (its message in c->msg), 2 when
 * the server reset it (why says so), 0 while it goes on, -1 on a protocol error. */
static int h2_frames(struct conn *c, char *why, size_t wn) {
    size_t pos = 0;
    int done = 0;
    while (c->len - pos >= 9) {
        const unsigned char *h = (const unsigned char *)c->buf + pos;
        size_t len = (size_t)h[0] << 16 | (size_t)h[1] << 8 | h[2];
        if (c->len - pos < 9 + len) break;
        int type = h[3], flags = h[4];
        uint32_t stream = be32(h + 5) & 0x7fffffffu;
        const unsigned char *pl = h + 9;
        int ours = c->stream && stream == c->stream;
        pos += 9 + len;
        switch (type) {
        case H2_DATA:
            c->unreturned += len;
            if (flags & PADDED) {
                if (len < 1 || (size_t)pl[0] >= len) return -1;
                len = len - 1 - pl[0], pl++;
            }
            if (!ours) break;
            if (c->msg_len + len > c->msg_cap) {
                c->msg_cap = 2 * (c->msg_len + len);
                c->msg = realloc(c->msg, c->msg_cap);
                if (!c->msg) die("out of memory");
            }
            memcpy(c->msg + c->msg_len, pl, len);
            c->msg_len += len;
            if (flags & END_STREAM) done = done ? done : 1;
            break;
        case H2_HEADERS:
            if (ours && (flags & END_STREAM)) {
                if (flags & END_HEADERS) done = done ? done : 1;
                else c->ending = 1;
            }
            break;
        case H2_CONTINUATION:
            if (ours && c->ending && (flags & END_HEADERS)) done = done ? done : 1;
            break;
        case H2_SETTINGS:
            if (flags & ACK) break;
            for (size_t i = 0; i + 6 <= len; i += 6) {
                unsigned id = (unsigned)pl[i] << 8 | pl[i + 1];
                uint32_t value = be32(pl + i + 2);
                if (id == SETTINGS_MAX_FRAME_SIZE) c->frame_max = value;
                if (id == SETTINGS_INITIAL_WINDOW_SIZE) {
                    c->stream_window += (long)value - c->stream_window_initial;
                    c->stream_window_initial = value;
                }
            }
            q_frame(c, 0, H2_SETTINGS, ACK, 0, NULL, 0);
            break;
        case H2_WINDOW_UPDATE:
            if (len < 4) return -1;
            if (stream == 0) c->conn_window += be32(pl) & 0x7fffffffu;
            else if (ours) c->stream_window += be32(pl) & 0x7fffffffu;
            break;
        case H2_PING:
            if (!(flags & ACK) && len == 8) q_frame(c, 8, H2_PING, ACK, 0, pl, 8);
            break;
        case H2_RST_STREAM:
            if (ours && !done) {
                snprintf(why, wn, "GrpcCallError: the server reset the stream (error %u)", len >= 4 ? be32(pl) : 0);
                done = 2;
            }
            break;
        case H2_GOAWAY:
            c->goaway = 1; /* no new calls here; the one in flight may still end */
            break;
        default:
            break;
        }
    }
    memmove(c->buf, c->buf + pos, c->len - pos);
    c->len -= pos;
    return done;
}

/* ---- both protocols ------------------------------------------------------------------------------ */

static void pump(struct conn *c, int eof);

static void start(struct conn *c) {
    double t = now();
    if (sent_total >= max_requests || t >= t_end) {
        c->state = DONE;
        drop(c);
        return;
    }
    sent_total++;
    c->t0 = t;
    c->state = BUSY;
    c->sent = 0;
    if (c->fd >= 0 && c->goaway) drop(c); /* the server said it takes no new calls here */
    if (c->fd < 0) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) die("socket: %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
            char why[128];
            snprintf(why, sizeof why, "ConnectionError: connect: %s", strerror(errno));
            close(fd);
            finish(c, 0, why);
            return;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = c};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll_ctl: %s", strerror(errno));
        c->fd = fd;
        c->len = 0;
        if (grpc_mode) {
            c->conn_window = c->stream_window_initial = 65535;
            c->frame_max = 16384;
            c->next_stream = 1;
            c->goaway = 0;
            c->unreturned = 0;
            q_put(c, (const char *)h2_hello, NULL, h2_hello_len);
        }
    }
    if (grpc_mode) {
        c->stream = c->next_stream;
        c->next_stream += 2;
        c->stream_window = c->stream_window_initial;
        c->headers_sent = c->ending = 0;
        c->msg_len = 0;
    }
    pump(c, 0);
}

/* Read what has come (1 at the end of the stream). */
static int receive(struct conn *c) {
    for (;;) {
        if (c->cap - c->len < 65536) {
            c->cap = c->cap ? 2 * c->cap : 262144;
            c->buf = realloc(c->buf, c->cap);
            if (!c->buf) die("out of memory");
        }
        ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (r > 0) {
            c->len += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        return r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    }
}

static void fail_connection(struct conn *c, const char *why) {
    int busy = c->state == BUSY;
    drop(c);
    if (busy) finish(c, 0, why);
}

/* gRPC: write what the windows allow, read the frames, and end the call when its stream ends. */
static void pump_grpc(struct conn *c, int eof) {
    char why[256];
    h2_send_more(c);
    if (flush(c) < 0) {
        snprintf(why, sizeof why, "ConnectionError: send: %s", strerror(errno));
        fail_connection(c, why);
        return;
    }
    eof |= receive(c);
    int done = h2_frames(c, why, sizeof why);
    if (done < 0) {
        fail_connection(c, "ConnectionError: an HTTP/2 protocol error");
        return;
    }
    if (done && c->state == BUSY) {
        const char *bad = done == 2 ? why : check_grpc(c->msg, c->msg_len, why, sizeof why);
        c->stream = 0;
        if (c->unreturned) { /* give the connection window back */
            unsigned char grow[4];
            put32(grow, (uint32_t)c->unreturned);
            q_frame(c, 4, H2_WINDOW_UPDATE, 0, 0, grow, 4);
            c->unreturned = 0;
        }
        if (flush(c) < 0 || c->goaway || eof) drop(c);
        finish(c, bad == NULL, bad);
        return;
    }
    h2_send_more(c); /* the frames may have opened a window */
    if (flush(c) < 0) {
        snprintf(why, sizeof why, "ConnectionError: send: %s", strerror(errno));
        fail_connection(c, why);
        return;
    }
    if (eof) fail_connection(c, "ConnectionError: the connection closed");
}

/* Write what is left of the request and read what has come, as far as the socket allows now. */
static void pump(struct conn *c, int eof) {
    if (grpc_mode) {
        pump_grpc(c, eof);
        return;
    }
    while (c->state == BUSY && c->sent < request_len) {
        ssize_t w = send(c->fd, request + c->sent, request_len - c->sent, MSG_NOSIGNAL);
        if (w > 0) {
            c->sent += (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break;
        } else {
            char why[128];
            snprintf(why, sizeof why, "ConnectionError: send: %s", strerror(errno));
            drop(c);
            finish(c, 0, why);
            return;
        }
    }
    if (c->fd < 0) return;
    eof |= receive(c);
    if (c->state != BUSY) { /* an idle connection: it may only close */
        if (eof) drop(c);
        return;
    }
    struct answer a;
    long used = parse(c, &a, eof);
    if (used == 0 && !eof) return;
    if (used < 0) {
        drop(c);
        finish(c, 0, c->len ? "ConnectionError: unparseable answer" : "ConnectionError: the server closed the connection");
        return;
    }
    char why[256];
    const char *bad = check(&a, why, sizeof why);
    free(a.owned);
    memmove(c->buf, c->buf + used, c->len - (size_t)used);
    c->len -= (size_t)used;
    if (!a.keep_alive || eof) drop(c);
    finish(c, bad == NULL, bad);
}

static const char *arg(int argc, char **argv, const char *name, const char *fallback) {
    for (int i = 1; i + 1 < argc; i += 2)
        if (strcmp(argv[i], name) == 0) return argv[i + 1];
    if (!fallback) die("%s is required", name);
    return fallback;
}

int main(int argc, char **argv) {
    if (argc % 2 != 1) die("arguments come in pairs: --name value");
    int port = atoi(arg(argc, argv, "--port", NULL));
    const char *host = arg(argc, argv, "--host", "127.0.0.1");
    int concurrency = atoi(arg(argc, argv, "--concurrency", "1"));
    double seconds = atof(arg(argc, argv, "--seconds", "10"));
    double warmup = atof(arg(argc, argv, "--warmup", "2"));
    max_requests = atol(arg(argc, argv, "--max-requests", "200000"));
    timeout_s = atof(arg(argc, argv, "--timeout", "60"));
    request = read_file(arg(argc, argv, "--request", NULL), &request_len);
    const char *protocol = arg(argc, argv, "--protocol", "http");
    if (strcmp(protocol, "grpc") == 0) {
        grpc_mode = 1;
        h2_block = read_file(arg(argc, argv, "--headers-block", NULL), &h2_block_len);
        static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        unsigned char *h = h2_hello;
        memcpy(h, preface, 24);
        frame_head(h + 24, 12, H2_SETTINGS, 0, 0);
        h[33] = 0, h[34] = SETTINGS_ENABLE_PUSH, put32(h + 35, 0);
        h[39] = 0, h[40] = SETTINGS_INITIAL_WINDOW_SIZE, put32(h + 41, RECEIVE_WINDOW);
        frame_head(h + 45, 4, H2_WINDOW_UPDATE, 0, 0);
        put32(h + 54, RECEIVE_WINDOW - 65535);
        h2_hello_len = 58;
    } else if (strcmp(protocol, "http") != 0) {
        die("--protocol: %s is not http or grpc", protocol);
    }
    const char *ref = arg(argc, argv, "--reference", "");
    if (*ref) {
        size_t n;
        reference = (float *)read_file(ref, &n);
        if (n % 4) die("%s: %zu bytes is not a whole number of float32 values", ref, n);
        reference_n = n / 4;
        atol_text = arg(argc, argv, "--atol", "0.0001");
        atol_ = atof(atol_text);
        const char *name = arg(argc, argv, "--output", NULL);
        if (strlen(name) > sizeof output_name - 3 || strpbrk(name, "\"\\"))
            die("--output: %s is too long or needs escaping in JSON", name);
        snprintf(output_name, sizeof output_name, "\"%s\"", name);
        output_plain = name;
    }
    if (port <= 0 || port > 65535) die("--port: %d is not a TCP port", port);
    if (concurrency < 1) die("--concurrency: must be at least 1");
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) die("--host: %s is not an IPv4 address", host);

    ep = epoll_create1(EPOLL_CLOEXEC);
    struct conn *conns = calloc((size_t)concurrency, sizeof *conns);
    if (!conns) die("out of memory");
    double t_start = now();
    t_measure = t_start + warmup;
    t_end = t_measure + seconds;
    for (int i = 0; i < concurrency; i++) {
        conns[i].fd = -1;
        conns[i].state = WAITING;
        conns[i].wake = t_start;
    }
    double cpu0 = -1;
    struct epoll_event events[256];
    for (;;) {
        double t = now();
        if (cpu0 < 0 && t >= t_measure) cpu0 = cpu();
        int busy = 0;
        double next = t + 3600;
        for (int i = 0; i < concurrency; i++) {
            struct conn *c = &conns[i];
            if (c->state == WAITING && c->wake <= t) start(c);
            if (c->state == BUSY && t - c->t0 > timeout_s) {
                char why[64];
                snprintf(why, sizeof why, "TimeoutError: no answer in %g s", timeout_s);
                drop(c);
                finish(c, 0, why);
            }
            if (c->state == WAITING && c->wake < next) next = c->wake;
            if (c->state == BUSY && c->t0 + timeout_s < next) next = c->t0 + timeout_s;
            busy += c->state != DONE;
        }
        if (!busy) break;
        if (cpu0 < 0 && t_measure < next) next = t_measure;
        int wait_ms = next <= t ? 0 : (int)ceil((next - t) * 1e3);
        int n = epoll_wait(ep, events, 256, wait_ms);
        if (n < 0 && errno != EINTR) die("epoll_wait: %s", strerror(errno));
        for (int k = 0; k < n; k++) {
            struct conn *c = events[k].data.ptr;
            if (c->fd < 0) continue;
            pump(c, (events[k].events & (EPOLLHUP | EPOLLERR)) != 0);
            if (c->state == WAITING && c->wake <= now()) start(c); /* the next request at once */
        }
    }
    double cpu1 = cpu();
    double window = fmin(seconds, fmax(1e-9, now() - t_measure));

    printf("{\"latencies_ms\":[");
    for (size_t i = 0; i < lat_n; i++) printf(i ? ",%.3f" : "%.3f", lat[i]);
    printf("],\"streams\":[");
    for (int i = 0; i < concurrency; i++)
        printf(i ? ",[%ld,%.9f,%.9f,%.9f]" : "[%ld,%.9f,%.9f,%.9f]", conns[i].answers, conns[i].first, conns[i].last,
               conns[i].shares);
    printf("],\"errors\":%ld,\"error_samples\":[", n_errors);
    for (int i = 0; i < n_samples; i++) {
        if (i) putchar(',');
        putchar('"');
        for (const char *s = samples[i]; *s; s++) {
            if (*s == '"' || *s == '\\') putchar('\\');
            putchar((unsigned char)*s < 0x20 ? ' ' : *s);
        }
        putchar('"');
    }
    printf("],\"window\":%.6f,\"cpu_s\":%.6f}\n", window, cpu0 < 0 ? 0.0 : cpu1 - cpu0);
    return 0;
}

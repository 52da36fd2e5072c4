/* A closed-loop HTTP/1.1 load generator for v2 binary requests: benchmarks/loadgen.py's `http`
 * protocol, in C, so that on a machine whose cores the client shares with the server it measures,
 * the client costs its system calls and little else (docs/benchmarks.md, "The load generator").
 *
 * Same semantics as loadgen.py's _closed_loop: C workers on one keep-alive connection each, each
 * sending the request (built once, by Python, into --request) as soon as the previous answer is
 * read; answers that arrive inside the measuring window (after --warmup, --seconds long) count; no
 * request starts after the window or past --max-requests; a failed request is followed by a 10 ms
 * pause; a connection that fails or times out is dropped and opened again for the next request.
 * With --reference (raw little-endian float32), every answer's binary output is compared with it
 * within --atol, and its JSON header must name --output.
 *
 * Prints one JSON object: the window's latencies (ms), each worker's answers and the times of its
 * first and last (s, from the window's start), errors, up to five error messages, the window's
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
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum state { WAITING, BUSY, DONE };

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
};

static const char *request;
static size_t request_len;
static float *reference;
static size_t reference_n;
static double atol_;
static const char *atol_text = "0.0001";
static char output_name[256]; /* the output's name as its JSON string, quotes included */
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
    size_t bytes = a->body_len - (size_t)a->header_length;
    if (bytes != reference_n * 4) {
        snprintf(why, n, "wrong answer: %zu values, expected %zu", bytes / 4, reference_n);
        return why;
    }
    const char *data = a->body + a->header_length;
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

/* ---- the workers ------------------------------------------------------------------------------ */

static int ep;

static void drop(struct conn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->len = 0;
}

static void finish(struct conn *c, int ok, const char *why) {
    double t1 = now();
    if (!ok && why && n_samples < 5) snprintf(samples[n_samples++], sizeof samples[0], "%s", why);
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
    }
    pump(c, 0);
}

/* Write what is left of the request and read what has come, as far as the socket allows now. */
static void pump(struct conn *c, int eof) {
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
        if (r == 0) eof = 1;
        else if (errno != EAGAIN && errno != EWOULDBLOCK) eof = 1;
        break;
    }
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
        printf(i ? ",[%ld,%.9f,%.9f]" : "[%ld,%.9f,%.9f]", conns[i].answers, conns[i].first, conns[i].last);
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

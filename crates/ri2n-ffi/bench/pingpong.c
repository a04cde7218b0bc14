/* Round trips of small whole messages through the C library, over two loopback links: a
 * thread echoes, the main thread times each round trip. `examples/pingpong.rs` does the same
 * through the Rust library; bench/run-all bindings runs both and compares their medians.
 *
 * usage: pingpong [ROUNDS [SIZE]]   (default 20000 round trips of 64 bytes)
 * prints one JSON line: {"median_us": ..., "p99_us": ..., "rounds": ..., "size": ...} */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ri2n.h>

#define WARMUP 1000

static void die(const char *what) {
    fprintf(stderr, "pingpong: %s: %s\n", what, ri2n_last_error());
    exit(1);
}

static void *echo(void *arg) {
    ri2n_conn *c = ri2n_accept(arg, 10000);
    if (!c) die("accept");
    unsigned char buf[65536];
    ssize_t n;
    while ((n = ri2n_recv_message(c, buf, sizeof buf)) > 0)
        if (ri2n_send_message(c, buf, (size_t)n) != n) die("echo");
    if (n < 0) die("receive");
    ri2n_conn_free(c);
    return NULL;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? strtol(argv[1], NULL, 10) : 20000;
    size_t size = argc > 2 ? (size_t)strtol(argv[2], NULL, 10) : 64;
    if (rounds <= 0 || size == 0 || size > 65536) {
        fprintf(stderr, "usage: pingpong [ROUNDS [SIZE]] (SIZE 1..65536)\n");
        return 2;
    }
    const char *addrs[] = {"127.0.0.1:0", "127.0.0.2:0"};
    ri2n_endpoint *server = ri2n_endpoint_server(addrs, 2, NULL);
    if (!server) die("server");
    char addr[RI2N_ADDR_LEN];
    if (ri2n_endpoint_local_addr(server, 0, addr, sizeof addr) < 0) die("address");
    pthread_t echoer;
    pthread_create(&echoer, NULL, echo, server);

    ri2n_endpoint *client = ri2n_endpoint_client(addrs, 2, NULL);
    if (!client) die("client");
    const char *remote[] = {addr};
    ri2n_conn *c = ri2n_connect(client, remote, 1, 10000);
    if (!c) die("connect");

    unsigned char *msg = malloc(size), *back = malloc(size);
    double *rtts = malloc(sizeof *rtts * (size_t)rounds);
    if (!msg || !back || !rtts) return 1;
    memset(msg, 0x5a, size);
    for (long i = 0; i < WARMUP + rounds; i++) {
        double t0 = now_us();
        if (ri2n_send_message(c, msg, size) != (ssize_t)size) die("send");
        if (ri2n_recv_message(c, back, size) != (ssize_t)size) die("receive");
        if (i >= WARMUP) rtts[i - WARMUP] = now_us() - t0;
    }
    if (memcmp(msg, back, size) != 0) die("the echo differs");
    ri2n_finish(c);
    ri2n_conn_free(c);
    pthread_join(echoer, NULL);
    qsort(rtts, (size_t)rounds, sizeof *rtts, by_value);
    printf("{\"median_us\": %.2f, \"p99_us\": %.2f, \"rounds\": %ld, \"size\": %zu}\n",
           rtts[rounds / 2], rtts[rounds * 99 / 100], rounds, size);
    ri2n_endpoint_free(client);
    ri2n_endpoint_free(server);
    return 0;
}

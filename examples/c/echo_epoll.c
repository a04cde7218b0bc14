/* An echo server on ri2n with epoll: one thread serves every connection, with the
 * non-blocking calls and the readiness descriptors ri2n_endpoint_fd and ri2n_conn_fd.
 *
 *   cc echo_epoll.c $(pkg-config --cflags --libs ri2n) -o echo_epoll
 *   ./echo_epoll [--key FILE] [--connections N] ADDR [ADDR...]
 *
 * ADDR: one local address per link, e.g. 10.0.1.2:7000 10.0.2.2:7000 (port 0 picks one).
 * It prints "listening on ADDR..." once bound, then echoes each connection's byte stream back
 * until the client finishes; with --connections N it exits 0 after serving N connections. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include <ri2n.h>

#define MAX_LINKS 16

/* One client: what was read and not yet echoed. */
struct client {
    ri2n_conn *conn;
    unsigned char buf[64 * 1024];
    size_t len, sent;
    int finished; /* the client finished its stream */
};

static void die(const char *what) {
    fprintf(stderr, "echo_epoll: %s: %s\n", what, ri2n_last_error());
    exit(1);
}

/* Moves what it can: echoes what is pending, reads more, until a call says EAGAIN.
 * Returns 1 when the connection is done with (the client finished and all was echoed). */
static int serve(struct client *cl) {
    for (;;) {
        if (cl->sent < cl->len) {
            ssize_t n = ri2n_try_write(cl->conn, cl->buf + cl->sent, cl->len - cl->sent);
            if (n == -EAGAIN) return 0;
            if (n < 0) {
                fprintf(stderr, "echo_epoll: write: %s\n", ri2n_last_error());
                return 1;
            }
            cl->sent += (size_t)n;
            continue;
        }
        if (cl->finished) {
            ri2n_finish(cl->conn);
            return 1;
        }
        ssize_t n = ri2n_try_read(cl->conn, cl->buf, sizeof cl->buf);
        if (n == -EAGAIN) return 0;
        if (n < 0) {
            fprintf(stderr, "echo_epoll: read: %s\n", ri2n_last_error());
            return 1;
        }
        if (n == 0) cl->finished = 1;
        cl->len = (size_t)n;
        cl->sent = 0;
    }
}

/* Done with a client: freeing its connection still delivers what was echoed (the endpoint
 * lingers for it). */
static void retire(int ep, struct client *cl, long *served) {
    epoll_ctl(ep, EPOLL_CTL_DEL, ri2n_conn_fd(cl->conn), NULL);
    ri2n_conn_free(cl->conn);
    free(cl);
    (*served)++;
}

int main(int argc, char **argv) {
    const char *key = NULL;
    long connections = -1;
    const char *addrs[MAX_LINKS];
    size_t naddrs = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--key") == 0 && i + 1 < argc) {
            key = argv[++i];
        } else if (strcmp(argv[i], "--connections") == 0 && i + 1 < argc) {
            connections = strtol(argv[++i], NULL, 10);
        } else if (argv[i][0] != '-' && naddrs < MAX_LINKS) {
            addrs[naddrs++] = argv[i];
        } else {
            fprintf(stderr, "usage: echo_epoll [--key FILE] [--connections N] ADDR [ADDR...]\n");
            return 2;
        }
    }
    if (naddrs == 0) {
        fprintf(stderr, "usage: echo_epoll [--key FILE] [--connections N] ADDR [ADDR...]\n");
        return 2;
    }

    ri2n_endpoint *server = ri2n_endpoint_server(addrs, naddrs, key);
    if (!server) die("cannot listen");
    printf("listening on");
    char addr[RI2N_ADDR_LEN];
    for (size_t i = 0; ri2n_endpoint_local_addr(server, i, addr, sizeof addr) > 0; i++)
        printf(" %s", addr);
    printf("\n");
    fflush(stdout);

    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) {
        perror("epoll_create1");
        return 1;
    }
    /* the accept descriptor carries a NULL pointer; each connection's carries its client */
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, ri2n_endpoint_fd(server), &ev) < 0) {
        perror("epoll_ctl");
        return 1;
    }
    long served = 0;
    while (connections < 0 || served < connections) {
        struct epoll_event ready[64];
        int n = epoll_wait(ep, ready, 64, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            perror("epoll_wait");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            struct client *cl = ready[i].data.ptr;
            if (cl == NULL) {
                ri2n_conn *c;
                while ((c = ri2n_try_accept(server)) != NULL) {
                    cl = calloc(1, sizeof *cl);
                    if (!cl) return 1;
                    cl->conn = c;
                    struct epoll_event cev = {.events = EPOLLIN, .data.ptr = cl};
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, ri2n_conn_fd(c), &cev) < 0) {
                        perror("epoll_ctl");
                        return 1;
                    }
                    /* something may have arrived before the descriptor was watched */
                    if (serve(cl)) retire(ep, cl, &served);
                }
                if (errno != EAGAIN) die("accept");
            } else if (serve(cl)) {
                retire(ep, cl, &served);
            }
        }
    }
    /* every echo acknowledged before leaving */
    if (ri2n_endpoint_close(server, 10000) != 0) die("close");
    ri2n_endpoint_free(server);
    return 0;
}

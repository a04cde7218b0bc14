/* A thread blocked in ri2n_recv_message beside one that polls ri2n_conn_read_fd and calls
 * ri2n_try_recv_message: the try call, turned away with -EAGAIN while the other receives,
 * clears the descriptor as the header promises. It cleared nothing: a level-triggered
 * poll woke over a million times a second with nothing to receive, and an edge-triggered
 * one was never woken again, also for the messages that came after the blocked thread
 * stopped receiving.
 *
 *   turns [tcp]   (tcp: over the TCP transport)
 */
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define TAKEN_BY_A 20
#define SENT 80

static ri2n_conn *peer;
static volatile int a_got, b_got;

static uint64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* Thread A: blocking receives, `n` of them (0: until the connection ends). */
static void *blocking_receiver(void *n) {
    char buf[64];
    for (long i = 0; (long)n == 0 || i < (long)n; i++) {
        if (ri2n_recv_message(peer, buf, sizeof buf) <= 0) {
            break;
        }
        a_got++;
    }
    return NULL;
}

/* Thread B: edge-triggered epoll, try until -EAGAIN after each wake-up. Returns (as a
 * pointer) whether it ever waited 2 s for a wake-up that did not come with messages there. */
static void *polling_receiver(void *unused) {
    (void)unused;
    char buf[64];
    int ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN | EPOLLET};
    CHECK(ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, ri2n_conn_read_fd(peer), &e) == 0);
    long stranded = 0;
    while (a_got + b_got < SENT) {
        ssize_t r = ri2n_try_recv_message(peer, buf, sizeof buf);
        if (r > 0) {
            b_got++;
            continue;
        }
        CHECK(r == -EAGAIN);
        if (epoll_wait(ep, &e, 1, 2000) == 0) {
            /* no wake-up for 2 s: was a message there all along? */
            r = ri2n_try_recv_message(peer, buf, sizeof buf);
            if (r > 0) {
                stranded = 1;
                b_got++;
            } else {
                break;
            }
        }
    }
    close(ep);
    return (void *)stranded;
}

int main(int argc, char **argv) {
    int tcp = argc == 2 && strcmp(argv[1], "tcp") == 0;
    const char *listen[] = {"127.0.0.1:0"};
    ri2n_endpoint *server =
        tcp ? ri2n_endpoint_server_tcp(listen, 1, NULL) : ri2n_endpoint_server(listen, 1, NULL);
    CHECK(server != NULL);
    char addr[RI2N_ADDR_LEN];
    CHECK(ri2n_endpoint_local_addr(server, 0, addr, sizeof addr) > 0);
    const char *remote[] = {addr};
    ri2n_endpoint *client =
        tcp ? ri2n_endpoint_client_tcp(listen, 1, NULL) : ri2n_endpoint_client(listen, 1, NULL);
    CHECK(client != NULL);
    ri2n_conn *c = ri2n_connect(client, remote, 1, 10000);
    CHECK(c != NULL);
    peer = ri2n_accept(server, 10000);
    CHECK(peer != NULL);

    /* level-triggered, nothing sent: a turned-away try leaves the descriptor quiet */
    char buf[64];
    pthread_t a;
    CHECK(pthread_create(&a, NULL, blocking_receiver, (void *)1) == 0);
    usleep(100000); /* A waits in its receive */
    struct pollfd pf = {.fd = ri2n_conn_read_fd(peer), .events = POLLIN};
    long wakes = 0;
    for (uint64_t start = now_ms(); now_ms() - start < 300;) {
        if (poll(&pf, 1, 50) == 1) {
            wakes++;
            CHECK(ri2n_try_recv_message(peer, buf, sizeof buf) == -EAGAIN);
        }
    }
    printf("level-triggered: %ld wake-ups in 300 ms with nothing to receive\n", wakes);
    CHECK(wakes < 100);
    CHECK(ri2n_send_message(c, "x", 1) == 1);
    CHECK(pthread_join(a, NULL) == 0);
    a_got = 0;

    /* edge-triggered: A takes some and stops; B is woken for every one after */
    pthread_t b;
    CHECK(pthread_create(&a, NULL, blocking_receiver, (void *)TAKEN_BY_A) == 0);
    CHECK(pthread_create(&b, NULL, polling_receiver, NULL) == 0);
    usleep(100000);
    for (int i = 0; i < SENT; i++) {
        CHECK(ri2n_send_message(c, "hello", 5) == 5);
        usleep(1000);
    }
    void *stranded;
    CHECK(pthread_join(a, NULL) == 0);
    CHECK(pthread_join(b, &stranded) == 0);
    printf("edge-triggered: A took %d, B %d of %d; B stranded: %s\n", a_got, b_got, SENT,
           stranded ? "yes" : "no");
    CHECK(a_got == TAKEN_BY_A && a_got + b_got == SENT && !stranded);

    ri2n_conn_free(c);
    ri2n_conn_free(peer);
    ri2n_endpoint_free(client);
    ri2n_endpoint_free(server);
    printf("ok\n");
    return 0;
}

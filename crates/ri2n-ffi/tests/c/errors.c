/* Every failure the header promises, with its errno: bad arguments, nothing listening, not a
 * server, no answer, another key or none, a peer that aborted (one connection or its whole
 * endpoint) or whose process is gone, one that went silent past the limit set, writes after
 * the end, messages too large for the buffer, non-blocking calls with nothing to do; and datagrams, messages and events working.
 *
 * usage: errors DIR   (a directory for key files) */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

/* A loopback UDP port with a socket that never answers (kept open) or with none (closed). */
static int udp_port(int *fd_out) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    socklen_t len = sizeof a;
    CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    if (fd_out) *fd_out = fd;
    else close(fd);
    return ntohs(a.sin_port);
}

static const char *local1[] = {"127.0.0.1:0"};

/* A server in a child process, its address in `addr`: it accepts one connection, writes
 * "hi" and waits to be killed. Forked before this process has any thread of the library (a
 * child of a process with threads may find their locks held). */
static pid_t server_child(char addr[RI2N_ADDR_LEN]) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        alarm(60); /* gone by itself if the parent fails before it kills it */
        close(fds[0]);
        const char *listen[] = {"127.0.0.1:0"};
        ri2n_endpoint *server = ri2n_endpoint_server(listen, 1, NULL);
        CHECK(server != NULL);
        char mine[RI2N_ADDR_LEN];
        CHECK(ri2n_endpoint_local_addr(server, 0, mine, sizeof mine) > 0);
        CHECK(write(fds[1], mine, sizeof mine) == (ssize_t)sizeof mine);
        ri2n_conn *c = ri2n_accept(server, 10000);
        CHECK(c != NULL);
        CHECK(ri2n_write(c, "hi", 2) == 2);
        for (;;) pause(); /* until killed */
    }
    close(fds[1]);
    CHECK(read(fds[0], addr, RI2N_ADDR_LEN) == RI2N_ADDR_LEN);
    close(fds[0]);
    return child;
}

/* A connection to the server of `server_child`, "hi" read from it. */
static ri2n_conn *connected_to(const char *addr, ri2n_endpoint **client) {
    *client = ri2n_endpoint_client(local1, 1, NULL);
    CHECK(*client != NULL);
    const char *remote[] = {addr};
    ri2n_conn *c = ri2n_connect(*client, remote, 1, 10000);
    CHECK(c != NULL);
    CHECK(ri2n_write(c, "x", 1) == 1); /* confirms the connection: the child accepts it */
    char buf[16];
    CHECK(ri2n_read(c, buf, 2) == 2 && memcmp(buf, "hi", 2) == 0);
    CHECK(ri2n_conn_error(c) == 0);
    return c;
}

/* The server killed while its client reads: the client's read fails with ECONNRESET (the
 * peer is gone), as the header promises. */
static void peer_gone(pid_t child, const char *addr) {
    ri2n_endpoint *client;
    ri2n_conn *c = connected_to(addr, &client);
    char buf[16];
    CHECK_FAILS_WITH(ri2n_conn_send_limits(c, NULL), EINVAL);
    CHECK_FAILS_WITH(ri2n_conn_stream_acknowledged(c, NULL), EINVAL);
    CHECK(strstr(ri2n_last_error(), "NULL") != NULL);
    CHECK(kill(child, SIGKILL) == 0);
    CHECK(waitpid(child, NULL, 0) == child);
    CHECK_FAILS_WITH(ri2n_read(c, buf, sizeof buf), ECONNRESET);
    CHECK(strstr(ri2n_last_error(), "gone") != NULL);
    /* the connection's end, asked for rather than met in a call */
    CHECK_FAILS_WITH(ri2n_conn_error(c), ECONNRESET);
    CHECK(strstr(ri2n_last_error(), "gone") != NULL);
    ri2n_conn_free(c);
    ri2n_endpoint_free(client);
    printf("peer's process gone: ECONNRESET\n");
}

/* The server stopped (SIGSTOP: a host whose power was cut, which answers nothing) while its
 * client reads: with the default the connection waits as long as it takes; with a limit on
 * the time every link is down, the read fails with ETIMEDOUT, and so does the connection's
 * error. */
static void silent_peer_times_out(pid_t child, const char *addr) {
    ri2n_endpoint *client;
    ri2n_conn *c = connected_to(addr, &client);
    CHECK_FAILS_WITH(ri2n_conn_set_timeouts(c, 0, -1), EINVAL);
    CHECK_FAILS_WITH(ri2n_conn_set_timeouts(NULL, -1, -1), EINVAL);
    CHECK(kill(child, SIGSTOP) == 0);
    /* the premise: without a limit nothing ends it (the link is down by then) */
    char buf[16];
    CHECK_FAILS_WITH(ri2n_recv_datagram(c, buf, sizeof buf, 1500), ETIMEDOUT);
    CHECK(ri2n_conn_error(c) == 0);
    ri2n_stats stats;
    ri2n_link_stats link;
    CHECK(ri2n_conn_stats(c, &stats, &link, 1) == 1);
    CHECK(link.state == RI2N_LINK_DOWN);
    CHECK(ri2n_conn_set_timeouts(c, 300, -1) == 0);
    CHECK_FAILS_WITH(ri2n_read(c, buf, sizeof buf), ETIMEDOUT);
    CHECK_FAILS_WITH(ri2n_conn_error(c), ETIMEDOUT);
    CHECK(kill(child, SIGKILL) == 0);
    CHECK(waitpid(child, NULL, 0) == child);
    ri2n_conn_free(c);
    ri2n_endpoint_free(client);
    printf("silent peer: ETIMEDOUT once every link was down longer than the limit\n");
}

/* A connected pair on loopback, with these key files (NULL: none). */
static void pair(const char *server_key, const char *client_key, ri2n_endpoint **server,
                 ri2n_endpoint **client, ri2n_conn **c, ri2n_conn **peer) {
    const char *listen[] = {"127.0.0.1:0", "127.0.0.2:0"};
    *server = ri2n_endpoint_server(listen, 2, server_key);
    CHECK(*server != NULL);
    char addr[RI2N_ADDR_LEN];
    CHECK(ri2n_endpoint_local_addr(*server, 0, addr, sizeof addr) > 0);
    const char *remote[] = {addr};
    *client = ri2n_endpoint_client(local1, 1, client_key);
    CHECK(*client != NULL);
    *c = ri2n_connect(*client, remote, 1, 10000);
    if (*c == NULL) return;
    /* the server hands a connection over once the client's first packet confirmed it */
    CHECK(ri2n_write(*c, "x", 1) == 1);
    *peer = ri2n_accept(*server, 10000);
    CHECK(*peer != NULL);
    char x;
    CHECK(ri2n_read(*peer, &x, 1) == 1 && x == 'x');
}

/* A thread waiting in ri2n_recv_message with `len` bytes of buffer (at most 1000). */
struct receiver {
    ri2n_conn *conn;
    size_t len;
    ssize_t rc;
    int err;
    char why[256];
    char buf[1000];
};

static void *receive_message(void *arg) {
    struct receiver *r = arg;
    r->rc = ri2n_recv_message(r->conn, r->buf, r->len);
    r->err = errno;
    snprintf(r->why, sizeof r->why, "%s", ri2n_last_error());
    return NULL;
}

/* Frees what `pair` made. */
static void unpair(ri2n_endpoint *server, ri2n_endpoint *client, ri2n_conn *c, ri2n_conn *peer) {
    ri2n_conn_free(c);
    ri2n_conn_free(peer);
    ri2n_endpoint_free(client);
    ri2n_endpoint_free(server);
}

/* Two threads wait for messages with buffers too small: each is told of the next message
 * (EMSGSIZE naming its size), the first, which stays kept for a later call; calls with a large
 * buffer then get both messages, in order. (Before, each thread took a message of its own,
 * and the second kept could come out before the first, or be kept over it and lost.) */
static void messages_two_waiting_threads_could_not_take_are_both_kept(void) {
    ri2n_endpoint *server, *client;
    ri2n_conn *c, *peer;
    pair(NULL, NULL, &server, &client, &c, &peer);
    CHECK(c != NULL);
    struct receiver r[2] = {{.conn = peer, .len = 100}, {.conn = peer, .len = 100}};
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&threads[i], NULL, receive_message, &r[i]) == 0);
    usleep(200000); /* both wait before anything arrives */
    char first[200], second[300], buf[1000];
    memset(first, 'a', sizeof first);
    memset(second, 'b', sizeof second);
    CHECK(ri2n_send_message(c, first, sizeof first) == sizeof first);
    usleep(200000); /* one of them took the first */
    CHECK(ri2n_send_message(c, second, sizeof second) == sizeof second);
    for (int i = 0; i < 2; i++) CHECK(pthread_join(threads[i], NULL) == 0);
    for (int i = 0; i < 2; i++) {
        CHECK(r[i].rc == -EMSGSIZE && r[i].err == EMSGSIZE);
        CHECK(strstr(r[i].why, "has 200 bytes"));
    }
    CHECK(ri2n_try_recv_message(peer, buf, sizeof buf) == sizeof first);
    CHECK(memcmp(buf, first, sizeof first) == 0);
    CHECK(ri2n_recv_message(peer, buf, sizeof buf) == sizeof second);
    CHECK(memcmp(buf, second, sizeof second) == 0);
    CHECK_FAILS_WITH(ri2n_try_recv_message(peer, buf, sizeof buf), EAGAIN);
    unpair(server, client, c, peer);
    printf("messages too large for two waiting threads: both kept, in order\n");
}

/* A message kept after one waiting thread's EMSGSIZE goes to another thread already waiting
 * with a buffer it fits. (Before, that thread waited on in the connection, and returned the
 * message after it first: out of order.) */
static void a_message_one_thread_kept_goes_to_another_waiting(void) {
    ri2n_endpoint *server, *client;
    ri2n_conn *c, *peer;
    pair(NULL, NULL, &server, &client, &c, &peer);
    CHECK(c != NULL);
    struct receiver small = {.conn = peer, .len = 10}, big = {.conn = peer, .len = 1000};
    pthread_t ts, tb;
    CHECK(pthread_create(&ts, NULL, receive_message, &small) == 0);
    usleep(200000); /* the small buffer waits first: it takes the first message */
    CHECK(pthread_create(&tb, NULL, receive_message, &big) == 0);
    usleep(200000);
    char first[200], second[300];
    memset(first, 'a', sizeof first);
    memset(second, 'b', sizeof second);
    CHECK(ri2n_send_message(c, first, sizeof first) == sizeof first);
    CHECK(pthread_join(ts, NULL) == 0);
    CHECK(small.rc == -EMSGSIZE); /* the premise: it took the first, which was kept */
    /* the big buffer gets the first within a while, the second not sent yet */
    for (int i = 0; i < 500 && big.rc == 0; i++) usleep(10000);
    CHECK(big.rc == sizeof first && memcmp(big.buf, first, sizeof first) == 0);
    CHECK(pthread_join(tb, NULL) == 0);
    CHECK(ri2n_send_message(c, second, sizeof second) == sizeof second);
    char buf[1000];
    CHECK(ri2n_recv_message(peer, buf, sizeof buf) == sizeof second);
    unpair(server, client, c, peer);
    printf("a message kept by one waiting thread: taken by the other\n");
}

/* The TCP transport gives the errno values the header promises as the UDP transport does:
 * EMSGSIZE for a message above ri2n_max_message_size, EPIPE for a write after the end of
 * the stream, also once the connection closed cleanly (it gave EINVAL and EIO). */
static void tcp_transport(void) {
    const char *listen[] = {"127.0.0.1:0"};
    ri2n_endpoint *server = ri2n_endpoint_server_tcp(listen, 1, NULL);
    CHECK(server != NULL);
    char addr[RI2N_ADDR_LEN];
    CHECK(ri2n_endpoint_local_addr(server, 0, addr, sizeof addr) > 0);
    ri2n_endpoint *client = ri2n_endpoint_client_tcp(local1, 1, NULL);
    CHECK(client != NULL);
    const char *remote[] = {addr};
    ri2n_conn *c = ri2n_connect(client, remote, 1, 10000);
    CHECK(c != NULL);
    CHECK(ri2n_write(c, "x", 1) == 1);
    CHECK(ri2n_write(c, NULL, 0) == 0);
    ri2n_conn *peer = ri2n_accept(server, 10000);
    CHECK(peer != NULL);
    char buf[16];
    CHECK(ri2n_read(peer, buf, 1) == 1);

    ssize_t max = ri2n_max_message_size(c);
    CHECK(max > 0);
    char *big = calloc(1, (size_t)max + 1);
    CHECK(big != NULL);
    CHECK_FAILS_WITH(ri2n_send_message(c, big, (size_t)max + 1), EMSGSIZE);
    free(big);

    /* a clean close of both sides, then a write */
    CHECK(ri2n_finish(c) == 0 && ri2n_finish(peer) == 0);
    CHECK(ri2n_read(peer, buf, sizeof buf) == 0 && ri2n_read(c, buf, sizeof buf) == 0);
    CHECK(ri2n_wait_acknowledged(c, 5000) == 0 && ri2n_wait_acknowledged(peer, 5000) == 0);
    int closed = 0;
    for (int i = 0; i < 500 && !closed; i++) {
        ri2n_event events[16];
        ssize_t n = ri2n_conn_events(c, events, 16);
        for (ssize_t k = 0; k < n; k++) closed |= events[k].kind == RI2N_EVENT_CLOSED;
        if (!closed) usleep(10000);
    }
    CHECK(closed);
    CHECK_FAILS_WITH(ri2n_write(c, "x", 1), EPIPE);
    CHECK_FAILS_WITH(ri2n_write(c, NULL, 0), EPIPE);
    CHECK_FAILS_WITH(ri2n_conn_error(c), ENOTCONN);
    ri2n_conn_free(c);
    ri2n_conn_free(peer);

    /* the server closes its connections while a client's stream goes on: the connection is
     * aborted once the server's side is delivered, and a read of it says so (it gave EIO, the
     * errno of a bug in ri2n, then ENOTCONN, a clean end the UDP transport does not report) */
    c = ri2n_connect(client, remote, 1, 10000);
    CHECK(c != NULL);
    CHECK(ri2n_write(c, "y", 1) == 1);
    peer = ri2n_accept(server, 10000);
    CHECK(peer != NULL);
    CHECK(ri2n_read(peer, buf, 1) == 1);
    CHECK(ri2n_endpoint_close(server, 5000) == 0);
    CHECK_FAILS_WITH(ri2n_read(peer, buf, sizeof buf), ECONNABORTED);
    unpair(server, client, c, peer);
    printf("TCP transport: message too large EMSGSIZE, write after a clean close EPIPE, "
           "read after the server's close ECONNABORTED\n");
}

/* A failing call in an `atexit` handler, after the thread's locals were destroyed (glibc
 * destroys them first): it fails as promised (it used to abort the process). */
static void fail_after_exit(void) {
    CHECK_FAILS_WITH(ri2n_write(NULL, "x", 1), EINVAL);
    printf("a failing call after exit: EINVAL\n");
}

/* A key that cannot be written whole (here a file size limit, as a full disk would) fails
 * and leaves no file: one holding part of a key made the next try EEXIST and every endpoint
 * given it EINVAL. */
static void key_not_written_whole(const char *path) {
    struct rlimit old, small;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    small = old;
    small.rlim_cur = 10;
    signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
    int rc = ri2n_key_generate(path);
    int e = errno;
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    errno = e;
    CHECK_FAILS_WITH(rc, EFBIG);
    CHECK(access(path, F_OK) != 0 && errno == ENOENT);
    CHECK(ri2n_key_generate(path) == 0);
    printf("a key not written whole: EFBIG, and no file left\n");
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    char gone_addr[RI2N_ADDR_LEN], silent_addr[RI2N_ADDR_LEN];
    pid_t gone = server_child(gone_addr), stopped = server_child(silent_addr);
    peer_gone(gone, gone_addr);
    silent_peer_times_out(stopped, silent_addr);
    char key[4096], other_key[4096], junk_key[4096], missing_key[4096];
    snprintf(key, sizeof key, "%s/k1", argv[1]);
    snprintf(other_key, sizeof other_key, "%s/k2", argv[1]);
    snprintf(junk_key, sizeof junk_key, "%s/junk", argv[1]);
    snprintf(missing_key, sizeof missing_key, "%s/missing", argv[1]);
    CHECK(ri2n_key_generate(key) == 0);
    CHECK(ri2n_key_generate(other_key) == 0);
    char cut_key[4096];
    snprintf(cut_key, sizeof cut_key, "%s/cut", argv[1]);
    key_not_written_whole(cut_key);
    FILE *junk = fopen(junk_key, "w");
    CHECK(junk != NULL);
    fputs("junk\n", junk);
    fclose(junk);
    char buf[256];

    /* EINVAL: NULL and malformed arguments, never a crash */
    CHECK_NULL_WITH(ri2n_endpoint_server(NULL, 1, NULL), EINVAL);
    CHECK_NULL_WITH(ri2n_endpoint_client(local1, 0, NULL), EINVAL);
    const char *bad[] = {"not an address"};
    CHECK_NULL_WITH(ri2n_endpoint_server(bad, 1, NULL), EINVAL);
    CHECK(strstr(ri2n_last_error(), "not an address") != NULL);
    const char *null_entry[] = {NULL};
    CHECK_NULL_WITH(ri2n_endpoint_client(null_entry, 1, NULL), EINVAL);
    CHECK_NULL_WITH(ri2n_connect(NULL, local1, 1, 100), EINVAL);
    CHECK_NULL_WITH(ri2n_accept(NULL, 0), EINVAL);
    CHECK_FAILS_WITH(ri2n_write(NULL, "x", 1), EINVAL);
    CHECK_FAILS_WITH(ri2n_read(NULL, buf, 1), EINVAL);
    CHECK_FAILS_WITH(ri2n_send_message(NULL, "x", 1), EINVAL);
    CHECK_FAILS_WITH(ri2n_recv_message(NULL, buf, 1), EINVAL);
    CHECK_FAILS_WITH(ri2n_finish(NULL), EINVAL);
    CHECK_FAILS_WITH(ri2n_conn_fd(NULL), EINVAL);
    CHECK_FAILS_WITH(ri2n_endpoint_fd(NULL), EINVAL);
    CHECK_FAILS_WITH(ri2n_conn_stats(NULL, NULL, NULL, 0), EINVAL);
    CHECK_FAILS_WITH(ri2n_conn_send_limits(NULL, NULL), EINVAL);
    CHECK_FAILS_WITH(ri2n_conn_stream_acknowledged(NULL, NULL), EINVAL);
    ri2n_conn_free(NULL);
    ri2n_endpoint_free(NULL);
    CHECK_NULL_WITH(ri2n_endpoint_client(local1, 1, junk_key), EINVAL);
    CHECK(strstr(ri2n_last_error(), junk_key) != NULL);
    CHECK_NULL_WITH(ri2n_endpoint_client(local1, 1, missing_key), ENOENT);
    /* an endless file: refused after the most a key file holds, not read until memory ran out */
    CHECK_NULL_WITH(ri2n_endpoint_client(local1, 1, "/dev/zero"), EINVAL);
    CHECK(strstr(ri2n_last_error(), "/dev/zero") != NULL);
    /* a directory opens, and its read fails with EISDIR, which the header does not promise */
    CHECK_NULL_WITH(ri2n_endpoint_client(local1, 1, argv[1]), EINVAL);
    CHECK(strstr(ri2n_last_error(), "directory") != NULL);
    printf("bad arguments: EINVAL, a missing key file: ENOENT\n");

    ri2n_endpoint *client = ri2n_endpoint_client(local1, 1, NULL);
    CHECK(client != NULL);

    /* ECONNREFUSED: nothing listens on the port; or a client endpoint, not a server */
    char addr[RI2N_ADDR_LEN];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", udp_port(NULL));
    const char *nobody[] = {addr};
    CHECK_NULL_WITH(ri2n_connect(client, nobody, 1, 5000), ECONNREFUSED);
    ri2n_endpoint *not_server = ri2n_endpoint_client(local1, 1, NULL);
    CHECK(not_server != NULL);
    char not_server_addr[RI2N_ADDR_LEN];
    CHECK(ri2n_endpoint_local_addr(not_server, 0, not_server_addr, sizeof not_server_addr) > 0);
    CHECK_FAILS_WITH(ri2n_endpoint_local_addr(not_server, 5, buf, sizeof buf), ENOENT);
    CHECK_FAILS_WITH(ri2n_endpoint_local_addr(not_server, 0, buf, 4), ERANGE);
    const char *client_addr[] = {not_server_addr};
    CHECK_NULL_WITH(ri2n_connect(client, client_addr, 1, 5000), ECONNREFUSED);
    ri2n_endpoint_free(not_server);
    printf("nothing listening, not a server: ECONNREFUSED\n");

    /* ETIMEDOUT: a port that never answers; an accept with nobody coming */
    int silent_fd;
    snprintf(addr, sizeof addr, "127.0.0.1:%d", udp_port(&silent_fd));
    const char *silent[] = {addr};
    CHECK_NULL_WITH(ri2n_connect(client, silent, 1, 300), ETIMEDOUT);
    close(silent_fd);
    const char *listen1[] = {"127.0.0.1:0"};
    ri2n_endpoint *lonely = ri2n_endpoint_server(listen1, 1, NULL);
    CHECK(lonely != NULL);
    CHECK_NULL_WITH(ri2n_accept(lonely, 100), ETIMEDOUT);
    CHECK_NULL_WITH(ri2n_try_accept(lonely), EAGAIN);
    CHECK(ri2n_endpoint_fd(lonely) >= 0);
    ri2n_endpoint_free(lonely);
    printf("no answer, nobody to accept: ETIMEDOUT; try_accept: EAGAIN\n");

    /* EACCES: another key, or a key on one side only */
    ri2n_endpoint *server, *cl;
    ri2n_conn *c = NULL, *peer = NULL;
    pair(key, other_key, &server, &cl, &c, &peer);
    CHECK_NULL_WITH(c, EACCES);
    CHECK(strstr(ri2n_last_error(), other_key) != NULL);
    ri2n_endpoint_free(cl);
    ri2n_endpoint_free(server);
    pair(key, NULL, &server, &cl, &c, &peer);
    CHECK_NULL_WITH(c, EACCES);
    ri2n_endpoint_free(cl);
    ri2n_endpoint_free(server);
    pair(NULL, key, &server, &cl, &c, &peer);
    CHECK_NULL_WITH(c, EACCES);
    ri2n_endpoint_free(cl);
    ri2n_endpoint_free(server);
    printf("another key, a key on one side only: EACCES\n");

    /* messages, datagrams, events and the non-blocking calls on a keyed pair */
    pair(key, key, &server, &cl, &c, &peer);
    CHECK(c != NULL);
    CHECK_FAILS_WITH(ri2n_try_read(c, buf, sizeof buf), EAGAIN);
    CHECK_FAILS_WITH(ri2n_try_recv_message(c, buf, sizeof buf), EAGAIN);
    CHECK(ri2n_write(c, NULL, 0) == 0);
    CHECK(ri2n_conn_fd(c) >= 0);
    CHECK(ri2n_conn_read_fd(c) >= 0 && ri2n_conn_write_fd(c) >= 0);
    CHECK(ri2n_conn_read_fd(c) != ri2n_conn_write_fd(c));
    CHECK_FAILS_WITH(ri2n_conn_read_fd(NULL), EINVAL);
    CHECK(ri2n_send_message(c, "hello", 5) == 5);
    CHECK_FAILS_WITH(ri2n_recv_message(peer, buf, 3), EMSGSIZE);
    CHECK(ri2n_recv_message(peer, buf, sizeof buf) == 5 && memcmp(buf, "hello", 5) == 0);
    CHECK_FAILS_WITH(ri2n_send_message(c, "", 0), EINVAL);
    ssize_t max_message = ri2n_max_message_size(c);
    CHECK(max_message > 0);
    unsigned char *big = calloc((size_t)max_message + 1, 1);
    CHECK(big != NULL);
    CHECK_FAILS_WITH(ri2n_send_message(c, big, (size_t)max_message + 1), EMSGSIZE);
    /* a length no message can have is refused as too large, before any byte is read (its
     * length could not be written: it gave EIO, a bug's errno, from a panic) */
    CHECK_FAILS_WITH(ri2n_send_message(c, big, SIZE_MAX), EMSGSIZE);
    CHECK_FAILS_WITH(ri2n_try_send_message(c, big, (size_t)1 << 62), EMSGSIZE);
    free(big);
    CHECK(ri2n_send_datagram(c, "dgram", 5) == 5);
    CHECK(ri2n_recv_datagram(peer, buf, sizeof buf, 5000) == 5 && memcmp(buf, "dgram", 5) == 0);
    CHECK_FAILS_WITH(ri2n_recv_datagram(peer, buf, sizeof buf, 100), ETIMEDOUT);
    CHECK_FAILS_WITH(ri2n_recv_datagram(peer, buf, sizeof buf, 0), EAGAIN);
    CHECK(ri2n_max_datagram_size(c) > 0);
    ri2n_event events[16];
    ssize_t nevents = ri2n_conn_events(c, events, 16);
    CHECK(nevents >= 2);
    CHECK(events[0].kind == RI2N_EVENT_CONNECTED || events[0].kind == RI2N_EVENT_LINK_ADDED);
    int links_added = 0;
    for (ssize_t i = 0; i < nevents; i++) links_added += events[i].kind == RI2N_EVENT_LINK_ADDED;
    CHECK(links_added >= 1);
    printf("messages, datagrams, %zd events: ok\n", nevents);

    /* ECONNRESET: the peer aborted; EPIPE: a write after finish. A reason in the locale's
     * encoding (not UTF-8) aborts all the same (it gave EINVAL and aborted nothing) */
    CHECK(ri2n_abort(peer, 7, "test over, caf\xe9") == 0);
    CHECK_FAILS_WITH(ri2n_read(c, buf, sizeof buf), ECONNRESET);
    CHECK(strstr(ri2n_last_error(), "test over") != NULL);
    CHECK_FAILS_WITH(ri2n_write(c, "x", 1), ECONNRESET);
    /* an empty write too, as write(2) of 0 bytes fails on a reset socket (it returned 0) */
    CHECK_FAILS_WITH(ri2n_write(c, NULL, 0), ECONNRESET);
    ri2n_conn_free(c);
    ri2n_conn_free(peer);
    ri2n_endpoint_free(cl);
    ri2n_endpoint_free(server);
    pair(NULL, NULL, &server, &cl, &c, &peer);
    CHECK(c != NULL);
    CHECK(ri2n_finish(c) == 0);
    CHECK_FAILS_WITH(ri2n_write(c, "x", 1), EPIPE);
    CHECK_FAILS_WITH(ri2n_write(c, NULL, 0), EPIPE);
    CHECK_FAILS_WITH(ri2n_try_write(c, NULL, 0), EPIPE);
    CHECK(ri2n_read(peer, buf, sizeof buf) == 0);
    ri2n_conn_free(c);
    ri2n_conn_free(peer);
    ri2n_endpoint_free(cl);
    ri2n_endpoint_free(server);
    printf("peer aborted: ECONNRESET; write after finish: EPIPE\n");

    /* a server endpoint aborted as a whole: its client's read fails with its code and reason */
    pair(NULL, NULL, &server, &cl, &c, &peer);
    CHECK(c != NULL);
    CHECK(ri2n_endpoint_abort(server, 9, "server stopped, ferm\xe9") == 0);
    CHECK_FAILS_WITH(ri2n_read(c, buf, sizeof buf), ECONNRESET);
    CHECK(strstr(ri2n_last_error(), "server stopped") != NULL);
    CHECK(strstr(ri2n_last_error(), "code 9") != NULL);
    ri2n_conn_free(c);
    ri2n_conn_free(peer);
    ri2n_endpoint_free(cl);
    ri2n_endpoint_free(server);
    printf("endpoint aborted: ECONNRESET with its reason\n");

    tcp_transport();
    messages_two_waiting_threads_could_not_take_are_both_kept();
    a_message_one_thread_kept_goes_to_another_waiting();
    ri2n_endpoint_free(client);
    CHECK(atexit(fail_after_exit) == 0);
    printf("ok\n");
    return 0;
}

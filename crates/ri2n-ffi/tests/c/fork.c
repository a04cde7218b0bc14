/* A process that forks while it holds endpoints and connections: the child cannot use the
 * parent's (their threads stayed in the parent), is told so with EBADF, and frees them
 * without touching the parent's connection; what it makes itself works. The parent's
 * connection carries its data intact afterwards.
 *
 *   fork   (no arguments)
 */
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

#define TOTAL (4u << 20)

static ri2n_conn *accept_one(ri2n_endpoint *server) {
    ri2n_conn *c = ri2n_accept(server, 10000);
    CHECK(c != NULL);
    return c;
}

/* Reads `n` bytes, or fewer if the stream ends first; returns how many. */
static size_t read_all(ri2n_conn *c, unsigned char *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = ri2n_read(c, buf + got, n - got);
        CHECK(r >= 0);
        if (r == 0) {
            break;
        }
        got += (size_t)r;
    }
    return got;
}

/* In the child: the parent's objects fail with EBADF and are let go; a connection of its
 * own to the parent's server carries a word. Exits 0 when all held. */
static void child(ri2n_endpoint *server, ri2n_endpoint *client, ri2n_conn *c, ri2n_conn *s,
                  const char *addr) {
    CHECK_FAILS_WITH(ri2n_write(c, "x", 1), EBADF);
    CHECK(strstr(ri2n_last_error(), "fork") != NULL);
    unsigned char byte;
    CHECK_FAILS_WITH(ri2n_try_read(s, &byte, 1), EBADF);
    CHECK_FAILS_WITH(ri2n_conn_stats(c, NULL, NULL, 0), EBADF);
    const char *remote[] = {addr};
    CHECK_NULL_WITH(ri2n_connect(client, remote, 1, 1000), EBADF);
    CHECK_NULL_WITH(ri2n_accept(server, 0), EBADF);
    /* freeing them here neither waits for the parent's threads nor closes its connection */
    ri2n_conn_free(c);
    ri2n_conn_free(s);
    ri2n_endpoint_free(client);
    ri2n_endpoint_free(server);

    const char *local[] = {"127.0.0.1:0"};
    ri2n_endpoint *mine = ri2n_endpoint_client(local, 1, NULL);
    CHECK(mine != NULL);
    ri2n_conn *own = ri2n_connect(mine, remote, 1, 10000);
    CHECK(own != NULL);
    CHECK(ri2n_write(own, "child", 5) == 5);
    CHECK(ri2n_finish(own) == 0);
    CHECK(ri2n_wait_acknowledged(own, 10000) == 0);
    ri2n_conn_free(own);
    ri2n_endpoint_free(mine);
    printf("child: the parent's objects EBADF, its own connection delivered\n");
    fflush(stdout);
    _exit(0);
}

int main(void) {
    const char *listen[] = {"127.0.0.1:0", "127.0.0.2:0"};
    ri2n_endpoint *server = ri2n_endpoint_server(listen, 2, NULL);
    CHECK(server != NULL);
    char addr[RI2N_ADDR_LEN];
    CHECK(ri2n_endpoint_local_addr(server, 0, addr, sizeof addr) > 0);
    const char *remote[] = {addr};
    const char *local[] = {"127.0.0.1:0", "127.0.0.2:0"};
    ri2n_endpoint *client = ri2n_endpoint_client(local, 2, NULL);
    CHECK(client != NULL);
    ri2n_conn *c = ri2n_connect(client, remote, 1, 10000);
    CHECK(c != NULL);
    ri2n_conn *s = accept_one(server);
    /* a little data first, so that the connection is in use when the process forks */
    CHECK(ri2n_write(c, "hello", 5) == 5);
    unsigned char hello[5];
    CHECK(read_all(s, hello, 5) == 5 && memcmp(hello, "hello", 5) == 0);

    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        child(server, client, c, s, addr);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    /* the child's connection reached the parent's server */
    ri2n_conn *from_child = accept_one(server);
    unsigned char word[8];
    CHECK(read_all(from_child, word, sizeof word) == 5 && memcmp(word, "child", 5) == 0);
    ri2n_conn_free(from_child);

    /* the parent's own connection lives on and carries its bytes intact */
    CHECK(ri2n_conn_error(c) == 0 && ri2n_conn_error(s) == 0);
    static unsigned char sent[TOTAL], got[TOTAL];
    uint64_t seed = 7;
    fill_random(&seed, sent, TOTAL);
    for (size_t off = 0; off < TOTAL;) {
        ssize_t n = ri2n_write(c, sent + off, TOTAL - off);
        CHECK(n > 0);
        off += (size_t)n;
    }
    CHECK(ri2n_finish(c) == 0);
    CHECK(read_all(s, got, TOTAL) == TOTAL);
    CHECK(read_all(s, got, 1) == 0);
    CHECK(memcmp(sent, got, TOTAL) == 0);
    CHECK(ri2n_wait_acknowledged(c, 10000) == 0);
    ri2n_conn_free(c);
    ri2n_conn_free(s);
    ri2n_endpoint_free(client);
    ri2n_endpoint_free(server);
    printf("parent: its connection carried %u bytes intact after the fork\n", TOTAL);
    printf("ok\n");
    return 0;
}

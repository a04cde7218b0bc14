/* 64 MiB over two loopback links with a cluster key, checked by checksum, and what held the
 * sender back; then a client with another key is refused with EACCES and a message naming its
 * key file.
 *
 * usage: transfer DIR [tcp]   (a directory for the key files; tcp: the TCP transport) */
#include <pthread.h>
#include <time.h>

#include "common.h"

#define TOTAL (64u << 20)
#define CHUNK (256u << 10)

struct received {
    ri2n_endpoint *server;
    uint64_t bytes, checksum;
};

static uint64_t now_us(void) {
    struct timespec t;
    CHECK(clock_gettime(CLOCK_MONOTONIC, &t) == 0);
    return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
}

static void *receive(void *arg) {
    struct received *r = arg;
    ri2n_conn *c = ri2n_accept(r->server, 10000);
    CHECK(c != NULL);
    static unsigned char buf[CHUNK];
    r->checksum = FNV_START;
    for (;;) {
        ssize_t n = ri2n_read(c, buf, sizeof buf);
        CHECK(n >= 0);
        if (n == 0) break;
        r->checksum = fnv1a(r->checksum, buf, (size_t)n);
        r->bytes += (uint64_t)n;
    }
    ri2n_conn_free(c);
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 2 || (argc == 3 && strcmp(argv[2], "tcp") == 0));
    int tcp = argc == 3;
    ri2n_endpoint *(*server_at)(const char *const *, size_t, const char *) =
        tcp ? ri2n_endpoint_server_tcp : ri2n_endpoint_server;
    ri2n_endpoint *(*client_at)(const char *const *, size_t, const char *) =
        tcp ? ri2n_endpoint_client_tcp : ri2n_endpoint_client;
    char key[4096], other_key[4096];
    snprintf(key, sizeof key, "%s/cluster.key", argv[1]);
    snprintf(other_key, sizeof other_key, "%s/other.key", argv[1]);
    CHECK(ri2n_key_generate(key) == 0);
    CHECK(ri2n_key_generate(other_key) == 0);
    CHECK_FAILS_WITH(ri2n_key_generate(key), EEXIST);

    const char *listen[] = {"127.0.0.1:0", "127.0.0.2:0"};
    ri2n_endpoint *server = server_at(listen, 2, key);
    CHECK(server != NULL);
    char addr[RI2N_ADDR_LEN];
    CHECK(ri2n_endpoint_local_addr(server, 0, addr, sizeof addr) > 0);
    const char *remote[] = {addr};

    struct received r = {.server = server};
    pthread_t receiver;
    CHECK(pthread_create(&receiver, NULL, receive, &r) == 0);

    const char *local[] = {"127.0.0.1:0", "127.0.0.2:0"};
    ri2n_endpoint *client = client_at(local, 2, key);
    CHECK(client != NULL);
    uint64_t connecting = now_us();
    ri2n_conn *c = ri2n_connect(client, remote, 1, 10000);
    CHECK(c != NULL);

    static unsigned char chunk[CHUNK];
    uint64_t seed = 42, sent_checksum = FNV_START, sent = 0;
    while (sent < TOTAL) {
        fill_random(&seed, chunk, CHUNK);
        sent_checksum = fnv1a(sent_checksum, chunk, CHUNK);
        for (size_t off = 0; off < CHUNK;) {
            ssize_t n = ri2n_write(c, chunk + off, CHUNK - off);
            CHECK(n > 0);
            off += (size_t)n;
        }
        sent += CHUNK;
    }
    CHECK(ri2n_finish(c) == 0);
    CHECK(ri2n_wait_acknowledged(c, 30000) == 0);
    CHECK(pthread_join(receiver, NULL) == 0);
    CHECK(r.bytes == TOTAL);
    CHECK(r.checksum == sent_checksum);

    /* both links carried the data, sealed with the key */
    ri2n_stats stats;
    ri2n_link_stats links[8];
    ssize_t nlinks = ri2n_conn_stats(c, &stats, links, 8);
    CHECK(nlinks == 2);
    CHECK(stats.encrypted == 1);
    CHECK(stats.bytes_acknowledged >= TOTAL);
    /* of which the byte stream's own bytes: exactly what was written */
    uint64_t stream_acked = 0;
    CHECK(ri2n_conn_stream_acknowledged(c, &stream_acked) == 0);
    CHECK(stream_acked == TOTAL);
    for (ssize_t i = 0; i < nlinks; i++) {
        CHECK(links[i].stream_bytes_acked > 0);
        printf("link %u %s -> %s: %llu stream bytes delivered\n", links[i].id, links[i].local,
               links[i].remote, (unsigned long long)links[i].stream_bytes_acked);
    }

    /* what held the sender back: a UDP sender was busy for part of the connection's life
     * (no more than all of it); the TCP transport's kernel connections keep their own account,
     * and this one reads 0 */
    ri2n_send_limits held;
    CHECK(ri2n_conn_send_limits(c, &held) == 0);
    uint64_t lived = now_us() - connecting;
    uint64_t busy = held.sending_us + held.congestion_window_us + held.pacing_us +
                    held.peer_window_us + held.send_buffer_us + held.no_link_us;
    if (tcp) {
        CHECK(busy == 0);
    } else {
        CHECK(busy > 0 && busy <= lived);
        printf("sender busy %llu of %llu us: sending %llu, windows %llu, pacing %llu, peer "
               "%llu, send buffer %llu, no link %llu\n",
               (unsigned long long)busy, (unsigned long long)lived,
               (unsigned long long)held.sending_us,
               (unsigned long long)held.congestion_window_us, (unsigned long long)held.pacing_us,
               (unsigned long long)held.peer_window_us, (unsigned long long)held.send_buffer_us,
               (unsigned long long)held.no_link_us);
    }
    ri2n_conn_free(c);
    printf("%u bytes intact over %zd links, keyed%s\n", TOTAL, nlinks, tcp ? ", tcp" : "");

    /* another key: refused, and the message names this side's key file */
    ri2n_endpoint *stranger = client_at(local, 1, other_key);
    CHECK(stranger != NULL);
    CHECK_NULL_WITH(ri2n_connect(stranger, remote, 1, 10000), EACCES);
    CHECK(strstr(ri2n_last_error(), other_key) != NULL);
    printf("another key refused: %s\n", ri2n_last_error());

    ri2n_endpoint_free(stranger);
    ri2n_endpoint_free(client);
    ri2n_endpoint_free(server);
    printf("ok\n");
    return 0;
}

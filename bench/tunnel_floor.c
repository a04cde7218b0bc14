// What a user-level tunnel costs before any protocol: a null tunnel between two hosts of the
// namespace lab, for iperf3 through it against ri2n's tunnel and MPTCP in the same minutes
// (bench/tunnel-floor runs all three; docs/BENCHMARKS.md §8). It moves each packet the
// interface hands over, a 64 KB TCP segment whole with its virtio-net header (TSO and
// checksum offload on, as `ri2n tunnel` sets them), and nothing else: no sequence numbers,
// acknowledgements, retransmission, key, striping or failover.
//
//   gcc -O2 -pthread -o /tmp/tunnel_floor bench/tunnel_floor.c
//   /tmp/tunnel_floor MODE NETNS_A NETNS_B [A_LINK B_LINK]
//
// Both hosts' interfaces are `fl0` (made beforehand: `ip tuntap add dev fl0 mode tun
// vnet_hdr`, addressed and up); the program opens each inside its namespace (NETNS_A and
// NETNS_B are paths such as /run/netns/NAME), as one process on the machine that runs both.
// MODE:
//   tun   each packet read from one host's interface is written to the other's: the
//         interface's own cost (four copies a packet, two of them inner TCP's)
//   udp   each packet goes as a length-prefixed frame over one UDP socket pair between
//         A_LINK and B_LINK (port 7500), cut into 1400-byte datagrams by the kernel (UDP
//         GSO) and coalesced again on receipt (UDP GRO), as ri2n's links send and receive:
//         the interface's cost and the link's. One link: the lab's links have no rate
//         limit, so one carries whatever the CPUs can move.
//   tcp   the same frames over one TCP connection between A_LINK and B_LINK (port 7500,
//         B listening), as the TCP transport's links carry a stream: the interface's cost
//         and a TCP link's, with its segmentation offloads.
// Each direction of each host has a thread of its own (blocking calls, no polling). A frame
// that arrives incomplete or out of step (a datagram lost, which the lab's idle links do not
// do) ends the program with exit 2: the null tunnel has no repair.

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netinet/udp.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

// a datagram's payload: a 1500-byte MTU less IPv4 and UDP headers, rounded down as ri2n's
// packets are
#define SEGMENT 1400
#define PORT 7500
#define MAX_PACKET 65600

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void enter(const char *netns) {
    int fd = open(netns, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) die(netns);
    close(fd);
}

// fl0 of the namespace the process is in, with ri2n's offloads
static int open_tun(void) {
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    if (fd < 0) die("/dev/net/tun");
    struct ifreq req;
    memset(&req, 0, sizeof req);
    strcpy(req.ifr_name, "fl0");
    req.ifr_flags = IFF_TUN | IFF_NO_PI | IFF_VNET_HDR;
    if (ioctl(fd, TUNSETIFF, &req) < 0) die("TUNSETIFF fl0");
    if (ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4) < 0) die("TUNSETOFFLOAD");
    return fd;
}

static int open_udp(const char *local, const char *remote) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), one = 1, buffer = 32 << 20;
    struct sockaddr_in l = {.sin_family = AF_INET, .sin_port = htons(PORT)}, r = l;
    if (fd < 0 || inet_pton(AF_INET, local, &l.sin_addr) != 1 ||
        inet_pton(AF_INET, remote, &r.sin_addr) != 1)
        die("link address");
    if (bind(fd, (void *)&l, sizeof l) < 0 || connect(fd, (void *)&r, sizeof r) < 0) die(local);
    // the buffers ri2n asks for (root may exceed the sysctl limits, as the lab runs)
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buffer, sizeof buffer) < 0)
        die("socket buffers");
    if (setsockopt(fd, IPPROTO_UDP, UDP_GRO, &one, sizeof one) < 0) die("UDP_GRO");
    return fd;
}

static struct sockaddr_in link_address(const char *ip) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(PORT)};
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) die("link address");
    return a;
}

// tcp mode: a socket of the namespace the process is in, bound to LOCAL
static int tcp_socket(const char *local) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in l = link_address(local);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(fd, (void *)&l, sizeof l) < 0)
        die(local);
    return fd;
}

// small packets (inner TCP's acknowledgements) go at once, as ri2n's TCP links send them
static void no_delay(int fd) {
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) die("TCP_NODELAY");
}

struct direction {
    int from, to;
};

// tun mode: packets from one interface to the other
static void *tun_to_tun(void *arg) {
    const struct direction *d = arg;
    static __thread char packet[MAX_PACKET];
    for (;;) {
        ssize_t n = read(d->from, packet, sizeof packet);
        if (n <= 0) die("read fl0");
        if (write(d->to, packet, (size_t)n) != n) die("write fl0");
    }
    return NULL;
}

// udp and tcp modes: the next packet read from the interface as a frame, [length][virtio-net
// header and packet]; returns the frame's length
static size_t read_frame(const struct direction *d, char *frame, size_t size) {
    ssize_t n = read(d->from, frame + 4, size - 4);
    if (n <= 0) die("read fl0");
    uint32_t len = (uint32_t)n;
    memcpy(frame, &len, 4);
    return 4 + (size_t)n;
}

// udp mode, sending: each frame as one GSO send
static void *tun_to_udp(void *arg) {
    const struct direction *d = arg;
    static __thread char frame[4 + MAX_PACKET];
    for (;;) {
        struct iovec iov = {frame, read_frame(d, frame, sizeof frame)};
        char control[CMSG_SPACE(sizeof(uint16_t))];
        memset(control, 0, sizeof control);
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        if (iov.iov_len > SEGMENT) {
            msg.msg_control = control;
            msg.msg_controllen = sizeof control;
            struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
            c->cmsg_level = IPPROTO_UDP;
            c->cmsg_type = UDP_SEGMENT;
            c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t segment = SEGMENT;
            memcpy(CMSG_DATA(c), &segment, sizeof segment);
        }
        if (sendmsg(d->to, &msg, 0) != (ssize_t)iov.iov_len) die("send");
    }
    return NULL;
}

// tcp mode, sending: each frame written whole to the stream
static void *tun_to_tcp(void *arg) {
    const struct direction *d = arg;
    static __thread char frame[4 + MAX_PACKET];
    for (;;) {
        size_t n = read_frame(d, frame, sizeof frame);
        for (size_t at = 0; at < n;) {
            ssize_t w = write(d->to, frame + at, n - at);
            if (w <= 0) die("write tcp");
            at += (size_t)w;
        }
    }
    return NULL;
}

// udp and tcp modes, receiving: the datagrams in order make a byte stream of frames
static void *link_to_tun(void *arg) {
    const struct direction *d = arg;
    static __thread char stream[1 << 20];
    size_t held = 0;
    for (;;) {
        ssize_t n = recv(d->from, stream + held, sizeof stream - held, 0);
        if (n <= 0) die("recv link");
        held += (size_t)n;
        size_t at = 0;
        while (held - at >= 4) {
            uint32_t len;
            memcpy(&len, stream + at, 4);
            if (len > MAX_PACKET) {
                fprintf(stderr, "tunnel_floor: a frame out of step (a datagram lost?)\n");
                exit(2);
            }
            if (held - at < 4 + (size_t)len) break;
            if (write(d->to, stream + at + 4, len) != (ssize_t)len) die("write fl0");
            at += 4 + len;
        }
        memmove(stream, stream + at, held - at);
        held -= at;
    }
    return NULL;
}

int main(int argc, char **argv) {
    int udp = argc == 6 && strcmp(argv[1], "udp") == 0;
    int tcp = argc == 6 && strcmp(argv[1], "tcp") == 0;
    if (!udp && !tcp && !(argc == 4 && strcmp(argv[1], "tun") == 0)) {
        fprintf(stderr, "usage: tunnel_floor tun NETNS_A NETNS_B\n"
                        "       tunnel_floor udp|tcp NETNS_A NETNS_B A_LINK B_LINK\n");
        return 64;
    }
    int link_a = -1, link_b = -1;
    enter(argv[2]);
    int tun_a = open_tun();
    if (udp) link_a = open_udp(argv[4], argv[5]);
    if (tcp) link_a = tcp_socket(argv[4]);
    enter(argv[3]);
    int tun_b = open_tun();
    if (udp) link_b = open_udp(argv[5], argv[4]);
    if (tcp) {
        // a socket keeps the namespace it was made in: A's connects from A
        int listener = tcp_socket(argv[5]);
        struct sockaddr_in b = link_address(argv[5]);
        if (listen(listener, 1) < 0 || connect(link_a, (void *)&b, sizeof b) < 0) die("connect");
        link_b = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (link_b < 0) die("accept");
        close(listener);
        no_delay(link_a);
        no_delay(link_b);
    }
    static struct direction d[4];
    void *(*run[4])(void *);
    int threads;
    if (udp || tcp) {
        void *(*send)(void *) = udp ? tun_to_udp : tun_to_tcp;
        d[0] = (struct direction){tun_a, link_a}, run[0] = send;
        d[1] = (struct direction){link_b, tun_b}, run[1] = link_to_tun;
        d[2] = (struct direction){tun_b, link_b}, run[2] = send;
        d[3] = (struct direction){link_a, tun_a}, run[3] = link_to_tun;
        threads = 4;
    } else {
        d[0] = (struct direction){tun_a, tun_b}, run[0] = tun_to_tun;
        d[1] = (struct direction){tun_b, tun_a}, run[1] = tun_to_tun;
        threads = 2;
    }
    for (int i = 1; i < threads; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, run[i], &d[i]) != 0) die("pthread_create");
    }
    run[0](&d[0]);
    return 0;
}

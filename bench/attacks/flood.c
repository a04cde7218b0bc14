/* Datagram floods for bench/attacks.py, at a fixed rate (bursts every millisecond), for a
 * fixed time; prints how many it sent. A C program so that the flood costs the machine far
 * less than the ri2n processes it is aimed at.
 *
 *   flood junk  DSTS PORTS RATE SECS          random bytes (16..1216 of them) from spoofed
 *                                             sources 127.x.y.z:random (raw socket, root)
 *   flood reset DSTS PORTS RATE SECS VERSION  26-byte RESETs of protocol VERSION with random
 *                                             connection IDs and tokens, from one UDP socket
 *
 * DSTS: IPv4 addresses separated by commas; PORTS: ports separated by commas.
 */
#include <arpa/inet.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static unsigned long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000ull + t.tv_nsec;
}

static int split(char *list, char **out, int max) {
    int n = 0;
    for (char *t = strtok(list, ","); t && n < max; t = strtok(NULL, ",")) out[n++] = t;
    return n;
}

int main(int argc, char **argv) {
    if (argc < 6 || (strcmp(argv[1], "junk") && strcmp(argv[1], "reset")) ||
        (!strcmp(argv[1], "reset") && argc < 7)) {
        fprintf(stderr, "usage: flood junk|reset DSTS PORTS RATE SECS [VERSION]\n");
        return 2;
    }
    int junk = !strcmp(argv[1], "junk");
    char *dsts[16], *ports_s[16];
    int nd = split(argv[2], dsts, 16), np = split(argv[3], ports_s, 16);
    struct sockaddr_in to[16 * 16];
    int nt = 0;
    for (int i = 0; i < nd; i++)
        for (int j = 0; j < np; j++) {
            memset(&to[nt], 0, sizeof to[nt]);
            to[nt].sin_family = AF_INET;
            to[nt].sin_port = htons(atoi(ports_s[j]));
            if (inet_pton(AF_INET, dsts[i], &to[nt].sin_addr) != 1) return 2;
            nt++;
        }
    long rate = atol(argv[4]);
    double secs = atof(argv[5]);
    int version = junk ? 0 : atoi(argv[6]);
    int fd = junk ? socket(AF_INET, SOCK_RAW, IPPROTO_RAW) : socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) {
        perror("socket");
        return 1;
    }
    srand(7);
    /* a pool of random payloads, so that making them costs nothing in the loop */
    static unsigned char pool[64][28 + 1216];
    static int plen[64];
    for (int q = 0; q < 64; q++) {
        plen[q] = 16 + rand() % 1200;
        for (int k = 0; k < plen[q]; k++) pool[q][28 + k] = rand();
    }
    unsigned long long start = now_ns(), next = start;
    long sent = 0, burst = rate / 1000 > 0 ? rate / 1000 : 1;
    while (now_ns() - start < secs * 1e9) {
        unsigned long long n = now_ns();
        if (n < next) {
            struct timespec s = {0, (long)(next - n)};
            nanosleep(&s, NULL);
            continue;
        }
        next += 1000000;
        for (long i = 0; i < burst; i++) {
            struct sockaddr_in *d = &to[rand() % nt];
            if (junk) {
                int q = rand() % 64, len = plen[q];
                unsigned char *p = pool[q];
                struct iphdr *ip = (void *)p;
                struct udphdr *u = (void *)(p + 20);
                memset(ip, 0, 20);
                ip->version = 4;
                ip->ihl = 5;
                ip->ttl = 64;
                ip->protocol = 17;
                ip->tot_len = htons(28 + len);
                ip->saddr = htonl(0x7f000000u | (1 + rand() % 0xfffffe));
                ip->daddr = d->sin_addr.s_addr;
                u->source = htons(1024 + rand() % 60000);
                u->dest = d->sin_port;
                u->len = htons(8 + len);
                u->check = 0;
                if (sendto(fd, p, 28 + len, 0, (void *)d, sizeof *d) > 0) sent++;
            } else {
                unsigned char r[26] = {version, 0x13};
                for (int k = 2; k < 26; k++) r[k] = rand();
                if (sendto(fd, r, sizeof r, 0, (void *)d, sizeof *d) > 0) sent++;
            }
        }
    }
    printf("%ld\n", sent);
    return 0;
}

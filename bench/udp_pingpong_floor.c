// The kernel's share of a pinned 64-byte UDP ping-pong, by socket pattern: what ri2n's round
// trip would cost if its own code took no time (docs/BENCHMARKS.md, "Misses" 2026-11-25
// 07:24). Both ends run on CPU 0 over loopback; each has a second, idle socket, as ri2n has
// one socket per link.
//
//   gcc -O2 -o /tmp/udp_pingpong_floor bench/udp_pingpong_floor.c
//   /tmp/udp_pingpong_floor PATTERN [COUNT]
//
// PATTERN:
//   recvfrom            blocking recvfrom, sendto (sockperf's pattern)
//   recvfrom-connected  the same on connected sockets (send, no route lookup per datagram)
//   ri2n                edge-triggered epoll_wait on both sockets, one recvmmsg of up to 32
//                       (it returns after the first try that finds the queue empty), sendto
//   ri2n-connected      the same on connected sockets
//   ri2n-single         level-triggered epoll_wait on both sockets, one recvmsg with room for
//                       control messages (what a waiting ri2n call does on a source that
//                       carries one datagram at a time), sendto
//   ri2n-single-connected  the same on connected sockets
//
// Prints the median round trip of COUNT (default 100000) after 1000 not counted.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int use_epoll, connected, single;

// a socket on 127.0.0.1, port chosen by the kernel
static int bound_socket(int nonblocking, struct sockaddr_in *addr) {
  int s = socket(AF_INET, SOCK_DGRAM | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  socklen_t len = sizeof a;
  if (s < 0 || bind(s, (void *)&a, sizeof a) || getsockname(s, (void *)&a, &len)) {
    perror("socket");
    exit(1);
  }
  if (addr) *addr = a;
  return s;
}

static char bufs[32][2048];

// one datagram from `s`; its sender in `from`
static int receive(int s, int ep, struct sockaddr_in *from) {
  if (!use_epoll) {
    socklen_t len = sizeof *from;
    return recvfrom(s, bufs[0], sizeof bufs[0], 0, (void *)from, &len);
  }
  struct epoll_event ev[8];
  struct mmsghdr m[32];
  struct iovec io[32];
  struct sockaddr_in names[32];
  for (;;) {
    epoll_wait(ep, ev, 8, -1);
    if (single) {
      // level-triggered: what is left is reported again, so one datagram is taken alone
      char control[64];
      struct iovec one = {.iov_base = bufs[0], .iov_len = sizeof bufs[0]};
      struct msghdr h = {.msg_name = from, .msg_namelen = sizeof *from, .msg_iov = &one,
                         .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof control};
      int n = recvmsg(s, &h, 0);
      if (n > 0) return n;
      continue;
    }
    for (int i = 0; i < 32; i++) {
      io[i] = (struct iovec){.iov_base = bufs[i], .iov_len = sizeof bufs[i]};
      memset(&m[i], 0, sizeof m[i]);
      m[i].msg_hdr.msg_iov = &io[i];
      m[i].msg_hdr.msg_iovlen = 1;
      m[i].msg_hdr.msg_name = &names[i];
      m[i].msg_hdr.msg_namelen = sizeof names[i];
    }
    if (recvmmsg(s, m, 32, 0, NULL) > 0) {
      *from = names[0];
      return m[0].msg_len;
    }
  }
}

static void send_to(int s, int len, const struct sockaddr_in *to) {
  if (connected)
    send(s, bufs[0], len, 0);
  else
    sendto(s, bufs[0], len, 0, (const void *)to, sizeof *to);
}

static int end_setup(int s, const struct sockaddr_in *peer) {
  int ep = epoll_create1(0);
  struct epoll_event e = {.events = EPOLLIN | (single ? 0 : EPOLLET)};
  epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
  int idle = bound_socket(1, NULL);
  e.data.u32 = 1;
  epoll_ctl(ep, EPOLL_CTL_ADD, idle, &e);
  if (connected) connect(s, (const void *)peer, sizeof *peer);
  return ep;
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  const char *pattern = argc > 1 ? argv[1] : "";
  int count = argc > 2 ? atoi(argv[2]) : 100000;
  use_epoll = !strncmp(pattern, "ri2n", 4);
  connected = strstr(pattern, "-connected") != NULL;
  single = !strncmp(pattern, "ri2n-single", 11);
  const char *known[] = {"recvfrom", "recvfrom-connected", "ri2n", "ri2n-connected",
                         "ri2n-single", "ri2n-single-connected"};
  int ok = 0;
  for (size_t i = 0; i < sizeof known / sizeof *known; i++) ok |= !strcmp(pattern, known[i]);
  if (count < 1 || !ok) {
    fprintf(stderr,
            "usage: %s recvfrom|recvfrom-connected|ri2n|ri2n-connected|ri2n-single|"
            "ri2n-single-connected [COUNT]\n",
            argv[0]);
    return 2;
  }
  cpu_set_t cpu0;
  CPU_ZERO(&cpu0);
  CPU_SET(0, &cpu0);
  sched_setaffinity(0, sizeof cpu0, &cpu0);
  struct sockaddr_in server_addr, client_addr;
  int server = bound_socket(use_epoll, &server_addr);
  int client = bound_socket(use_epoll, &client_addr);
  pid_t echo = fork();
  if (echo == 0) {
    close(client);
    int ep = end_setup(server, &client_addr);
    for (;;) {
      struct sockaddr_in from;
      int n = receive(server, ep, &from);
      send_to(server, n, &from);
    }
  }
  close(server);
  int ep = end_setup(client, &server_addr);
  double *rtt = malloc(count * sizeof *rtt);
  memset(bufs[0], 7, 64);
  for (int i = 0; i < count + 1000; i++) {
    struct sockaddr_in from;
    double t = now_us();
    send_to(client, 64, &server_addr);
    receive(client, ep, &from);
    if (i >= 1000) rtt[i - 1000] = now_us() - t;
  }
  kill(echo, SIGTERM);
  waitpid(echo, NULL, 0);
  qsort(rtt, count, sizeof *rtt, by_value);
  printf("%s: median round trip %.2f us over %d\n", pattern, rtt[count / 2], count);
  return 0;
}

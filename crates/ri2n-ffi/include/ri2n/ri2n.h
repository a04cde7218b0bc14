/* ri2n: one reliable channel striped over several network links.
 *
 * Generated from crates/ri2n-ffi by cbindgen: do not edit.
 *
 * Every call that fails returns NULL or a negative errno value and sets errno;
 * ri2n_last_error() then says what went wrong, in words. Every function is safe
 * to call from any thread; one ri2n_conn may be read by one thread while another
 * writes to it. The calls that wait go on waiting through signals, as read(2) does
 * under SA_RESTART: a program that must act on a signal (Ctrl-C) waits with poll(2)
 * on the readiness descriptors (ri2n_conn_read_fd, ri2n_conn_write_fd,
 * ri2n_endpoint_fd) and calls the ri2n_try_* functions, or gives the waiting
 * calls that take one a timeout.
 *
 * After fork(2), the endpoints and connections made before it belong to the parent:
 * their threads are not in the child. There every call on them fails with EBADF, and
 * ri2n_conn_free and ri2n_endpoint_free let them go without a word to the peer (the
 * parent's connections carry on); a child makes new ones of its own. */

#ifndef RI2N_H
#define RI2N_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

// Room for any socket address as text, `[IPv6%scope]:port` included, with its NUL.
#define RI2N_ADDR_LEN 64

// A link's state.
typedef enum ri2n_link_state {
  // Newly opened, waiting for its first acknowledgements; carries only probes.
  RI2N_LINK_VALIDATING = 0,
  // Healthy: carries data.
  RI2N_LINK_UP = 1,
  // Alive but far slower than it was (a soft failure); carries only probes.
  RI2N_LINK_DEGRADED = 2,
  // Nothing gets through; probed until it works again.
  RI2N_LINK_DOWN = 3,
} ri2n_link_state;

// What an event reports.
typedef enum ri2n_event_kind {
  // The handshake completed.
  RI2N_EVENT_CONNECTED = 0,
  // A link was added (it starts out validating). Link 0, the one the handshake took,
  // comes with the connection: `RI2N_EVENT_CONNECTED` tells it, no `LINK_ADDED` does.
  RI2N_EVENT_LINK_ADDED = 1,
  // A link changed state (`from` → `to`).
  RI2N_EVENT_LINK_STATE = 2,
  // Everything written and the end of the streams were acknowledged.
  RI2N_EVENT_ALL_ACKNOWLEDGED = 3,
  // The connection ended: `error` is 0 for a clean close, else its errno.
  RI2N_EVENT_CLOSED = 4,
} ri2n_event_kind;

// One ri2n connection.
typedef struct ri2n_conn ri2n_conn;

// A host's ri2n endpoint: its local addresses (one per link), its threads and connections.
typedef struct ri2n_endpoint ri2n_endpoint;

// A connection's counters.
typedef struct ri2n_stats {
  // Links the connection has (of any state).
  uint64_t links;
  // Bytes written and not yet acknowledged (with their framing, as `bytes_acknowledged`
  // counts them).
  uint64_t send_buffered;
  // Bytes received and not yet read (out-of-order data included; with their framing, as
  // `bytes_received` counts them).
  uint64_t recv_buffered;
  // Bytes written that the peer acknowledged, each counted once: what was delivered, with
  // its framing (a message's few bytes of length prefix; on the TCP transport a 5-byte
  // header per chunk, up to one per write): a count of progress, which runs ahead of the
  // bytes written when writes or messages are small. `ri2n_wait_acknowledged` tells when
  // everything written was delivered.
  uint64_t bytes_acknowledged;
  // Bytes that arrived from the peer in order, each counted once (with their framing, as
  // `bytes_acknowledged` counts them).
  uint64_t bytes_received;
  // 1 when packets are sealed with the cluster key, else 0.
  uint32_t encrypted;
  // Key updates so far, sending.
  uint64_t key_updates_sent;
  // Key updates so far, receiving.
  uint64_t key_updates_received;
  // Unreliable datagrams sent.
  uint64_t datagrams_sent;
  // Datagrams dropped unsent (queue full, too old, no link could carry them).
  uint64_t datagrams_send_dropped;
  // Datagrams that arrived.
  uint64_t datagrams_received;
  // Datagrams that arrived and were dropped (not read in time, or a piece was lost).
  uint64_t datagrams_receive_dropped;
} ri2n_stats;

// One link of a connection.
typedef struct ri2n_link_stats {
  // The link's number in its connection.
  uint32_t id;
  // Its state now.
  enum ri2n_link_state state;
  // Local address, e.g. `"10.0.1.1:43122"`.
  char local[RI2N_ADDR_LEN];
  // Remote address.
  char remote[RI2N_ADDR_LEN];
  // Smoothed round-trip time, microseconds.
  uint64_t srtt_us;
  // Smallest round-trip time seen, microseconds.
  uint64_t min_rtt_us;
  // Congestion window, bytes.
  uint64_t cwnd;
  // Bytes sent and neither acknowledged nor lost.
  uint64_t bytes_in_flight;
  // Datagram bytes sent on the link.
  uint64_t bytes_sent;
  // Datagram bytes received on the link.
  uint64_t bytes_received;
  // Packets sent.
  uint64_t packets_sent;
  // Packets received.
  uint64_t packets_received;
  // Packets declared lost (those re-sent on other links when it failed included).
  uint64_t packets_lost;
  // Stream bytes sent on the link (first transmissions and repairs).
  uint64_t stream_bytes_sent;
  // Stream bytes the peer acknowledged in packets sent on this link.
  uint64_t stream_bytes_acked;
  // Size of a full data packet now (UDP payload bytes).
  uint64_t max_datagram;
} ri2n_link_stats;

// What held a connection's sender back: of the time it was busy (data written and not yet
// sent, or sent and not yet acknowledged), how long it sent at its own pace and how long it
// waited, and for what, in microseconds since the connection was made. The same account
// Linux keeps for a TCP connection in `tcp_info`: a transfer slower than its links that
// waited for nothing was held back by its own speed (the CPU), one that waited for windows
// by the path or the peer. A separate record from [`ri2n_stats`], so that programs built
// against that one keep working. All 0 on the TCP transport, whose kernel connections keep
// their own.
typedef struct ri2n_send_limits {
  // Nothing held the data back: it went out as fast as it was written and packed.
  uint64_t sending_us;
  // Every up link's congestion window was full.
  uint64_t congestion_window_us;
  // Pacing held the next packet back (a window had room).
  uint64_t pacing_us;
  // Data written waited for the peer's receive window, and nothing else waited.
  uint64_t peer_window_us;
  // Everything written was sent, and a writer waited for room in the send buffer.
  uint64_t send_buffer_us;
  // No link was up.
  uint64_t no_link_us;
} ri2n_send_limits;

// One event of a connection.
typedef struct ri2n_event {
  // What happened.
  enum ri2n_event_kind kind;
  // The link concerned, or -1.
  int32_t link;
  // A link's previous state (`RI2N_EVENT_LINK_STATE`).
  enum ri2n_link_state from;
  // A link's new state (`RI2N_EVENT_LINK_STATE`; `RI2N_LINK_VALIDATING` when added).
  enum ri2n_link_state to;
  // `RI2N_EVENT_CLOSED`: 0 for a clean close, else why, as an errno value.
  int32_t error;
  // When it happened, microseconds on `CLOCK_MONOTONIC` (comparable with
  // `clock_gettime(CLOCK_MONOTONIC)`).
  uint64_t at_us;
} ri2n_event;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// Writes at most `len` bytes of `buf` to the byte stream, waiting until the send buffer takes
// some (while every link is down too); returns how many it took. `-EPIPE` after
// [`ri2n_finish`], `-ECONNRESET` when the peer is gone or aborted, `-ETIMEDOUT` when the
// connection timed out; for `len` 0 too (0 while the stream is open).
//
// # Safety
// `c` is a live connection; `buf` points to `len` readable bytes.
ssize_t ri2n_write(struct ri2n_conn *c, const void *buf, size_t len);

// Reads at most `len` bytes of the byte stream into `buf`, waiting until some are there;
// returns how many, 0 at the end of the peer's stream (after its [`ri2n_finish`]).
//
// # Safety
// `c` is a live connection; `buf` points to `len` writable bytes.
ssize_t ri2n_read(struct ri2n_conn *c, void *buf, size_t len);

// [`ri2n_write`] without waiting: `-EAGAIN` when the send buffer is full.
//
// # Safety
// As for [`ri2n_write`].
ssize_t ri2n_try_write(struct ri2n_conn *c, const void *buf, size_t len);

// [`ri2n_read`] without waiting: `-EAGAIN` when nothing is there to read.
//
// # Safety
// As for [`ri2n_read`].
ssize_t ri2n_try_read(struct ri2n_conn *c, void *buf, size_t len);

// Sends `len` bytes as one whole message (the peer receives it whole and in order with
// [`ri2n_recv_message`]), waiting for buffer space; returns `len`. `-EMSGSIZE` above
// [`ri2n_max_message_size`]; `-EINVAL` for an empty message, which a C receiver could not
// tell from the end of the stream; `-EOPNOTSUPP` when the peer said it takes no messages
// (`ri2n recv`, a byte-stream reader, takes none).
//
// # Safety
// `c` is a live connection; `buf` points to `len` readable bytes.
ssize_t ri2n_send_message(struct ri2n_conn *c, const void *buf, size_t len);

// [`ri2n_send_message`] without waiting: `-EAGAIN` when the send buffer has no room for it.
//
// # Safety
// As for [`ri2n_send_message`].
ssize_t ri2n_try_send_message(struct ri2n_conn *c, const void *buf, size_t len);

// Receives the next whole message into `buf`, waiting for it; returns its length, 0 at the
// end of the peer's stream. `-EMSGSIZE` when it is longer than `len`: it is kept for the
// next call, and [`ri2n_last_error`](crate::ri2n_last_error) names its size (a message is
// at most this side's stream receive window less 8 bytes: 8 MiB less 8 for the endpoints
// this library makes, whatever the peer's own [`ri2n_max_message_size`], which bounds what
// this side sends). Threads receiving messages at once take turns: the message one kept is
// the next for whichever call comes, in order. `-EBADMSG` for an empty message from a peer
// in another language, which is skipped.
//
// # Safety
// `c` is a live connection; `buf` points to `len` writable bytes.
ssize_t ri2n_recv_message(struct ri2n_conn *c, void *buf, size_t len);

// [`ri2n_recv_message`] without waiting: `-EAGAIN` when no whole message is there, or while
// another thread's call is receiving one (what comes goes to that call).
//
// # Safety
// As for [`ri2n_recv_message`].
ssize_t ri2n_try_recv_message(struct ri2n_conn *c, void *buf, size_t len);

// Largest message [`ri2n_send_message`] accepts, in bytes (negative errno on failure).
//
// # Safety
// `c` is a live connection.
ssize_t ri2n_max_message_size(const struct ri2n_conn *c);

// Sends `len` bytes as one unreliable datagram: the peer receives it whole or not at all,
// at most once, in sending order (after a short wait for a missing one; a late one is still
// delivered); it is sent once, never repaired after a loss (only one a failing link held is
// sent once more on another). Does not wait for the links (datagrams wait in a bounded
// queue, the oldest dropped when it is full); with a sending thread per link that falls
// behind, it waits for those once the queue is half full (at most the datagram age limit,
// 20 ms). Returns `len`; `-EMSGSIZE` above
// [`ri2n_max_datagram_size`]; `-EOPNOTSUPP` when the peer said it takes no datagrams.
//
// # Safety
// `c` is a live connection; `buf` points to `len` readable bytes.
ssize_t ri2n_send_datagram(struct ri2n_conn *c, const void *buf, size_t len);

// Receives one datagram into `buf`, waiting at most `timeout_ms` (negative: as long as it
// takes; 0: only looks); returns its length (an empty datagram gives 0). `-ETIMEDOUT` (or
// `-EAGAIN` with 0) when none came, `-ENOTCONN` once the connection closed cleanly and every
// datagram was read, `-EMSGSIZE` when it is longer than `len` (kept for the next call). A
// connection that itself timed out gives `-ETIMEDOUT` at once, every time: a loop that
// retries on `-ETIMEDOUT` asks [`ri2n_conn_error`] whether the connection still lives.
// Threads receiving datagrams at once take turns, as for messages (the wait for the turn
// counts in `timeout_ms`; with 0, another thread's call receiving gives `-EAGAIN`).
//
// # Safety
// `c` is a live connection; `buf` points to `len` writable bytes.
ssize_t ri2n_recv_datagram(struct ri2n_conn *c, void *buf, size_t len, int timeout_ms);

// Largest datagram [`ri2n_send_datagram`] accepts, in bytes (negative errno on failure); 0
// on the TCP transport, which carries none (`ri2n_send_datagram` fails with `EOPNOTSUPP`).
//
// # Safety
// `c` is a live connection.
ssize_t ri2n_max_datagram_size(const struct ri2n_conn *c);

// Ends this side's streams: no more writes or messages; the peer reads 0 after the last
// byte. Returns 0, or the negative errno of the connection's end once it ended on an error
// (nothing will carry this end then).
//
// # Safety
// `c` is a live connection.
int ri2n_finish(struct ri2n_conn *c);

// Waits at most `timeout_ms` (negative: as long as it takes) until the peer acknowledged
// everything written and the end of the streams (call [`ri2n_finish`] first). 0, or
// `-ETIMEDOUT`, or the errno of the connection's end (`-ETIMEDOUT` too for a connection that
// timed out: [`ri2n_conn_error`] tells them apart).
//
// # Safety
// `c` is a live connection.
int ri2n_wait_acknowledged(struct ri2n_conn *c, int timeout_ms);

// Whether the connection has ended, and how, as `SO_ERROR` tells of a socket: 0 while it has
// not (connecting, carrying data, or with every link down but not given up), `-ENOTCONN`
// once it closed cleanly, else the negative errno its calls now fail with (`-ETIMEDOUT`: it
// timed out, every link down too long or idle; `-ECONNRESET`: the peer ended it;
// `-ECONNABORTED`: this side aborted it; `-EPROTO`: a side broke the protocol), with
// `ri2n_last_error()` naming the reason. A
// timed call's `-ETIMEDOUT` says either that nothing came in time or that the connection
// itself timed out: this tells which.
//
// # Safety
// `c` is a live connection.
int ri2n_conn_error(const struct ri2n_conn *c);

// Aborts the connection at once; the peer's calls fail with `ECONNRESET` and see `code` (up
// to 2^62 - 17; a larger one as that) and `reason` (may be NULL; bytes that are not UTF-8
// are replaced) in their error text. Returns 0 (or a negative errno).
//
// # Safety
// `c` is a live connection; `reason` is NULL or a NUL-terminated string.
int ri2n_abort(struct ri2n_conn *c, uint64_t code, const char *reason);

// Ends the connection when no link has been up for `all_links_down_ms` milliseconds, or
// nothing at all was received from the peer for `idle_ms` (a host gone without a word, its
// power cut): each negative for never, the default, with which the connection waits out any
// outage. Its calls then fail with `-ETIMEDOUT`, as does [`ri2n_conn_error`]. Counted from
// what already happened: links down longer than the new limit end it at once. An idle
// limit of less than a second may end a healthy connection that has nothing to say (a
// quiet peer is heard from about every 200 ms). Each call sets both. Returns 0, or `-EINVAL`
// for a limit of 0 or a NULL connection.
//
// # Safety
// `c` is a live connection.
int ri2n_conn_set_timeouts(struct ri2n_conn *c, int all_links_down_ms, int idle_ms);

// A descriptor that becomes readable when a retry of a read, receive or write call may
// succeed (data, a message or a datagram arrived, buffer space was freed, a link changed
// state, the connection ended). Register it with `poll`/`epoll` for reading; never read or
// close it. The `ri2n_try_*` calls clear it before they look, so after one returned
// `-EAGAIN` it becomes readable as soon as retrying may succeed: call them until `-EAGAIN`
// after each wake-up (it is edge-like). `-EMSGSIZE` is no `-EAGAIN`: the message or
// datagram kept waits for the next call, with a larger buffer, not for the descriptor,
// which stays quiet until something else arrives. Valid while `c` lives; remove it from
// `epoll` (or `poll`) before [`ri2n_conn_free`]: it stays open, and may still signal, until
// the connection's end, after the free.
//
// # Safety
// `c` is a live connection.
int ri2n_conn_fd(const struct ri2n_conn *c);

// A descriptor for the reading calls alone (`ri2n_read`'s and the receiving calls'
// `ri2n_try_*` forms): readable when a retry may succeed, cleared only by them. With
// [`ri2n_conn_write_fd`], a reader and a writer that wait apart (two threads, or callbacks
// per direction) never clear each other's wake-ups, as they could sharing [`ri2n_conn_fd`].
//
// # Safety
// `c` is a live connection.
int ri2n_conn_read_fd(const struct ri2n_conn *c);

// A descriptor for the writing calls alone (`ri2n_try_write`, `ri2n_try_send_message`):
// readable when a retry may succeed (room was freed, or the connection changed state),
// cleared only by them. Call them until `-EAGAIN`: only a refused write makes the connection
// signal room.
//
// # Safety
// `c` is a live connection.
int ri2n_conn_write_fd(const struct ri2n_conn *c);

// Frees the connection. Like dropping a Rust connection: the streams are finished and what
// was written is still delivered in the background while the endpoint lives and the peer
// is heard from (a peer silent for the endpoint's linger, at least a second and three
// keepalive intervals, ends it;
// freeing the endpoint waits for it). Freed after its endpoint, the last connection of the endpoint
// waits here instead, at most the endpoint's linger (10 s), for what it holds to be
// delivered. NULL is ignored. Its sockets and threads may outlive the call by as long
// (on the TCP transport a socket and a thread per link, until the end is delivered).
//
// Never free a connection while another thread is in a call on it, or may still start
// one: as with `close(2)` on a socket, the call is not woken, and it would go on with the
// freed memory. Wake such calls first with [`ri2n_abort`] (they return `-ECONNABORTED`),
// wait for them to return, then free.
//
// # Safety
// `c` is NULL or a live connection, not used again (by any thread).
void ri2n_conn_free(struct ri2n_conn *c);

// An endpoint that accepts connections on `listen_addrs` (`n` strings such as
// `"10.0.1.2:7000"`, one per link; port 0 picks a free port) and tells each client all of
// them, so a client given one opens a link to each. `key_file`: a file made by `ri2n keygen`
// that every host of the cluster holds (connections are then authenticated and encrypted,
// and peers with another key or none are refused), or NULL for no key. NULL on failure:
// `EINVAL` (bad address or key file), `EADDRINUSE`, `EADDRNOTAVAIL`, `ENOENT` (no key file),
// `EACCES` (a key file this process may not read: keygen makes it readable by its owner
// alone).
//
// # Safety
// `listen_addrs` points to `n` NUL-terminated strings; `key_file` is NULL or one.
struct ri2n_endpoint *ri2n_endpoint_server(const char *const *listen_addrs,
                                           size_t n,
                                           const char *key_file);

// An endpoint that makes connections from `local_addrs` (one per link, e.g. `"10.0.1.1:0"`
// and `"10.0.2.1:0"`). `key_file` as for [`ri2n_endpoint_server`].
//
// # Safety
// `local_addrs` points to `n` NUL-terminated strings; `key_file` is NULL or one.
struct ri2n_endpoint *ri2n_endpoint_client(const char *const *local_addrs,
                                           size_t n,
                                           const char *key_file);

// [`ri2n_endpoint_server`] on the TCP transport: each link is one TCP connection, the
// stream and messages striped over them (docs/PROTOCOL.md §12). Only TCP-transport clients
// reach it; unreliable datagrams are refused (`EOPNOTSUPP`).
//
// # Safety
// As for [`ri2n_endpoint_server`].
struct ri2n_endpoint *ri2n_endpoint_server_tcp(const char *const *listen_addrs,
                                               size_t n,
                                               const char *key_file);

// [`ri2n_endpoint_client`] on the TCP transport, for servers made with
// [`ri2n_endpoint_server_tcp`] (a UDP server refuses it: `ECONNREFUSED`).
//
// # Safety
// As for [`ri2n_endpoint_client`].
struct ri2n_endpoint *ri2n_endpoint_client_tcp(const char *const *local_addrs,
                                               size_t n,
                                               const char *key_file);

// Connects to a peer given one or more of its addresses, waiting for the handshake at most
// `timeout_ms` (0 or less: the library's default, 10 s). NULL on failure, with errno
// `ETIMEDOUT` (no answer), `ECONNREFUSED` (nothing listens there, or it is not a server, or
// it is full), `EACCES` (the peer holds another key, or only one side has one), `EINVAL`
// (bad address), `EADDRNOTAVAIL` (a TCP client's local address is not this machine's: it
// binds each connection's sockets only here).
//
// # Safety
// `ep` is a live endpoint; `remote_addrs` points to `n` NUL-terminated strings.
struct ri2n_conn *ri2n_connect(struct ri2n_endpoint *ep,
                               const char *const *remote_addrs,
                               size_t n,
                               int timeout_ms);

// Waits at most `timeout_ms` (negative: as long as it takes; 0: only looks) for the next
// incoming connection. NULL with `ETIMEDOUT` when none came. A client that holds another
// key is refused without ever reaching `ri2n_accept`. Only a connection ends the wait
// (closing or aborting the endpoint's connections does not; on a client endpoint none ever
// comes): a server that must stop waits with a timeout, or polls [`ri2n_endpoint_fd`]
// beside a descriptor of its own and calls [`ri2n_try_accept`]. Never free the endpoint
// while another thread waits here.
//
// # Safety
// `ep` is a live endpoint.
struct ri2n_conn *ri2n_accept(struct ri2n_endpoint *ep, int timeout_ms);

// The next incoming connection if one is waiting; NULL with `EAGAIN` otherwise. Never
// blocks; wait for [`ri2n_endpoint_fd`] between tries (with edge-triggered `epoll`, try
// until `EAGAIN` after each wake-up).
//
// # Safety
// `ep` is a live endpoint.
struct ri2n_conn *ri2n_try_accept(struct ri2n_endpoint *ep);

// A descriptor that becomes readable when [`ri2n_try_accept`] may find a connection, and
// stays readable while connections wait: register it with `poll`/`epoll` for reading and
// never read or close it. Valid while `ep` lives.
//
// # Safety
// `ep` is a live endpoint.
int ri2n_endpoint_fd(const struct ri2n_endpoint *ep);

// Writes the `i`-th bound local address (ports resolved, e.g. `"127.0.0.1:41234"`) to `buf`
// as a NUL-terminated string of at most `len` bytes; returns its length without the NUL. A
// TCP client's port stays as given (0: each connection binds sockets of its own).
// `-ENOENT` when the endpoint has no `i`-th address, `-ERANGE` when `buf` is too small (64
// bytes always suffice).
//
// # Safety
// `ep` is a live endpoint; `buf` points to `len` writable bytes.
ssize_t ri2n_endpoint_local_addr(const struct ri2n_endpoint *ep, size_t i, char *buf, size_t len);

// Closes every connection of the endpoint gracefully: finishes their streams and waits at
// most `timeout_ms` (negative: as long as it takes) until each peer has acknowledged
// everything written to it; a connection whose peer is still sending is aborted once this
// side's data is delivered (its calls then fail with `ECONNABORTED`, the peer's with
// `ECONNRESET`). 0, or `-ETIMEDOUT` when some data was never acknowledged
// ([`ri2n_last_error`](crate::ri2n_last_error) says how much). The endpoint stays open (a
// server accepts the connections that come in after the close) until it is freed, which it
// must still be.
//
// # Safety
// `ep` is a live endpoint.
int ri2n_endpoint_close(struct ri2n_endpoint *ep, int timeout_ms);

// Aborts every connection of the endpoint at once, as [`ri2n_abort`](crate::ri2n_abort)
// aborts one: each peer's calls fail with `ECONNRESET` and see `code` and `reason` (may be
// NULL) in their error text; what was written but not acknowledged is dropped. Returns once
// the aborts have been sent, so the process may exit right after (a server that is stopped
// tells its clients why): 0, or a negative errno. The endpoint must still be freed.
//
// # Safety
// `ep` is a live endpoint; `reason` is NULL or a NUL-terminated string.
int ri2n_endpoint_abort(struct ri2n_endpoint *ep, uint64_t code, const char *reason);

// Frees the endpoint. Like dropping the Rust endpoint's last handle: when no connection
// handle is left either, what was written is delivered first (waiting up to 10 s). NULL is
// ignored.
//
// # Safety
// `ep` is NULL or a live endpoint, not used again.
void ri2n_endpoint_free(struct ri2n_endpoint *ep);

// Writes a new random key to the file `path` (mode 0600, the format of `ri2n keygen`); every
// host of a cluster holds a copy. `-EEXIST` if the file exists (it is never replaced).
//
// # Safety
// `path` is a NUL-terminated string.
int ri2n_key_generate(const char *path);

// The library's version, e.g. `"0.1.0"`.
const char *ri2n_version(void);

// This thread's last failure, in words (an empty string before the first). The text stays
// valid until this thread's next failing ri2n call; successful calls leave it alone.
const char *ri2n_last_error(void);

// Fills `*stats` (unless NULL) with the connection's counters and `links[0..max_links]`
// (unless NULL) with one record per link; returns how many links the connection has, which
// may be more than `max_links` (then only the first `max_links` are filled).
//
// # Safety
// `c` is a live connection; `stats` is NULL or writable; `links` is NULL or points to
// `max_links` writable records.
ssize_t ri2n_conn_stats(const struct ri2n_conn *c,
                        struct ri2n_stats *stats,
                        struct ri2n_link_stats *links,
                        size_t max_links);

// Sets `*bytes` to how much of the byte stream the peer acknowledged: the bytes written
// with `ri2n_write` and its kin that were delivered, each counted once,
// without messages or any framing (unlike `ri2n_stats.bytes_acknowledged`): the progress
// of a transfer in the application's own bytes. Returns 0, or `-EINVAL` for a NULL
// connection or pointer.
//
// # Safety
// `c` is a live connection; `bytes` is NULL or writable.
int ri2n_conn_stream_acknowledged(const struct ri2n_conn *c, uint64_t *bytes);

// Fills `*limits` with what held the connection's sender back so far (see
// [`ri2n_send_limits`]); returns 0, or `-EINVAL` for a NULL connection or record.
//
// # Safety
// `c` is a live connection; `limits` is NULL or writable.
int ri2n_conn_send_limits(const struct ri2n_conn *c, struct ri2n_send_limits *limits);

// Moves the connection's events since the last call into `events[0..max]`, oldest first;
// returns how many it wrote. Events that do not fit wait for the next call (the newest 4096
// of them: older ones are dropped). An application
// that calls this rarely (its writes blocked while every link was down, say) still learns
// what happened meanwhile, with when.
//
// # Safety
// `c` is a live connection; `events` points to `max` writable records.
ssize_t ri2n_conn_events(struct ri2n_conn *c, struct ri2n_event *events, size_t max);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* RI2N_H */

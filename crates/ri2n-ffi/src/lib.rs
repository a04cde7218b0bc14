//! ri2n from C: the library `ri2n` (`libri2n.so`, `libri2n.a`) and its header `ri2n.h`,
//! generated from this crate by cbindgen (see `cbindgen.toml`; `include/ri2n/ri2n.h` is the
//! committed copy, checked by `tests/header.rs`).
//!
//! The interface is socket-like: an endpoint binds one local address per link; a connection
//! is a reliable byte stream, whole messages and unreliable datagrams, striped over every link.
//! Blocking calls wait as the Rust library's do (through an outage of every link, too);
//! `ri2n_try_*` calls never block and return `-EAGAIN`, and `ri2n_conn_fd` gives a descriptor
//! for `poll`/`epoll` that becomes readable when a retry may succeed.
//!
//! Layout: `error` (errno, `ri2n_last_error`, the guard every call runs in), `endpoint`
//! (endpoints, keys, connect and accept), `conn` (streams, messages, datagrams), `stats`
//! (per-link statistics and events). Every exported function checks its pointer arguments for
//! NULL and catches panics, so none crosses into C.

#![allow(non_camel_case_types)]

mod conn;
mod endpoint;
mod error;
mod stats;

pub use conn::*;
pub use endpoint::*;
pub use error::ri2n_last_error;
pub use stats::*;

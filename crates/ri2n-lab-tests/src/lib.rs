//! End-to-end fault tests of the `ri2n` tool, run in the network-namespace lab of
//! `lab/ri2n-lab`. Everything is in `tests/`; this library is empty.

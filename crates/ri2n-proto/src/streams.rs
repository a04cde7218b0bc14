//! streams

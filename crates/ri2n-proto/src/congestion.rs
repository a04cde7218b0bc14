//! congestion

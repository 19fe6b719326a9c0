//! `LogBackend` implementations: `embedded` (RocksDB, the default) and the pull checkpoint file
//! they share.

pub mod checkpoint;
pub mod embedded;

//! `OffsetStore` implementations: `memory` (tests, ephemeral runs) and `rocks` (the default);
//! `group_commit`, the shared fsync of the RocksDB writers (offsets and the embedded log);
//! `damage`, damaged files and stopped writes of both.

pub mod damage;
pub mod group_commit;
pub mod memory;
pub mod rocks;

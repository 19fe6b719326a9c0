//! `OffsetStore` implementations: `memory` (tests, ephemeral runs) and `rocks` (the default).

pub mod memory;
pub mod rocks;
